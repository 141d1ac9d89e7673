#!/usr/bin/env bash
# What `xover llama build --backend vulkan` needs on a Debian/Ubuntu machine, from the distribution's registry:
# glslc, the Vulkan headers and loader (libvulkan-dev), SPIRV-Headers' CMake package (spirv-headers), and Mesa's
# software driver lavapipe (mesa-vulkan-drivers), which runs a Vulkan build on the CPU where no GPU is (the tests).
#
# The pinned llama.cpp needs Vulkan headers 1.3.261 or newer (VK_EXT_layer_settings). Where the system's are older
# (Debian 12 has 1.3.239), Debian 13's libvulkan-dev is fetched with apt-get from the same registry and unpacked, not
# installed, into xover's cache (deps/vulkan-headers); `xover llama build --backend vulkan` takes them from there.
# The system's glslc and loader stay: older ones only leave out shader features (coopmat2) the build tests for.
set -euo pipefail
cache=${XOVER_CACHE_DIR:-$HOME/.cache/xover}
need=()
command -v glslc >/dev/null || need+=(glslc)
[ -f /usr/include/vulkan/vulkan.hpp ] || need+=(libvulkan-dev)
found() { compgen -G "$1" >/dev/null; }
found "/usr/share/cmake*/SPIRV-Headers/SPIRV-HeadersConfig.cmake" || found "/usr/lib/*/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake" \
  || need+=(spirv-headers)
found "/usr/share/vulkan/icd.d/lvp_icd*.json" || need+=(mesa-vulkan-drivers)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing ${need[*]} with apt-get (for the Vulkan build and its tests)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "setup: the Vulkan build needs ${need[*]}: install your distribution's packages and retry" >&2
    exit 1
  fi
fi
headers_ok() { grep -q VK_EXT_layer_settings "$1/vulkan/vulkan_core.h" 2>/dev/null && [ -f "$1/vulkan/vulkan.hpp" ]; }
dest=$cache/deps/vulkan-headers
if ! headers_ok /usr/include && ! headers_ok "$dest/usr/include"; then
  command -v apt-get >/dev/null || { echo "setup: /usr/include's Vulkan headers are older than 1.3.261: install newer ones" >&2; exit 1; }
  echo "setup: the system's Vulkan headers lack VK_EXT_layer_settings; fetching Debian 13's libvulkan-dev into $dest" >&2
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/lists/partial" "$tmp/debs"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" > "$tmp/sources.list"
  o=(-oDir::Etc::SourceList="$tmp/sources.list" -oDir::Etc::SourceParts=/dev/null -oDir::State::Lists="$tmp/lists"
     -oAPT::Architecture=amd64 -oAPT::Sandbox::User=root)
  apt-get "${o[@]}" update -qq
  (cd "$tmp/debs" && apt-get "${o[@]}" download libvulkan-dev >/dev/null)
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp" && dpkg -x "$tmp"/debs/libvulkan-dev_*.deb "$dest.tmp"
  headers_ok "$dest.tmp/usr/include" || { echo "setup: the fetched headers still lack VK_EXT_layer_settings" >&2; exit 1; }
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
fi
