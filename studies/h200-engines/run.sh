#!/usr/bin/env bash
# Issue 33 on the H200: llama.cpp against ik_llama.cpp, in two leases of the one-GPU kind. ik_llama.cpp's CUDA build
# takes about 13 minutes of the machine's 16 cores, mainline's 224 s; the builds travel packed (scripts/lease.sh
# pack_builds and stage_builds), in parts over several calls where the 64 MiB cap needs it.
#
#   Lease 1, PHASE=tune: whichever build is not carried packed is built (ik_llama.cpp's from out/iksrc, mainline's
#     from out/llsrc), qwen3-30b-a3b synthesized meanwhile; the new builds packed and returned; then
#     `xover study study.toml --skip ttft`: placement and each engine's llama-server check at fit@32k under the 16 GiB
#     budget, and each engine's tuning (its own knobs, confirmed in rounds of fresh llama-bench processes). Commit the
#     returned results.sqlite as studies/h200-engines/results.sqlite, and keep the parts.
#   Lease 2 (no PHASE): both builds carried packed, in as many calls as their parts need; the store is seeded from
#     the committed one (its tuning and checks kept), and the study measures cold TTFT 1K-32K and the cached turns in
#     rounds of fresh servers of both engines, interleaved.
#
# A call that only carries parts (out/bins) for a job that starts later or already runs: STAGE=1 (nothing else runs,
# so it takes seconds). The job waits up to 15 minutes for a build whose tree was not carried. Other phases:
# PHASE=builds (both builds, ik_llama.cpp's first, mainline's niced), PHASE=mainline-build (224 s, 43 MiB in 3 parts).
#
# Run from the repository root on the GPU machine after scripts/prepare-lease.sh here. Repeat the same call (any
# carry) until job.log says done. Returns $OUT/eng.tgz, job.log and the packed builds' parts as they are made.
source scripts/lease.sh
lease_init eng
if [ -n "${STAGE:-}" ]; then ls -la /tmp/eng-stage; exit 0; fi  # parts carried for a job of this lease
if [ ! -f $J/started ]; then
  cp out/xsrc/studies/h200-engines/study.toml $J/study.toml
  if [ -f out/xsrc/studies/h200-engines/results.sqlite ]; then  # lease 1's placement, checks and tuning
    cp out/xsrc/studies/h200-engines/results.sqlite $ST/results.sqlite
  fi
  if [ "${PHASE:-}" = tune ]; then echo "--skip ttft" > $J/study-args; fi
  echo "${PHASE:-}" > $J/phase  # the first call's, for the job
fi
lease_job <<'BODY'
PHASE=$(cat $J/phase)
if [ "$PHASE" = mainline-build ]; then build_cuda && pack_builds; done_; exit 0; fi  # what 7 minutes of a lease can do
if [ "$PHASE" = builds ]; then  # ik_llama.cpp's build first; mainline's in what it leaves idle; each packed as it ends
  (renice -n 19 $BASHPID > /dev/null; build_cuda && pack_builds) &
  build_cuda_ik && pack_builds
  wait; done_; exit 0
fi
M=$ST/models/qwen3-30b-a3b.gguf
(renice -n 10 $BASHPID > /dev/null; synth qwen3-30b-a3b $M) &  # in what the builds leave idle
(build_cuda && pack_builds) &  # restored from out/bins (staged), or built from out/llsrc
build_cuda_ik && pack_builds   # the long one: its parts come back in the calls after it ends
wait; t "built both; synthesized"; tail -qn1 $ST/synth-*.log
study_once $(cat $J/study-args 2>/dev/null)
done_
BODY
lease_wait
