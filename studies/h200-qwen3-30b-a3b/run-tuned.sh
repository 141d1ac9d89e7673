#!/usr/bin/env bash
# Issue 16 on the H200: the study redone with the tuning stage, resumable from the committed store.
# Run from the repository root on the GPU machine, carrying out/llsrc, out/xsrc and .whl (prepare.sh makes them here).
# The first call starts the whole job in its own session (setsid) so that it survives the end of the call, then
# waits; every call (the first included) waits up to WAIT seconds and packs what is stored into $OUT/st.tgz.
# Order (most wanted first): ncmoe=18 (tune, tuned bench + cold TTFT), ncmoe=0 (tune, tuned, the cache lab's
# hidden-cold control), ncmoe=12, then ncmoe=24 (its defaults' cold TTFT alone is about 7 minutes).
# CONFIGS='ncmoe=24' runs only the named configs (the store resumes: what is stored is not measured again).
T0=$(date +%s); WAIT=${WAIT:-540}
t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
ST=/tmp/st; J=/tmp/job; M=$ST/models/qwen3-30b-a3b.gguf
pack() { tar czf $OUT/st.tgz -C $ST --exclude=models --exclude='*.gguf' . 2>/dev/null; cp $J/job.log $OUT/ 2>/dev/null; ls -la $OUT; }
if [ -f $J/started ] && [ ! -f $J/done ] && ! pgrep -f $J/job.sh > /dev/null; then t "the job died: restarting it"; rm $J/started; fi
if [ ! -f $J/started ]; then
  mkdir -p $J $ST/logs $ST/models
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  # the committed code and spec (out/xsrc: git archive HEAD src studies/h200-qwen3-30b-a3b), not a tree being edited
  rm -rf $J/src; cp -r out/xsrc/src $J/src; cp out/xsrc/studies/h200-qwen3-30b-a3b/study.toml $J/study.toml
  cp out/xsrc/studies/h200-qwen3-30b-a3b/results.sqlite $ST/ && cp out/xsrc/studies/h200-qwen3-30b-a3b/logs/* $ST/logs/ 2>/dev/null
  rm -rf /tmp/ll; mkdir -p /tmp/ll && tar xzf out/llsrc/llama.tar.gz -C /tmp/ll
  echo 0c1e57098bba43ac29e6e3b677cdceebdd22334f > /tmp/ll/llama.cpp-0c1e570/XOVER_COMMIT
  cat > $J/job.sh <<'JOB'
export PYTHONPATH=/tmp/job/src:/tmp/site PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
X="python3 -m xover"; ST=/tmp/st; M=$ST/models/qwen3-30b-a3b.gguf; S=/tmp/job/study.toml
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,memory.free,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
($X synth --preset qwen3-30b-a3b -o $M > /tmp/job/synth.log 2>&1; echo "synth rc=$?" >> /tmp/job/synth.log) &
$X llama build --backend cuda --source /tmp/ll/llama.cpp-0c1e570 --cmake-arg=-DCMAKE_CUDA_ARCHITECTURES=90 > /tmp/job/build.log 2>&1 || { tail -30 /tmp/job/build.log; exit 1; }
t built; wait; tail -1 /tmp/job/synth.log; $X llama which | head -3
python3 -c "from xover.hardware.detect import measure_h2d; r = measure_h2d(); print('h2d GB/s pinned %.1f pageable %.1f' % (r[0]/1e9, r[1]/1e9) if r else 'h2d: no cudart')"
for c in ${CONFIGS:-ncmoe=18 ncmoe=0 ncmoe=12 ncmoe=24}; do
  skip=report; [ $c = ncmoe=0 ] || skip=cache,report  # the cache lab's last scenario runs on ncmoe=0 only
  $X study $S -o $ST -q --configs $c --skip $skip > /tmp/job/study-$c.log 2>&1
  t "study --configs $c rc=$?"; tail -30 /tmp/job/study-$c.log; cp /tmp/job/study-$c.log $ST/logs/
done
$X report $ST > /dev/null 2>&1; t "report rc=$?"; touch /tmp/job/done
JOB
  touch $J/started
  setsid bash $J/job.sh > $J/job.log 2>&1 < /dev/null &
  t "job started"
fi
while [ ! -f $J/done ] && pgrep -f $J/job.sh > /dev/null && [ $(( $(date +%s) - T0 )) -lt $WAIT ]; do sleep 10; done
t "waited"; tail -60 $J/job.log; pack
