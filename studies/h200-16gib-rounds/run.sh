#!/usr/bin/env bash
# Issue 30 on the H200, one lease of the one-GPU kind: the 16 GiB qwen3-30b-a3b study in rounds of fresh servers.
#   1. the CUDA build while qwen3-30b-a3b is synthesized;
#   2. the store seeded from the committed 16 GiB study: its placement records and llama.cpp's checks, its tuning
#      results, its prediction (theory), and none of its measurements;
#   3. `xover study study.toml` under the 16 GiB budget: the placement and tuning resume from the seed, cold TTFT is
#      measured in 3-4 interleaved rounds; nvidia-smi sampled every 2 s.
# Run from the repository root on the GPU machine after scripts/prepare-lease.sh here, carrying out/llsrc, out/xsrc
# and .whl; repeat the same call until job.log says done. Returns $OUT/q16r.tgz and job.log.
source scripts/lease.sh
lease_init q16r
if [ ! -f $J/started ]; then
  cp out/xsrc/studies/h200-16gib-rounds/study.toml $J/study.toml
  seed_store out/xsrc/studies/h200-16gib-qwen3-30b-a3b/results.sqlite fit fit-check fit-tuned fit-check-tuned tune study prediction inspect model-terms
fi
lease_job <<'BODY'
one_model_study qwen3-30b-a3b
BODY
lease_wait
