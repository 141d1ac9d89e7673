#!/usr/bin/env bash
# Issue 46, one lease of the one-GPU kind (run 2026-12-06 on the H100 that kind lent: README.md): the 16 GiB qwen3-30b-a3b
# study with the tuned variant placed by its server (study.toml says what it measures).
#   1. the CUDA build (restored from out/bins where carried, else built from out/llsrc) while qwen3-30b-a3b is
#      synthesized;
#   2. the store seeded from the committed 16 GiB cached study: its prediction (theory) and model terms only;
#   3. `xover study study.toml`: placement and llama.cpp's checks, budget-aware tuning with the server's placement
#      walk, cold TTFT and cached turns in 3-4 interleaved rounds; nvidia-smi sampled every 2 s.
# Here first: STUDY=h200-16gib-placed bash scripts/prepare-lease.sh; then, for the packed build,
# `PER=2 bash scripts/bins-share.sh 1 out/keep` before the first call and `... 2 out/keep` before the second.
# Call 1 carries out/xsrc out/bins .whl (or out/llsrc instead of out/bins); call 2 `STAGE=1 bash <this>` with the
# second share; then the same call, WAIT=540, until job.log says done. Returns $OUT/q16p.tgz and job.log.
# A lease that ended before the study did: commit its store (results.sqlite, tune/) here; the next lease on the same
# kind of card resumes it (resume_store). BUDGET=12min replaces the spec's budget (rounds past the third).
source scripts/lease.sh
lease_init q16p
if [ -n "${STAGE:-}" ]; then ls -la /tmp/q16p-stage; exit 0; fi
if [ ! -f $J/started ]; then
  S=out/xsrc/studies/h200-16gib-placed
  cp $S/study.toml $J/study.toml
  if [ -n "${BUDGET:-}" ]; then sed -i "s/^budget = .*/budget = \"$BUDGET\"/" $J/study.toml; grep -H "^budget" $J/study.toml; fi
  resume_store $S || seed_store out/xsrc/studies/h200-16gib-cached/results.sqlite prediction inspect model-terms
fi
lease_job <<'BODY'
one_model_study qwen3-30b-a3b
BODY
lease_wait
