#!/usr/bin/env bash
# Issue 66's GPU measurement of the first prompt (study.toml): mainline llama.cpp 0c1e570 built for CUDA (sm_90) and
# Vulkan from the same pinned tree, qwen3-30b-a3b synthesized, then
#   1. llama-bench pp512 and pp1024 (-n 0 -r 5) on both builds, 3 fresh processes each, alternating: bench/*.json;
#   2. the study (cold 1K and 4K, 3 rounds of fresh servers) into $ST/qwen3-30b-a3b;
#   3. blob against chat (benchmarks/chat_shape.py, CUDA) at 16K and 32K, 3 rounds of fresh servers, on qwen3-30b-a3b
#      and gpt-oss-20b, each with the whole model on the GPU and with experts on the CPU (pinned, -ub 4096): chat-*/.
#      CHAT=0 leaves it out; CHAT_ONLY=1 runs it alone.
# Here first, once committed:  VK=1 STUDY=h100-first-prompt bash scripts/prepare-lease.sh
# Carry: out/llsrc out/xsrc .whl .gl .vkdeps (or out/bins instead of out/llsrc and .vkdeps, where a lease packed the
# builds). Repeat the call until job.log says done; it returns $OUT/fp.tgz and the packed builds' parts.
# Run on 2026-12-08 on an H100 (README.md). The job's step 3 failed at once: the benchmark started its servers
# without -lv, so their logs named no device and its own check took the CUDA build for one running on the CPU (fixed
# since); the two models' runs, and a --swa-full check, were then made by hand in the same lease (README).
source scripts/lease.sh
lease_init fp
S=out/xsrc/studies/h100-first-prompt
if [ ! -f $J/started ]; then
  [ -f $S/study.toml ] || { echo "no $S/study.toml: carry out/xsrc (STUDY=h100-first-prompt, committed)"; exit 1; }
  mkdir -p $ST/qwen3-30b-a3b/models $ST/models $ST/bench; cp $S/study.toml $J/study.toml
  echo ${CHAT:-1} > $J/chat; echo ${CHAT_ONLY:-0} > $J/chat-only; cp benchmarks/chat_shape.py $J/chat_shape.py
fi
lease_job <<'BODY'
(renice -n 10 $BASHPID > /dev/null; synth qwen3-30b-a3b $ST/qwen3-30b-a3b/models/qwen3-30b-a3b.gguf
 [ "$(cat $J/chat)" = 0 ] || synth gpt-oss-20b $ST/models/gpt-oss-20b.gguf) & SY=$!
(build_cuda && pack_builds) & CB=$!
(build_vulkan && pack_builds)
wait $CB
if ! built 0c1e570 cuda || ! built 0c1e570 vulkan; then t "a build is missing: see build.log, build-vulkan.log"; done_; exit 1; fi
vk_check || { t "the Vulkan build sees no device"; done_; exit 1; }
wait $SY; tail -n2 $ST/synth-*.log
M=$ST/qwen3-30b-a3b/models/qwen3-30b-a3b.gguf
if [ "$(cat $J/chat-only)" != 1 ]; then
CU=$(ls -d $CACHE/builds/0c1e570-cuda-*/build/bin | head -1); VKB=$(ls -d $CACHE/builds/0c1e570-vulkan-*/build/bin | head -1)
for i in 1 2 3; do  # alternating fresh processes; the first of each backend warms itself (llama-bench's own warm-up run)
  for b in cuda vulkan; do
    bin=$CU; [ $b = vulkan ] && bin=$VKB
    timeout 300 $bin/llama-bench -m $M -ngl 99 -p 512,1024 -n 0 -r 5 -o json > $ST/bench/$b-$i.json 2> $ST/bench/$b-$i.log
    t "llama-bench $b $i rc=$?: $(grep -o '"avg_ts": [0-9.]*' $ST/bench/$b-$i.json | tr '\n' ' ')"
  done
done
study_into $ST/qwen3-30b-a3b $J/study.toml
fi
chat() {  # NAME MODEL CPU-ARGS: blob against chat, the whole model on the GPU against experts on the CPU
  t "blob against chat: $1"
  timeout 900 python3 $J/chat_shape.py -m $2 --backend cuda --config gpu= --config "$3" --lengths 16k,32k \
    --rounds 3 -o $ST/chat-$1 > $ST/chat-$1.log 2>&1; t "chat $1 rc=$?"; tail -30 $ST/chat-$1.log
}
if [ "$(cat $J/chat)" != 0 ]; then
  chat qwen3-30b-a3b $M "cpu18=--n-cpu-moe 18 -lm none -ub 4096 -b 4096"
  chat gpt-oss-20b $ST/models/gpt-oss-20b.gguf "cpu12=--n-cpu-moe 12 -lm none -ub 4096 -b 4096"
fi
done_
BODY
lease_wait
