#!/usr/bin/env bash
# Issue 31 on the H200, one lease of the one-GPU kind: gpt-oss-120b under 24 GiB, decode at its best.
#   1. the CUDA build while gpt-oss-120b is synthesized into /dev/shm (59 GiB; the one-GPU kind's disk is 64 GiB);
#   2. `xover study study.toml`: the --no-host search from the pinned configuration, its decode confirmation in rounds
#      of fresh llama-bench processes, cold TTFT in 3 rounds of fresh servers; nvidia-smi sampled every 2 s;
#   3. if the job is young enough (PROBE_BEFORE_S, default 1200 s after its start), a decode probe with llama-bench
#      tg32: llama.cpp's defaults at the 24 GiB fit level (--n-cpu-moe 24, mmap, -ub 512), and the pinned
#      configuration at -t 8 with --no-host 0 and 1 (the study's search ran -t 16, llama-bench's default here).
# Run from the repository root on the GPU machine after scripts/prepare-lease.sh here, carrying out/llsrc, out/xsrc
# and .whl; repeat the same call until job.log says done. Returns $OUT/dec.tgz and job.log.
# The committed stores seed the study: the 2026-12-02 lease measured the search and 2 of the 3 rounds of its decode
# confirmation before the device time ran out (README.md), so a rerun reuses those llama-bench processes (the same
# tests, the same rounds) and measures what is left.
source scripts/lease.sh
lease_init dec
if [ ! -f $J/started ]; then
  S=out/xsrc/studies/h200-gpt-oss-decode
  cp $S/study.toml $J/study.toml
  [ -f $ST/results.sqlite ] || { cp $S/results.sqlite $ST/; mkdir -p $ST/tune; cp $S/tune/results.sqlite $ST/tune/; }
fi
lease_job <<BODY
M=/dev/shm/gpt-oss-120b.gguf
synth gpt-oss-120b \$M &
build_cuda
wait; t synthesized; tail -qn1 \$ST/synth-*.log
ln -sf \$M \$ST/models/gpt-oss-120b.gguf
smi_on
\$X study \$J/study.toml -o \$ST > \$ST/study.log 2>&1
t "study rc=\$?"; tail -40 \$ST/study.log
smi_off
if [ \$(( \$(date +%s) - T0 )) -lt ${PROBE_BEFORE_S:-1200} ]; then
  \$X bench -m \$M --ncmoe 24 --pp 0 --tg 32 -r 2 -o \$ST/probe -- -ngl 99 > \$ST/probe-defaults.log 2>&1
  t "probe defaults rc=\$?"; tail -4 \$ST/probe-defaults.log
  \$X bench -m \$M --ncmoe 26 --load-mode none --ubatch 4096 --batch 4096 -t 8 --no-host 0,1 --pp 0 --tg 32 -r 2 \\
    -o \$ST/probe -- -ngl 99 > \$ST/probe-t8.log 2>&1
  t "probe t8 rc=\$?"; tail -6 \$ST/probe-t8.log
else
  t "no time left for the decode probe"
fi
done_
BODY
lease_wait
