#!/usr/bin/env bash
# Issue 11 on the H200: idempotent, resumable; each call does what is left within DEADLINE seconds.
# Run from the repository root on the GPU machine, carrying out/llsrc and .whl, which prepare.sh makes here (a tar of
# the llama.cpp tree `xover llama build` fetched, and the gguf 0.19.0 and sniffio 1.3.1 wheels).
# The study resumes: points already in results.sqlite are not measured again.
# Order: the cache lab (ncmoe=0) first, then the remaining TTFT points (ncmoe=24: about 7 minutes), then
# xover advise at 4K, ncmoe 0 and 18 by default (ncmoe=0 tests the theory's MMQ tile-padding prediction that a larger
# -ub speeds prefill even with every expert on the GPU; ADVISE_NCMOE=0,12,18,24 for all levels: about 3-4 minutes each).
T0=$(date +%s); DEADLINE=${DEADLINE:-565}
t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
X="python3 -m xover"; ST=/tmp/st; M=$ST/models/qwen3-30b-a3b.gguf
pack() { tar czf $OUT/st.tgz -C $ST --exclude=models . ; ls -la $OUT; }
trap pack EXIT
if [ ! -d $ST ]; then mkdir -p $ST/logs && cp studies/h200-qwen3-30b-a3b/results.sqlite $ST/ && cp studies/h200-qwen3-30b-a3b/logs/* $ST/logs/; t "resuming from the committed results store"; fi
mkdir -p $ST/models
nvidia-smi --query-gpu=name,memory.total,memory.free,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
[ -f $M ] || ($X synth --preset qwen3-30b-a3b -o $M > /tmp/synth.log 2>&1; echo "synth rc=$?" >> /tmp/synth.log) &
if ! $X llama which > /dev/null 2>&1; then
  mkdir -p /tmp/ll && tar xzf out/llsrc/llama.tar.gz -C /tmp/ll
  echo 0c1e57098bba43ac29e6e3b677cdceebdd22334f > /tmp/ll/llama.cpp-0c1e570/XOVER_COMMIT
  $X llama build --backend cuda --source /tmp/ll/llama.cpp-0c1e570 --cmake-arg=-DCMAKE_CUDA_ARCHITECTURES=90 > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
  t built
fi
wait; [ -f /tmp/synth.log ] && tail -2 /tmp/synth.log; t ready; $X llama which | head -3
python3 -c "from xover.hardware import measure_h2d; r = measure_h2d(); print('h2d GB/s pinned %.1f pageable %.1f' % (r[0]/1e9, r[1]/1e9) if r else 'h2d: no cudart')"
if [ ! -f $ST/cache-done ]; then  # the cache lab (on ncmoe=0) first: a few minutes, then the slow configurations
  timeout -k 30 -s TERM $(( $(left) - 25 )) $X study studies/h200-qwen3-30b-a3b/study.toml -o $ST -q --configs ncmoe=0 > /tmp/cache.log 2>&1
  rc=$?; t "study --configs ncmoe=0 rc=$rc"; tail -5 /tmp/cache.log; [ $rc -eq 0 ] && touch $ST/cache-done
fi
if [ ! -f $ST/study-done ]; then
  timeout -k 30 -s TERM $(( $(left) - 25 )) $X study studies/h200-qwen3-30b-a3b/study.toml -o $ST -q > /tmp/study.log 2>&1
  rc=$?; t "study rc=$rc"; tail -25 /tmp/study.log; cp /tmp/study.log $ST/logs/study-$(date +%s).log 2>/dev/null
  [ $rc -eq 0 ] && touch $ST/study-done
fi
if [ -f $ST/study-done ] && [ ! -f $ST/advise-done ] && [ $(left) -gt ${ADVISE_NEED:-480} ]; then
  timeout -k 30 -s TERM $(( $(left) - 20 )) $X advise -m $M --ncmoe ${ADVISE_NCMOE:-0,18} --knobs lm,ub,nopo --ubatch 2048,4096 \
    --lengths ${ADVISE_LENGTHS:-4k} -r 2 -o $ST > /tmp/advise.log 2>&1
  rc=$?; t "advise rc=$rc"; tail -40 /tmp/advise.log; cp /tmp/advise.log $ST/logs/advise-$(date +%s).log 2>/dev/null
  [ $rc -eq 0 ] && { touch $ST/advise-done; $X report $ST > /dev/null 2>&1; t "report rc=$?"; }
fi
$X report $ST > /dev/null 2>&1; sed -n 1,70p $ST/report.md
t end
