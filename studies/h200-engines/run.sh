#!/usr/bin/env bash
# Issue 33 on the H200 (prepared, not yet run): llama.cpp against ik_llama.cpp, in two leases of the one-GPU kind,
# because the two CUDA builds alone take about 15 of a session's 30 minutes (ik_llama.cpp's: 102 of its 309 steps in
# 250 s on the machine's 16 cores, measured 2026-12-02).
#
#   Lease 1, PHASE=tune: both CUDA builds in parallel while qwen3-30b-a3b is synthesized; the builds packed for the
#     next lease (pack_builds: returned as <build>.tar.xz.partNN); `xover study study.toml --skip ttft`: placement
#     and each engine's llama-server check at fit@32k under the 16 GiB budget, and each engine's tuning (its own
#     knobs, confirmed in rounds of fresh llama-bench processes). Commit the returned results.sqlite as
#     studies/h200-engines/results.sqlite and keep the parts.
#   Lease 2 (no PHASE): copy the parts into out/bins; the builds are restored instead of rebuilt, the store is seeded
#     from the committed one (its tuning and checks kept), and the study measures cold TTFT 1K-32K and the cached
#     turns in rounds of fresh servers of both engines, interleaved.
#
#   PHASE=builds (2026-12-03, after a lease was taken away mid-build with 17 minutes left): only the builds,
#     ik_llama.cpp's first and mainline's niced into the cores it leaves idle, each packed and returned as it ends.
#   PHASE=mainline-build: mainline's build alone (224 s on the machine), packed (43 MiB, 3 parts).
#
# Run from the repository root on the GPU machine after scripts/prepare-lease.sh here. Lease 1 carries out/llsrc,
# out/iksrc, out/xsrc and .whl; lease 2 out/bins, out/xsrc and .whl (or the trees again if the parts did not come
# back). Repeat the same call until job.log says done. Returns $OUT/eng.tgz, job.log and, once, the packed builds.
source scripts/lease.sh
lease_init eng
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
synth qwen3-30b-a3b $M &
build_cuda &
build_cuda_ik
wait; t "built both; synthesized"; tail -qn1 $ST/synth-*.log
pack_builds
study_once $(cat $J/study-args 2>/dev/null)
done_
BODY
lease_wait
