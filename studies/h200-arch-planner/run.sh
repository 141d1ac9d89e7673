#!/usr/bin/env bash
# Issue 19 on the H200: the placement planner for gpt-oss against llama.cpp's CUDA load log. NOT RUN YET.
#   1. synthesize gpt-oss-20b (/tmp/st/models) and gpt-oss-120b (/dev/shm: 59 GiB);
#   2. `xover inspect --json` (total bytes and parameters) next to llama-bench's model_size / model_n_params;
#   3. per model, two --n-cpu-moe settings x two contexts: llama-server -lv 4 loads the model, the logged CUDA0 / CPU
#      buffer sizes (model, KV: two iSWA caches, compute) are printed next to the planner's memory_estimate;
#   4. the planner's smallest --n-cpu-moe for a 24 GiB budget at 8K and 32K.
# Run from the repository root on the GPU machine, carrying out/llsrc, out/xsrc and .whl (prepare.sh of the
# h200-qwen3-30b-a3b study makes them). The job runs under setsid and survives the call; every call waits up
# to WAIT seconds and returns $OUT/ap.tgz (logs, the comparison table) and job.log.
T0=$(date +%s); WAIT=${WAIT:-560}
t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
J=/tmp/job; ST=/tmp/ap
pack() { tar czf $OUT/ap.tgz -C $ST . 2>/dev/null; cp $J/job.log $OUT/ 2>/dev/null; ls -la $OUT; }
if [ ! -f $J/started ]; then
  mkdir -p $J $ST /tmp/st/models
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  rm -rf $J/src; cp -r out/xsrc/src $J/src
  if ! ls /root/.cache/xover/builds/0c1e570-cuda-*/build/bin/llama-server >/dev/null 2>&1; then
    rm -rf /tmp/ll; mkdir -p /tmp/ll && tar xzf out/llsrc/llama.tar.gz -C /tmp/ll
    echo 0c1e57098bba43ac29e6e3b677cdceebdd22334f > /tmp/ll/llama.cpp-0c1e570/XOVER_COMMIT
  fi
  cat > $J/job.sh <<'JOB'
export PYTHONPATH=/tmp/job/src:/tmp/site PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
X="python3 -m xover"; ST=/tmp/ap
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
declare -A M=([gpt-oss-20b]=/tmp/st/models/gpt-oss-20b.gguf [gpt-oss-120b]=/dev/shm/gpt-oss-120b.gguf)
declare -A NCMOE=([gpt-oss-20b]="0 12" [gpt-oss-120b]="18 24")
for p in ${MODELS:-gpt-oss-20b gpt-oss-120b}; do
  [ -f ${M[$p]} ] || ($X synth --preset $p -o ${M[$p]} > $ST/synth-$p.log 2>&1; echo "synth rc=$?" >> $ST/synth-$p.log) &
done
if [ -d /tmp/ll/llama.cpp-0c1e570 ]; then
  $X llama build --backend cuda --source /tmp/ll/llama.cpp-0c1e570 --cmake-arg=-DCMAKE_CUDA_ARCHITECTURES=90 > $ST/build.log 2>&1 || { tail -30 $ST/build.log; exit 1; }
fi
t built; wait; tail -qn1 $ST/synth-*.log
BENCH=$($X llama which | awk '/^llama-bench:/{print $2}'); SERVER=$($X llama which | awk '/^llama-server:/{print $2}')
echo "bench $BENCH server $SERVER"
for p in ${MODELS:-gpt-oss-20b gpt-oss-120b}; do
  m=${M[$p]}
  # 2. inspect vs llama-bench's own figures (one tg1 on the GPU: enough to get the record)
  $X inspect --json $m > $ST/inspect-$p.json
  $BENCH -m $m -ngl 99 -fa 1 -p 0 -n 1 -r 1 -o jsonl > $ST/bench-$p.jsonl 2> $ST/bench-$p.log
  python3 - $ST/inspect-$p.json $ST/bench-$p.jsonl $p <<'PY'
import json, sys
ins = json.load(open(sys.argv[1])); fp = ins["footprint"]
rec = json.loads(open(sys.argv[2]).read().splitlines()[-1])
print(f"{sys.argv[3]}: inspect total_bytes {fp['total_bytes']} params {fp['total_params']} | llama-bench model_size "
      f"{rec['model_size']} model_n_params {rec['model_n_params']} | diff bytes {rec['model_size'] - fp['total_bytes']} "
      f"params {rec['model_n_params'] - fp['total_params']}")
PY
  # 3. logged buffers vs the planner, two --n-cpu-moe x two contexts
  for n in ${NCMOE[$p]}; do
    for ctx in 8192 32768; do
      L=$ST/server-$p-ncmoe$n-c$ctx.log
      $SERVER -m $m -ngl 99 --n-cpu-moe $n -c $ctx -fa on -np 1 -fit off --cache-ram 0 -lv 4 --port 18089 > $L 2>&1 &
      SP=$!
      for i in $(seq 1 300); do curl -sf localhost:18089/health > /dev/null && break; kill -0 $SP 2>/dev/null || break; sleep 1; done
      kill $SP; wait $SP 2>/dev/null
      t "$p --n-cpu-moe $n -c $ctx: llama.cpp logged"
      grep -hE "(model|KV|compute) buffer size|llama_kv_cache: size|creating .*KV cache" $L | sed 's/^/    /' | cut -c1-160
      python3 - $m $n $ctx <<'PY'
import sys
from xover.analysis.theory import memory_estimate, model_terms
from xover.gguf.inspect import model_table
table, _ = model_table(sys.argv[1]); terms = model_terms(table); n, ctx = int(sys.argv[2]), int(sys.argv[3])
e = memory_estimate(terms, n, ctx, 512, True); M = 1 << 20
print(f"    planner: CUDA0 model {e.model_bytes / M:.2f} MiB, KV {e.kv_bytes / M:.2f} MiB (full "
      f"{terms.kv_bytes_per_token * -(-ctx // 256) * 256 / M:.2f} + SWA {terms.kv_swa_bytes_per_cell * terms.swa_cells(ctx, 512) / M:.2f}, "
      f"{terms.swa_cells(ctx, 512)} SWA cells), compute {e.compute_bytes / M:.2f} MiB (rough); host model "
      f"{e.host_model_bytes / M:.2f} MiB (token_embd + the CPU experts)")
PY
    done
  done
  # 4. the planner's smallest --n-cpu-moe for 24 GiB
  python3 - $m $p <<'PY'
import sys
from xover.analysis.theory import model_terms, plan_placement
from xover.gguf.inspect import model_table
table, _ = model_table(sys.argv[1])
for pl in plan_placement(model_terms(table), 24 << 30, (8192, 32768)):
    print(f"{sys.argv[2]}: planner, 24 GiB at -c {pl.n_ctx}: --n-cpu-moe {pl.n_cpu_moe} "
          f"({pl.estimate.total_bytes / (1 << 30):.2f} GiB + {pl.headroom_bytes >> 20} MiB headroom)")
PY
done | tee $ST/compare.txt
rm -f /dev/shm/gpt-oss-120b.gguf
touch /tmp/job/done
JOB
  touch $J/started
  setsid bash $J/job.sh > $J/job.log 2>&1 < /dev/null &
  t "job started"
fi
while [ ! -f $J/done ] && pgrep -f $J/job.sh > /dev/null && [ $(( $(date +%s) - T0 )) -lt $WAIT ]; do sleep 5; done
t "waited"; tail -80 $J/job.log; pack
