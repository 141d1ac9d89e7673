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
#   .gl/, .vkdeps/          with VK=1, for Vulkan builds and runs (scripts/lease.sh vk_setup, build_vulkan), amd64
#                           .debs with apt state of their own (~/.cache/xover/apt): .gl/ (about 0.4 MB) what is unpacked
#                           to / there, Debian trixie's Vulkan loader libvulkan1 and bookworm's libglvnd libraries (the
#                           device README's set; the loader needs them to open NVIDIA's ICD); .vkdeps/ (about 4 MB) what
#                           the build alone needs, unpacked into /tmp/vkroot there: trixie's libvulkan-dev (headers
#                           1.4.309 with vulkan.hpp), glslc and its libshaderc1 (2025.2: bookworm's 2023.2 is too old
#                           for ggml's coopmat2 shaders) and spirv-headers (ggml-vulkan's find_package). trixie's
#                           loader, glslc and libshaderc need glibc 2.38 and libstdc++ of GCC 13 (GLIBCXX_3.4.32), which
#                           the device's image has; the loader is trixie's so that it is the version of the headers
#                           the build compiles against, and the only loader there (the build links the one in /)
# STUDY=NAME keeps out/xsrc to src/, studies/NAME and the committed stores its run.sh seeds from (what travels with
# out/bins must stay under the 64 MiB cap).
# Then, with the device tool: `bash studies/<study>/run.sh`, carrying what its header names (usually out/llsrc,
# out/xsrc and .whl; out/iksrc for engine studies; .gl and .vkdeps for Vulkan studies; out/bins instead of the trees
# where builds are carried).
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
if [ -n "${STUDY:-}" ]; then  # the committed stores its run.sh seeds from (seed_store out/xsrc/studies/OTHER/...)
  for seed in $(grep -o "out/xsrc/studies/[^ ]*\.sqlite" "studies/$STUDY/run.sh" | sort -u); do
    git archive HEAD "${seed#out/xsrc/}" | tar -x -C out/xsrc && echo "out/xsrc: with ${seed#out/xsrc/}"
  done
fi
if [ -n "${VK:-}" ]; then  # Vulkan's loader and libglvnd (.gl), the Vulkan build's dependencies (.vkdeps)
  apt_download() {  # SUITE DEST PACKAGE...: Debian SUITE's amd64 .debs of PACKAGE... into DEST (apt state of its own)
    local suite=$1 dest=$2 st=${XOVER_CACHE_DIR:-$HOME/.cache/xover}/apt/$1; shift 2
    mkdir -p "$st/lists/partial" "$st/cache/archives/partial" "$dest"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
      > "$st/sources.list"
    local o=(-q -oDir::Etc::SourceList="$st/sources.list" -oDir::Etc::SourceParts=/dev/null -oDir::State::Lists="$st/lists"
      -oDir::Cache="$st/cache" -oDir::State::Status=/dev/null -oAPT::Architecture=amd64 -oAPT::Architectures=amd64
      -oAPT::Sandbox::User=root)
    apt-get "${o[@]}" update > /dev/null
    (cd "$dest" && apt-get "${o[@]}" download "$@" > /dev/null)
  }
  rm -rf .gl .vkdeps
  apt_download bookworm .gl libglvnd0 libegl1 libopengl0 libgl1 libglx0 libgles2
  apt_download trixie .gl libvulkan1
  apt_download trixie .vkdeps libvulkan-dev glslc libshaderc1 spirv-headers
  echo ".gl: $(ls .gl | tr '\n' ' ')($(du -ch .gl/*.deb | tail -1 | cut -f1))"
  echo ".vkdeps: $(ls .vkdeps | tr '\n' ' ')($(du -ch .vkdeps/*.deb | tail -1 | cut -f1))"
fi
if [ -n "${BINS:-}" ]; then bash scripts/bins-share.sh "${SHARE:-1}" $BINS; fi  # one share of the packed builds
echo "the tree that travels (64 MiB cap): repository $(git ls-files -z | du -cm --files0-from=- | tail -1 | cut -f1) MiB;" \
  "out/: $(du -sm out/* | tr '\n\t' '; ')$(du -sm .whl .gl .vkdeps 2>/dev/null | tr '\n\t' '; ')"
ls -la out/llsrc out/xsrc .whl
