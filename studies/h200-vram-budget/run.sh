#!/usr/bin/env bash
# Issue 20 on the H200: `xover ttft --vram-budget 16GiB` on qwen3-30b-a3b (the card looks 16 GiB large).
#   1. --n-cpu-moe 0 under the budget: expected to fail to load (the planner says so first);
#   2. the planner's smallest N for the server's context: runs; N-1: llama.cpp's confirmation that N is the edge;
#   3. nvidia-smi every second during the runs, and after; then a run killed with kill -9 mid-request, and
#      nvidia-smi after it (the holder and llama-server must both be gone, their memory free).
# Run from the repository root on the GPU machine, carrying out/llsrc, out/xsrc and .whl (prepare.sh of the
# h200-qwen3-30b-a3b study makes them). The job runs under setsid and survives the call; every call waits up
# to WAIT seconds and returns $OUT/vb.tgz (logs, nvidia-smi samples, the stores).
T0=$(date +%s); WAIT=${WAIT:-560}
t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
J=/tmp/vbjob; ST=/tmp/vb; M=/tmp/st/models/qwen3-30b-a3b.gguf
pack() { tar czf $OUT/vb.tgz -C $ST . 2>/dev/null; cp $J/job.log $OUT/ 2>/dev/null; ls -la $OUT; }
if [ ! -f $J/started ]; then
  mkdir -p $J $ST /tmp/st/models
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  rm -rf $J/src; cp -r out/xsrc/src $J/src
  if ! ls /root/.cache/xover/builds/0c1e570-cuda-*/build/bin/llama-server >/dev/null 2>&1; then
    rm -rf /tmp/ll; mkdir -p /tmp/ll && tar xzf out/llsrc/llama.tar.gz -C /tmp/ll
    echo 0c1e57098bba43ac29e6e3b677cdceebdd22334f > /tmp/ll/llama.cpp-0c1e570/XOVER_COMMIT
  fi
  cat > $J/job.sh <<'JOB'
export PYTHONPATH=/tmp/vbjob/src:/tmp/site PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
X="python3 -m xover"; ST=/tmp/vb; M=/tmp/st/models/qwen3-30b-a3b.gguf
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
smi() { nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits; }
[ -f $M ] || ($X synth --preset qwen3-30b-a3b -o $M > $ST/synth.log 2>&1; echo "synth rc=$?" >> $ST/synth.log) &
if [ -d /tmp/ll/llama.cpp-0c1e570 ]; then
  $X llama build --backend cuda --source /tmp/ll/llama.cpp-0c1e570 --cmake-arg=-DCMAKE_CUDA_ARCHITECTURES=90 > $ST/build.log 2>&1 || { tail -30 $ST/build.log; exit 1; }
fi
t built; wait; tail -1 $ST/synth.log 2>/dev/null; $X llama which | head -3
(while true; do echo "$(date +%s.%N | cut -c1-14) $(smi)"; sleep 1; done) > $ST/smi.log 2>&1 &
SMI=$!
t "before: used,total MiB = $(smi)"
if [ -n "${EDGE:-}" ]; then
  for n in $EDGE; do
    L0=$(wc -l < $ST/smi.log)
    $X ttft -m $M --ncmoe $n --lengths 1k,8k -R 64 -r 1 -o $ST/edge-$n --vram-budget 16GiB > $ST/edge-$n.log 2>&1
    t "edge ncmoe=$n rc=$? peak used MiB during it: $(tail -n +$((L0 + 1)) $ST/smi.log | awk '{print $2}' | tr -d , | sort -n | tail -1)"
    grep -hE "buffer size|MiB free|CUDA error|out of memory|cudaMalloc" $ST/edge-$n/logs/*.log | cut -c1-150 | head -12
    tail -3 $ST/edge-$n.log
  done
  kill $SMI; touch /tmp/vbjob/done; exit 0
fi
CTX=$(python3 -c "from xover.llamacpp.server import context_size; print(context_size(8192, 64))")
N=$(python3 -c "from pathlib import Path; from xover.measure.budget import smallest_fit; print(smallest_fit(Path('$M'), $CTX, 16 << 30))")
t "planner: smallest --n-cpu-moe for 16 GiB at -c $CTX: $N"
echo "$CTX $N" > $ST/planner.txt
$X ttft -m $M --ncmoe 0 --lengths 1k,8k -R 64 -r 2 -o $ST/ncmoe0 --vram-budget 16GiB > $ST/ncmoe0.log 2>&1
t "ncmoe=0 rc=$?"; tail -5 $ST/ncmoe0.log; t "after ncmoe=0: $(smi)"
$X ttft -m $M --ncmoe $N --lengths 1k,8k -R 64 -r 2 -o $ST/ncmoeN --vram-budget 16GiB > $ST/ncmoeN.log 2>&1
t "ncmoe=$N rc=$?"; tail -12 $ST/ncmoeN.log; t "after ncmoe=$N: $(smi)"
$X ttft -m $M --ncmoe $((N-1)) --lengths 1k,8k -R 64 -r 1 -o $ST/ncmoeNm1 --vram-budget 16GiB > $ST/ncmoeNm1.log 2>&1
t "ncmoe=$((N-1)) rc=$?"; tail -5 $ST/ncmoeNm1.log; t "after ncmoe=$((N-1)): $(smi)"
# kill -9 mid-run
$X ttft -m $M --ncmoe $N --lengths 8k -R 64 -r 50 -o $ST/killed --vram-budget 16GiB > $ST/killed.log 2>&1 &
XP=$!
for i in $(seq 1 120); do grep -q "ready at" $ST/killed.log 2>/dev/null && break; sleep 1; done
sleep 3; t "running, before kill -9: $(smi); holder/server: $(pgrep -af 'xover.hardware.vram|llama-server' | cut -c1-80 | tr '\n' ';')"
kill -9 $XP; sleep 5
t "5 s after kill -9 of xover: $(smi); left: $(pgrep -af 'xover.hardware.vram|llama-server' | cut -c1-80 | tr '\n' ';')"
kill $SMI; touch /tmp/vbjob/done
JOB
  touch $J/started
  setsid bash $J/job.sh > $J/job.log 2>&1 < /dev/null &
  t "job started"
fi
while [ ! -f $J/done ] && pgrep -f $J/job.sh > /dev/null && [ $(( $(date +%s) - T0 )) -lt $WAIT ]; do sleep 5; done
t "waited"; tail -60 $J/job.log; pack
