#!/usr/bin/env bash
# What lease e ran on the H200 machine after the study's job had ended (run from the repository root there, with the
# job's store in /tmp/eng and its sources in /tmp/eng-job/src, as studies/h200-engines/run.sh leaves them): the same
# checks and tuning, copied into a store of its own, and the cold TTFT stage measured again from round 1 in fresh
# servers. The budget of 12 minutes kept it to 3 rounds (no round 4, no drift check).
ST=/tmp/rerun; mkdir -p $ST; source scripts/lease.sh; ST=/tmp/rerun
seed_store /tmp/eng/results.sqlite engines fit fit-check fit-check-tuned fit-tuned inspect model-terms prediction study tune
cp -r /tmp/eng/tune $ST/; ln -sfn /tmp/eng/models $ST/models
sed "s/^budget = .*/budget = \"12min\"/" /tmp/eng-job/study.toml > /tmp/rerun-study.toml
export PYTHONPATH=/tmp/eng-job/src:/tmp/site PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
python3 -m xover study /tmp/rerun-study.toml -o $ST > $ST/study.log 2>&1; echo "study rc=$?" > $ST/rc
