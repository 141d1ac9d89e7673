#!/usr/bin/env bash
# GPU smoke of xover's own CUDA build path and a short study (not the issue-11 study).
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1
X="python3 -m xover"
nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader
($X synth --preset qwen3-30b-a3b -o /tmp/q.gguf > $OUT/synth.log 2>&1; echo "synth rc=$?" >> $OUT/synth.log) &
mkdir -p /tmp/ll && tar xzf out/llsrc/llama.tar.gz -C /tmp/ll
echo 0c1e57098bba43ac29e6e3b677cdceebdd22334f > /tmp/ll/llama.cpp-0c1e570/XOVER_COMMIT
$X llama build --backend cuda --source /tmp/ll/llama.cpp-0c1e570 --cmake-arg=-DCMAKE_CUDA_ARCHITECTURES=90 > $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; tail -30 ~/.cache/xover/builds/*/build.log; exit 1; }
t built; $X llama which; wait; t synth; tail -1 $OUT/synth.log
cat > /tmp/spec.toml <<'TOML'
[model]
path = "/tmp/q.gguf"
[study]
lengths = ["1k", "4k", "16k"]
response-tokens = [200]
repetitions = 2
bench-repetitions = 2
[[config]]
name = "ncmoe=0"
n-cpu-moe = 0
n-gpu-layers = 99
[[config]]
name = "ncmoe=18"
n-cpu-moe = 18
n-gpu-layers = 99
[[config]]
name = "ncmoe=18 -lm none"
n-cpu-moe = 18
n-gpu-layers = 99
load-mode = "none"
TOML
timeout $(( 570 - ($(date +%s) - T0) )) $X study /tmp/spec.toml -o /tmp/st -q > $OUT/study.log 2>&1; echo "study rc=$?"; t study
cat $OUT/study.log | tail -20
$X export /tmp/st -f md -o - 2>/dev/null | tail -20
for f in results.sqlite report.md report.html plot-total.png; do cp /tmp/st/$f $OUT/ 2>/dev/null; done
ls /tmp/st/logs | head
