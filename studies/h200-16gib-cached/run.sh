#!/usr/bin/env bash
# Issue 32 on the H200, one lease of the one-GPU kind (prepared, not yet run): the 16 GiB qwen3-30b-a3b study with cached agentic turns.
#   1. the CUDA build while qwen3-30b-a3b is synthesized;
#   2. the store seeded from the committed 16 GiB study: its prediction (theory), and none of its measurements,
#      placement checks or tuning (the fit check runs afresh to log the compute buffer that calibrates the placement
#      of each trial; the search now scores cached turns and KV cache types too);
#   3. `xover study study.toml` under the 16 GiB budget: placement and llama.cpp's checks; budget-aware tuning, cold
#      TTFT with cached turns in 3-4 interleaved rounds, and the session replay; nvidia-smi sampled every 2 s.
# Run from the repository root on the GPU machine after scripts/prepare-lease.sh here, carrying out/llsrc, out/xsrc
# and .whl; repeat the same call until job.log says done. Returns $OUT/q16c.tgz and job.log.
source scripts/lease.sh
lease_init q16c
if [ ! -f $J/started ]; then
  cp out/xsrc/studies/h200-16gib-cached/study.toml $J/study.toml
  seed_store out/xsrc/studies/h200-16gib-qwen3-30b-a3b/results.sqlite study prediction inspect model-terms  # checks and tuning run again
fi
lease_job <<'BODY'
one_model_study qwen3-30b-a3b
BODY
lease_wait
