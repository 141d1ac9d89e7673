#!/usr/bin/env bash
# Issue 21 on the two-GPU H200 kind (nvidia-h200-x2), one lease (NOT RUN YET): the CUDA build while qwen3-30b-a3b
# is synthesized, then `CUDA_VISIBLE_DEVICES=0 xover study study.toml` (GPU 0 under the 16 GiB budget for llama.cpp
# here, GPU 1 for xover's RPC worker), nvidia-smi sampled every 2 s for both GPUs.
# Run from the repository root on the GPU machine, carrying out/llsrc, out/xsrc and .whl (made by
# studies/h200-qwen3-30b-a3b/prepare.sh after committing). The job runs under setsid and survives the call; every
# call waits up to WAIT seconds and returns $OUT/x2.tgz (store, logs, reports, smi.log) and job.log. Repeat the
# same call until job.log shows "done".
T0=$(date +%s); WAIT=${WAIT:-560}
t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
J=/tmp/x2job; ST=/tmp/x2
pack() { tar czf $OUT/x2.tgz -C $ST --exclude=models . 2>/dev/null; cp $J/job.log $OUT/ 2>/dev/null; ls -la $OUT; }
if [ ! -f $J/started ]; then
  mkdir -p $J $ST/models
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  rm -rf $J/src; cp -r out/xsrc/src $J/src; cp out/xsrc/studies/h200x2-rpc/study.toml $J/study.toml
  rm -rf /tmp/ll; mkdir -p /tmp/ll && tar xzf out/llsrc/llama.tar.gz -C /tmp/ll
  echo 0c1e57098bba43ac29e6e3b677cdceebdd22334f > /tmp/ll/llama.cpp-0c1e570/XOVER_COMMIT
  cat > $J/job.sh <<'JOB'
export PYTHONPATH=/tmp/x2job/src:/tmp/site PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # the kind's rule (no NCCL here)
X="python3 -m xover"; ST=/tmp/x2; M=$ST/models/qwen3-30b-a3b.gguf
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=index,name,memory.total,memory.free,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
nvidia-smi topo -m 2>&1 | head -5
[ -f $M ] || ($X synth --preset qwen3-30b-a3b -o $M > $ST/synth.log 2>&1; echo "synth rc=$?" >> $ST/synth.log) &
$X llama build --backend cuda --source /tmp/ll/llama.cpp-0c1e570 --cmake-arg=-DCMAKE_CUDA_ARCHITECTURES=90 > $ST/build.log 2>&1 || { tail -30 $ST/build.log; exit 1; }
t built; wait; tail -1 $ST/synth.log; $X llama which
(while true; do echo "$(date +%s) $(nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits | tr '\n' ' ')"; sleep 2; done) >> $ST/smi.log 2>&1 &
SMI=$!
CUDA_VISIBLE_DEVICES=0 $X study /tmp/x2job/study.toml -o $ST >> $ST/study.log 2>&1
t "study rc=$?"; tail -40 $ST/study.log
kill $SMI; t "after: $(nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | tr '\n' ' ')"; touch /tmp/x2job/done; t done
JOB
  touch $J/started
  setsid bash $J/job.sh > $J/job.log 2>&1 < /dev/null &
  t "job started"
fi
while [ ! -f $J/done ] && pgrep -f $J/job.sh > /dev/null && [ $(( $(date +%s) - T0 )) -lt $WAIT ]; do sleep 5; done
t "waited"; tail -50 $J/job.log; pack
