#!/usr/bin/env bash
# Issue 33 on the H200, one lease of the one-GPU kind (prepared, not yet run): llama.cpp against ik_llama.cpp.
#   1. both CUDA builds in parallel (ik_llama.cpp's takes about 12-13 minutes on 16 cores: 102 of 309 steps in
#      250 s, measured 2026-12-02) while qwen3-30b-a3b is synthesized;
#   2. `xover study study.toml` under the 16 GiB budget: placement and llama.cpp's checks per engine, each engine's
#      tuning, cold TTFT and cached turns in 3-4 interleaved rounds; nvidia-smi sampled every 2 s.
# Run from the repository root on the GPU machine after scripts/prepare-lease.sh here (after `xover llama build
# --engine ik_llama.cpp`, which unpacks the ik tree it packs), carrying out/llsrc, out/iksrc, out/xsrc and .whl;
# repeat the same call until job.log says done. Returns $OUT/eng.tgz and job.log.
source scripts/lease.sh
lease_init eng
[ -f $J/started ] || cp out/xsrc/studies/h200-engines/study.toml $J/study.toml
lease_job <<'BODY'
M=$ST/models/qwen3-30b-a3b.gguf
synth qwen3-30b-a3b $M &
build_cuda &
build_cuda_ik
wait; t "built both; synthesized"; tail -qn1 $ST/synth-*.log
study_once
done_
BODY
lease_wait
