#!/usr/bin/env bash
# Issue 20 (and issue 19's gpt-oss-120b check) on the H200, in one lease:
#   1. the CUDA build (with llama-fit-params) while qwen3-30b-a3b (/tmp/st/models) and gpt-oss-120b (/dev/shm,
#      59 GiB) are synthesized;
#   2. issue 19: studies/h200-arch-planner/run.sh for gpt-oss-120b (inspect against llama-bench, the planner
#      against llama.cpp's logged buffers), then the 120b file is deleted;
#   3. issue 20: `xover study study.toml` under the 16 GiB budget, nvidia-smi sampled every 2 s.
# Run from the repository root on the GPU machine, carrying out/llsrc, out/xsrc and .whl (made by
# studies/h200-qwen3-30b-a3b/prepare.sh). The job runs under setsid and survives the call; every call waits up to
# WAIT seconds and returns $OUT/q16.tgz (the store, logs, nvidia-smi samples) and $OUT/ap.tgz. SKIP_AP=1 skips 2.
T0=$(date +%s); WAIT=${WAIT:-560}
t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
J=/tmp/q16job; ST=/tmp/q16
pack() {
  tar czf $OUT/q16.tgz -C $ST --exclude=models --exclude='*.gguf' . 2>/dev/null
  [ -d /tmp/ap ] && tar czf $OUT/ap.tgz -C /tmp/ap . 2>/dev/null
  cp $J/job.log $OUT/ 2>/dev/null; ls -la $OUT
}
if [ ! -f $J/started ]; then
  mkdir -p $J $ST/models /tmp/st/models
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  rm -rf $J/src; cp -r out/xsrc/src $J/src; cp out/xsrc/studies/h200-16gib-qwen3-30b-a3b/study.toml $J/study.toml
  rm -rf /tmp/ll; mkdir -p /tmp/ll && tar xzf out/llsrc/llama.tar.gz -C /tmp/ll
  echo 0c1e57098bba43ac29e6e3b677cdceebdd22334f > /tmp/ll/llama.cpp-0c1e570/XOVER_COMMIT
  cat > $J/job.sh <<'JOB'
export PYTHONPATH=/tmp/q16job/src:/tmp/site PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
X="python3 -m xover"; ST=/tmp/q16; M=/tmp/st/models/qwen3-30b-a3b.gguf
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,memory.free,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
($X synth --preset qwen3-30b-a3b -o $M > $ST/synth.log 2>&1; echo "synth rc=$?" >> $ST/synth.log) &
[ -n "${SKIP_AP:-}" ] || ($X synth --preset gpt-oss-120b -o /dev/shm/gpt-oss-120b.gguf > $ST/synth-120b.log 2>&1; echo "synth rc=$?" >> $ST/synth-120b.log) &
$X llama build --backend cuda --source /tmp/ll/llama.cpp-0c1e570 --cmake-arg=-DCMAKE_CUDA_ARCHITECTURES=90 > $ST/build.log 2>&1 || { tail -30 $ST/build.log; exit 1; }
t built; $X llama which | head -3; ls $($X llama which | awk '/^llama-server:/{print $2}' | xargs dirname) | grep fit
wait; t "synthesized"; tail -qn1 $ST/synth*.log
if [ -z "${SKIP_AP:-}" ]; then
  (cd /tmp/q16job/repo && MODELS=gpt-oss-120b WAIT=3000 bash studies/h200-arch-planner/run.sh > $ST/ap-run.log 2>&1)
  t "arch-planner done"; tail -40 /tmp/ap/compare.txt; rm -f /dev/shm/gpt-oss-120b.gguf
fi
mkdir -p $ST/models; ln -sf $M $ST/models/qwen3-30b-a3b.gguf
(while true; do echo "$(date +%s) $(nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits)"; sleep 2; done) > $ST/smi.log 2>&1 &
SMI=$!
$X study /tmp/q16job/study.toml -o $ST > $ST/study.log 2>&1
t "study rc=$?"; tail -40 $ST/study.log
kill $SMI; t "after: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"; touch /tmp/q16job/done
JOB
  # the arch-planner script runs from a repository root with out/ and .whl: give it one
  mkdir -p $J/repo && cp -r out .whl $J/repo/ && mkdir -p $J/repo/studies && cp -r out/xsrc/studies/h200-arch-planner $J/repo/studies/
  touch $J/started
  setsid bash $J/job.sh > $J/job.log 2>&1 < /dev/null &
  t "job started"
fi
while [ ! -f $J/done ] && pgrep -f $J/job.sh > /dev/null && [ $(( $(date +%s) - T0 )) -lt $WAIT ]; do sleep 5; done
t "waited"; tail -50 $J/job.log; pack
