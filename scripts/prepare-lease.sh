#!/usr/bin/env bash
# On the development machine (it has the package registries): what a lease on a lent GPU machine needs carried
# (scripts/lease.sh uses them there):
#   out/llsrc/llama.tar.gz  the pinned llama.cpp tree `xover llama build` fetched (about 11 MB: no docs, models, media)
#   out/iksrc/ik.tgz        ik_llama.cpp's tree, where `xover llama build --engine ik_llama.cpp` fetched it (about 25 MB)
#   .whl/                   the wheels the GPU machine's Python lacks (gguf, sniffio)
#   out/xsrc/               the committed src/ and studies/ (what a run uses, whatever the working tree holds)
#   out/bins/               with BINS="DIR...": share SHARE (default 1) of the packed CUDA builds former leases
#                           returned (scripts/bins-share.sh: 3 parts a share, every .sums), carried instead of the
#                           trees so that the builds are not redone; one share a call, `bins-share.sh K DIR...`
#                           alone between the calls
# STUDY=NAME keeps out/xsrc to src/ and studies/NAME (what travels with out/bins must stay under the 64 MiB cap).
# Then, with the device tool: `bash studies/<study>/run.sh`, carrying what its header names (usually out/llsrc,
# out/xsrc and .whl; out/iksrc for engine studies; out/bins instead of the trees where builds are carried).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
src=${XOVER_CACHE_DIR:-$HOME/.cache/xover}/src/llama.cpp-0c1e570
[ -d "$src/scripts" ] || { echo "no llama.cpp tree at $src: run 'bash scripts/setup.sh test' (it builds llama.cpp) first" >&2; exit 1; }
mkdir -p out/llsrc
tar czf out/llsrc/llama.tar.gz --exclude="$(basename "$src")/docs" --exclude="$(basename "$src")/models" \
  --exclude="$(basename "$src")/media" --exclude="$(basename "$src")/benches" -C "$(dirname "$src")" "$(basename "$src")"
ik=${XOVER_CACHE_DIR:-$HOME/.cache/xover}/src/ik_llama.cpp-ik0.1.5  # `xover llama build --engine ik_llama.cpp` made it
if [ -d "$ik" ]; then
  mkdir -p out/iksrc
  tar czf out/iksrc/ik.tgz --exclude="$(basename "$ik")/github-data" --exclude="$(basename "$ik")/docs" \
    --exclude="$(basename "$ik")/models" --exclude="$(basename "$ik")/media" -C "$(dirname "$ik")" "$(basename "$ik")"
fi
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d .whl gguf==0.19.0 sniffio==1.3.1
rm -rf out/xsrc && mkdir -p out/xsrc && git archive HEAD src "studies${STUDY:+/$STUDY}" | tar -x -C out/xsrc
if [ -n "${BINS:-}" ]; then bash scripts/bins-share.sh "${SHARE:-1}" $BINS; fi  # one share of the packed builds
echo "the tree that travels (64 MiB cap): repository $(git ls-files -z | du -cm --files0-from=- | tail -1 | cut -f1) MiB;" \
  "out/: $(du -sm out/* | tr '\n\t' '; ')"
ls -la out/llsrc out/xsrc .whl
