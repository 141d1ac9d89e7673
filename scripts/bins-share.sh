#!/usr/bin/env bash
# On the development machine, before each call of a lease that carries packed CUDA builds (lease.sh pack_builds):
#   bash scripts/bins-share.sh K DIR...
# fills out/bins with the K-th share (from 1) of the parts in DIR... (*.tar.xz.partNN, as former leases returned
# them), 3 parts (45 MiB) a share with every .sums file, so that one call carries it beside the repository (about
# 13 MiB), a slim out/xsrc and .whl under the 64 MiB cap; prints "share K of N". Carry out/bins in N back-to-back
# calls on the warm machine: stage_builds there restores each build once all its parts have come. PER=2 makes shares
# of 2 parts, where the repository has grown past what 3 leave room for (the script warns).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
k=${1:?usage: bash scripts/bins-share.sh K DIR... (K from 1)}; shift
[ $# -gt 0 ] || { echo "usage: bash scripts/bins-share.sh K DIR... (the folders that hold the returned parts)" >&2; exit 2; }
mapfile -t parts < <(for d in "$@"; do ls "$d"/*.tar.xz.part*; done | awk -F/ '{print $NF"\t"$0}' | sort | cut -f2)
mapfile -t sums < <(for d in "$@"; do ls "$d"/*.tar.xz.sums 2>/dev/null || true; done)
[ ${#parts[@]} -gt 0 ] || { echo "no *.tar.xz.part* in $*" >&2; exit 1; }
per=${PER:-3}
n=$(( (${#parts[@]} + per - 1) / per ))
[ "$k" -ge 1 ] && [ "$k" -le $n ] || { echo "share $k of $n does not exist: give K from 1 to $n" >&2; exit 2; }
rm -rf out/bins && mkdir -p out/bins
cp "${parts[@]:$(( (k - 1) * per )):per}" out/bins/
for s in "${sums[@]}"; do cp "$s" out/bins/; done
for b in $(printf '%s\n' "${parts[@]##*/}" | sed 's/\.part.*//' | sort -u); do  # parts returned before .sums existed
  [ -n "$(printf '%s\n' "${sums[@]}" | grep -F "/$b.sums")" ] && continue
  mapfile -t mine < <(printf '%s\n' "${parts[@]}" | grep -F "/$b.part")
  (cd "$(dirname "${mine[0]}")" && sha256sum "${mine[@]##*/}") > "out/bins/$b.sums"
done
echo "share $k of $n: $(ls out/bins | tr '\n' ' ')($(du -sm out/bins | cut -f1) MiB)"
# what a call carries with it: the files git does not ignore (tracked or not), out/bins, out/xsrc, .whl and .gl (the
# device refuses a call over 64 MiB); a folder not there yet counts nothing
mib=$( { git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null || true
  find out/bins out/xsrc .whl .gl -type f -printf '%s\n' 2>/dev/null || true; } |
  awk '{s += $1} END {printf "%d", s / 1048576 + 0.999}')
if [ "$mib" -gt 62 ]; then
  echo "warning: a call would carry about $mib MiB (64 MiB cap): carry less beside out/bins or split the parts 2 a share" >&2
else
  echo "a call carries about $mib MiB with this share (64 MiB cap)"
fi
