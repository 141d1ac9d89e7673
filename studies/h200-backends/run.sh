#!/usr/bin/env bash
# CUDA against Vulkan on the H200 (prepared 2026-12-04, not yet run): mainline llama.cpp 0c1e570 built for both
# backends from the same pinned tree, on two synthetic shapes, each a study of its own with its own spec and store:
# qwen3-30b-a3b/ and gpt-oss-20b/ (study.toml; results.sqlite and tune/ once a lease's store is committed there).
# Each runs its [[config]]s on the build of their backend (`backend = "cuda"` / `"vulkan"`).
#
# Here first, once this study is committed (out/xsrc is the committed src/ and studies/h200-backends):
#   VK=1 STUDY=h200-backends bash scripts/prepare-lease.sh
# What each call carries (the device tool's carry), beside the repository's tracked files (about 16 MiB):
#   - the call that starts the job, with the builds made from the tree: out/llsrc out/xsrc .whl .gl .vkdeps (about
#     32 MiB in all, of the 64 MiB cap);
#   - a later lease, on the builds an earlier one packed and returned: out/bins out/xsrc .whl .gl (one share of parts
#     a call, scripts/bins-share.sh K DIR...; the calls after the first with STAGE=1, which only stages them), instead
#     of out/llsrc and .vkdeps; the job waits up to 15 minutes for each build to be restored;
#   - later calls of the same lease: nothing new (the job runs on); carrying the same again does no harm.
# .gl (Vulkan's loader and libglvnd) is unpacked to / once a machine, and VK_DRIVER_FILES names NVIDIA's ICD;
# .vkdeps (headers, glslc, SPIRV-Headers) goes to /tmp/vkroot (scripts/lease.sh vk_setup).
#
#   No PHASE: the job builds CUDA (sm_90) and Vulkan in parallel on the machine's 16 cores (each restored instead
#     where out/bins carried it; each packed as it ends, its parts returned by this and the next calls), synthesizes
#     both models meanwhile (into each store's models/, where `xover study` looks for a preset), checks that the Vulkan build sees the H200 (vk_check: stops there if it does not), then
#     runs the studies one after the other, each into its own store, $ST/qwen3-30b-a3b and $ST/gpt-oss-20b, resumed
#     from the committed store where there is one. SHAPES="gpt-oss-20b" runs that one alone (default: both,
#     qwen3-30b-a3b first).
#   PHASE=builds: the two builds, packed and returned, and the Vulkan check; no model, no study. The Vulkan build's
#     shader generation makes it several times longer than the CPU build: a first lease may hold little else.
#   PHASE=tune: the studies with `--skip ttft` (placement checks and tuning only).
#   BUDGET=12min: each study's budget, replacing its spec's (rounds past the first 3 and the drift check start only
#     if they end within it).
#   MAXR=10: each study's max-rounds, replacing its spec's 4. Round numbers count from the store's first round, so a
#     store that already has rounds 1-8 measures nothing more without it (lease 6 raised it by hand).
#
# Run from the repository root on the GPU machine; repeat the call until job.log says done. Returns $OUT/bk.tgz ($ST:
# both stores with their logs, the build logs and vk-devices.log; no models), job.log and the parts of builds packed
# in this lease.
source scripts/lease.sh
lease_init bk
if [ -n "${STAGE:-}" ]; then ls -la /tmp/bk-stage; exit 0; fi  # parts carried for a job of this lease
S=out/xsrc/studies/h200-backends
if [ ! -f $J/started ]; then
  SHAPES=${SHAPES:-qwen3-30b-a3b gpt-oss-20b}
  for s in $SHAPES; do
    [ -f $S/$s/study.toml ] || { echo "no $S/$s/study.toml: carry out/xsrc (STUDY=h200-backends, committed)"; exit 1; }
    mkdir -p $ST/$s/models
    cp $S/$s/study.toml $J/$s.toml
    if [ -n "${BUDGET:-}" ]; then sed -i "s/^budget = .*/budget = \"$BUDGET\"/" $J/$s.toml; grep -H "^budget" $J/$s.toml; fi
    if [ -n "${MAXR:-}" ]; then sed -i "s/^max-rounds = .*/max-rounds = $MAXR/" $J/$s.toml; grep -H "^max-rounds" $J/$s.toml; fi
    if [ -f $S/$s/results.sqlite ]; then  # the shape's own store (the H200's), or one of another card's (on-h100/):
      # resumed from the one measured on this machine's card, else afresh (never two cards' numbers in one verdict)
      for d in $S/$s $S/$s/on-*; do [ -f $d/results.sqlite ] && resume_store $d $ST/$s && break; done || true
    elif last=$(ls -d $S/$s/lease-*/ 2>/dev/null | sort | tail -1) && [ -f "${last}results.sqlite" ] \
        && measured_here ${last%/}; then
      # the newest lease's checks and tuning, rounds afresh: lease 1 warmed its servers up with 8 tokens and lease 2
      # with one ubatch, and either left ggml_vulkan's pipeline compilation in a Vulkan server's first prompt
      # (README); the tuning (llama-bench warms each test up itself) stands
      (ST=$ST/$s; seed_store ${last}results.sqlite tune study prediction inspect model-terms engines)
      mkdir -p $ST/$s/tune && cp ${last}tune/results.sqlite $ST/$s/tune/
      echo "seeded from ${last}results.sqlite (its tuning; rounds afresh)"
    fi
  done
  echo "$SHAPES" > $J/shapes
  if [ "${PHASE:-}" = tune ]; then echo "--skip ttft" > $J/study-args; fi
  echo "${PHASE:-}" > $J/phase  # the first call's, for the job
fi
lease_job <<'BODY'
PHASE=$(cat $J/phase); SHAPES=$(cat $J/shapes)
if [ "$PHASE" != builds ]; then  # in what the builds leave idle
  (renice -n 10 $BASHPID > /dev/null; for s in $SHAPES; do synth $s $ST/$s/models/$s.gguf; done) &
fi
(build_cuda && pack_builds) & CB=$!  # restored from out/bins (staged), or built from out/llsrc
(build_vulkan && pack_builds)        # likewise; from out/llsrc with /tmp/vkroot's headers, glslc and SPIRV-Headers
wait $CB
if ! built 0c1e570 cuda || ! built 0c1e570 vulkan; then t "a build is missing: see build.log, build-vulkan.log"; done_; exit 1; fi
t "built both"
if ! vk_check; then t "no study: the Vulkan configurations would fail (carry .gl; check VK_DRIVER_FILES)"; done_; exit 1; fi
if [ "$PHASE" = builds ]; then done_; exit 0; fi
wait; t "synthesized:"; tail -qn1 $ST/synth-*.log
for s in $SHAPES; do study_into $ST/$s $J/$s.toml $(cat $J/study-args 2>/dev/null); done
done_
BODY
lease_wait
