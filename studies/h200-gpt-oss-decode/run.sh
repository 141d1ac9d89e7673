#!/usr/bin/env bash
# Issue 31 on the H200, one lease of the one-GPU kind: gpt-oss-120b under 24 GiB, decode at its best.
#   1. the CUDA build while gpt-oss-120b is synthesized into /dev/shm (59 GiB; the one-GPU kind's disk is 64 GiB);
#   2. `xover study study.toml`: the --no-host search from the pinned configuration, its decode confirmation in rounds
#      of fresh llama-bench processes, cold TTFT in 3 rounds of fresh servers; nvidia-smi sampled every 2 s;
#   3. while the device time lasts (each step guarded by the job's age), a decode probe with llama-bench tg32, one
#      process per configuration: llama.cpp's defaults for gpt-oss-120b at the 24 GiB fit level (--n-cpu-moe 24,
#      mmap, -ub 512); qwen3-30b-a3b (synthesized on disk beside the build) at --n-cpu-moe 18 over --no-host 0,1 x
#      -t 4,8,16; gpt-oss-120b's pinned configuration at -t 8 with --no-host 0 and 1 (the study ran -t 16).
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
Q=/tmp/qwen3-30b-a3b.gguf
synth gpt-oss-120b \$M &
synth qwen3-30b-a3b \$Q &
build_cuda
wait; t synthesized; tail -qn1 \$ST/synth-*.log
ln -sf \$M \$ST/models/gpt-oss-120b.gguf
smi_on
\$X study \$J/study.toml -o \$ST > \$ST/study.log 2>&1
t "study rc=\$?"; tail -40 \$ST/study.log
smi_off
age() { echo \$(( \$(date +%s) - T0 )); }
if [ \$(age) -lt ${DEFAULTS_BEFORE_S:-1450} ]; then
  \$X bench -m \$M --ncmoe 24 --depth 0 --pp 0 --tg 32 -r 2 -o \$ST/probe -- -ngl 99 > \$ST/probe-defaults.log 2>&1
  t "probe defaults rc=\$?"; tail -4 \$ST/probe-defaults.log
fi
if [ \$(age) -lt ${QWEN_BEFORE_S:-1500} ]; then
  \$X bench -m \$Q --ncmoe 18 --no-host 0,1 -t 4,8,16 --depth 0 --pp 0 --tg 32 -r 3 -o \$ST/probe-qwen3 -- -ngl 99 \\
    > \$ST/probe-qwen3.log 2>&1
  t "probe qwen3 rc=\$?"; tail -10 \$ST/probe-qwen3.log
fi
if [ \$(age) -lt ${T8_BEFORE_S:-1350} ]; then
  \$X bench -m \$M --ncmoe 26 --load-mode none --ubatch 4096 --batch 4096 -t 8 --no-host 0,1 --depth 0 --pp 0 --tg 32 -r 2 \\
    -o \$ST/probe -- -ngl 99 > \$ST/probe-t8.log 2>&1
  t "probe t8 rc=\$?"; tail -6 \$ST/probe-t8.log
fi
done_
BODY
lease_wait
