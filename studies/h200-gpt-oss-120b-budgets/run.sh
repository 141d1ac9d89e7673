#!/usr/bin/env bash
# Issue 20 on the H200: gpt-oss-120b under a 24 GiB and a 32 GiB budget, one lease of the one-GPU kind.
#   1. the CUDA build while gpt-oss-120b is synthesized into /dev/shm (59 GiB; the one-GPU kind's disk is 64 GiB);
#   2. `xover study study-24gib.toml`, resumed from the committed store in g24/ (session 7 measured the fit, the
#      tuning search, llama-bench and the defaults' cold TTFT; what is left is the tuned variant's cold TTFT);
#   3. `xover study study-32gib.toml` (defaults against the 24 GiB search's settings, no search of its own);
#   4. if the job is still young enough (PROBE_BEFORE_S, default 1300 s after its start), a decode probe:
#      llama-bench tg32 at -t 4, 8 and 16 with the 24 GiB placement (--n-cpu-moe 24) and with every layer's experts
#      on the CPU (36, what public --cpu-moe reports measure: 18-25 t/s on a 14900K), to tell whether this
#      host's decode (about 7 t/s, 11% of its memory-bandwidth limit) is bound by CPU threads.
# nvidia-smi is sampled every 2 s during each study.
# Run from the repository root on the GPU machine, carrying out/llsrc, out/xsrc and .whl (made by
# studies/h200-qwen3-30b-a3b/prepare.sh after committing). The job runs under setsid and survives the call; every
# call waits up to WAIT seconds and returns $OUT/g24.tgz, $OUT/g32.tgz, $OUT/probe.tgz (stores, logs, reports) and
# job.log. Repeat the same call until job.log shows "done".
T0=$(date +%s); WAIT=${WAIT:-560}
t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
J=/tmp/gjob
pack() {
  for B in 24 32; do [ -d /tmp/g$B ] && tar czf $OUT/g$B.tgz -C /tmp/g$B --exclude=models . 2>/dev/null; done
  [ -d /tmp/probe ] && tar czf $OUT/probe.tgz -C /tmp/probe --exclude=models . 2>/dev/null
  cp $J/job.log $OUT/ 2>/dev/null; ls -la $OUT
}
if [ ! -f $J/started ]; then
  mkdir -p $J
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  S=out/xsrc/studies/h200-gpt-oss-120b-budgets
  rm -rf $J/src; cp -r out/xsrc/src $J/src; cp $S/study-*.toml $J/
  if [ ! -f /tmp/g24/results.sqlite ]; then  # resume from what session 7 measured
    mkdir -p /tmp/g24 && cp -r $S/g24/results.sqlite $S/g24/tune $S/g24/logs /tmp/g24/
  fi
  if ! ls /root/.cache/xover/builds/0c1e570-cuda-*/build/bin/llama-fit-params >/dev/null 2>&1; then
    rm -rf /tmp/ll; mkdir -p /tmp/ll && tar xzf out/llsrc/llama.tar.gz -C /tmp/ll
    echo 0c1e57098bba43ac29e6e3b677cdceebdd22334f > /tmp/ll/llama.cpp-0c1e570/XOVER_COMMIT
  fi
  cat > $J/job.sh <<JOB
export PYTHONPATH=/tmp/gjob/src:/tmp/site PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=/usr/local/cuda/lib64:\${LD_LIBRARY_PATH:-}
X="python3 -m xover"; M=/dev/shm/gpt-oss-120b.gguf
T0=\$(date +%s); t() { echo "[\$(( \$(date +%s) - T0 ))s] \$*"; }
nvidia-smi --query-gpu=name,memory.total,memory.free,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
[ -f \$M ] || (\$X synth --preset gpt-oss-120b -o \$M > /tmp/gjob/synth.log 2>&1; echo "synth rc=\$?" >> /tmp/gjob/synth.log) &
if [ -d /tmp/ll/llama.cpp-0c1e570 ]; then
  \$X llama build --backend cuda --source /tmp/ll/llama.cpp-0c1e570 --cmake-arg=-DCMAKE_CUDA_ARCHITECTURES=90 > /tmp/gjob/build.log 2>&1 || { tail -30 /tmp/gjob/build.log; exit 1; }
fi
t built; wait; tail -1 /tmp/gjob/synth.log 2>/dev/null; \$X llama which | head -3
for B in 24 32; do
  ST=/tmp/g\$B; mkdir -p \$ST/models; ln -sf \$M \$ST/models/gpt-oss-120b.gguf
  (while true; do echo "\$(date +%s) \$(nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits)"; sleep 2; done) >> \$ST/smi.log 2>&1 &
  SMI=\$!
  \$X study /tmp/gjob/study-\${B}gib.toml -o \$ST >> \$ST/study.log 2>&1
  t "study \${B} GiB rc=\$?"; tail -25 \$ST/study.log; kill \$SMI
done
if [ \$(( \$(date +%s) - T0 )) -lt ${PROBE_BEFORE_S:-1300} ]; then
  mkdir -p /tmp/probe
  \$X bench -m \$M --ncmoe 24,36 --depth 0 --pp 0 --tg 32 -t 4,8,16 -r 3 -o /tmp/probe -- -ngl 99 > /tmp/probe/bench.log 2>&1
  t "probe rc=\$?"; tail -15 /tmp/probe/bench.log
else
  t "no time left for the decode probe"
fi
t "after: \$(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"; touch /tmp/gjob/done; t done
JOB
  touch $J/started
  setsid bash $J/job.sh > $J/job.log 2>&1 < /dev/null &
  t "job started"
fi
while [ ! -f $J/done ] && pgrep -f $J/job.sh > /dev/null && [ $(( $(date +%s) - T0 )) -lt $WAIT ]; do sleep 5; done
t "waited"; tail -50 $J/job.log; pack
