# The steps every study's lease on a lent GPU machine repeats; a study's run.sh sources this file from the
# repository root on the GPU machine, which carries out/llsrc, out/xsrc and .whl (scripts/prepare-lease.sh makes them
# on the development machine, which has the package registries), and for Vulkan builds .gl and .vkdeps (VK=1 there):
#
#   lease_init NAME   the job's folder J=/tmp/NAME-job and the study's folder ST=/tmp/NAME; once, before the job
#                     starts: the wheels the GPU machine's Python lacks installed into /tmp/site, the committed src
#                     (out/xsrc) copied into $J/src; in every call, whatever this call carries: the pinned llama.cpp
#                     tree (out/llsrc) unpacked into /tmp/ll, ik_llama.cpp's (out/iksrc) into /tmp/ik, packed builds
#                     (out/bins) staged and restored once whole (stage_builds); .gl (Vulkan's loader and libglvnd)
#                     unpacked to / once a machine, and VK_DRIVER_FILES set to the NVIDIA ICD where it exists, and
#                     .vkdeps (the Vulkan build's headers, glslc and its library) into /tmp/vkroot (vk_setup)
#   lease_job BODY    write $J/job.sh (the common prelude, then the bash text BODY) and start it under setsid once, so
#                     it outlives the call; BODY may use: $X (xover), $ST, t MSG (timestamped lines), build_cuda (the
#                     CUDA build for sm_90, llama-fit-params included), build_cuda_ik (ik_llama.cpp's, about 12-13
#                     minutes on the H200 machine's 16 cores), build_vulkan (mainline's Vulkan build from the same
#                     tree, with the headers, glslc and SPIRV-Headers of /tmp/vkroot and the loader .gl put in /),
#                     vk_check (the builds xover takes, and the Vulkan build's devices: fails where it sees none),
#                     synth PRESET PATH, smi_on [DIR] / smi_off (nvidia-smi every 2 s into DIR/smi.log, DIR
#                     default $ST), study_once [ARGS] (`xover study $J/study.toml -o $ST ARGS` with nvidia-smi
#                     sampled, its log's tail), study_into DIR SPEC [ARGS] (the same for the spec SPEC into the
#                     store DIR: a job that runs several studies), pack_builds (below), done_ (mark the job done)
#   pack_builds       (in BODY, after each build) each CUDA or Vulkan build not yet packed, its binaries and libraries
#                     stripped, as /tmp/NAME-bins/<build>.tar.xz.partNN (15 MiB parts) with their sha256 sums in
#                     <build>.tar.xz.sums; lease_wait returns the parts as soon as a build is packed, as many as a
#                     call returns, the rest in the next calls. A later lease carries them as out/bins, in as many
#                     calls as the 64 MiB cap needs (about 48 MiB of parts a call beside the repository: put a
#                     different share in out/bins each time, the .sums in any), and build_cuda / build_cuda_ik /
#                     build_vulkan then find the builds restored and skip their 4, 13 and more minutes
#   seed_store SRC NAME...  $ST/results.sqlite as a copy of the committed store SRC without its measurements,
#                     keeping only the artifacts NAME... (placement, tuning, prediction): a study that reuses
#                     another's placement and measures the rest afresh
#   lease_wait        wait up to $WAIT seconds (default 560) for the job, then pack $ST (no models) into
#                     $OUT/NAME.tgz with the job's log, and print the study's progress: the end of the latest
#                     study.log ($ST's or a store's under it) and of its latest llama log, how long ago each was
#                     written, and the llama processes and GPU memory.
#                     A stall shows there in the call's output (the 2026-12-03 lease lost 25 minutes to one unseen)
#
# A later call of the same run.sh finds the job started and only waits and packs again: repeat it until the log
# says done.
T0=$(date +%s); WAIT=${WAIT:-560}
t() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

lease_init() {  # every call: what this call carries is unpacked or staged; the rest once, before the job starts
  NAME=$1; J=/tmp/$NAME-job; ST=/tmp/$NAME
  mkdir -p $J $ST/models /tmp/$NAME-stage /tmp/$NAME-bins
  if [ ! -f $J/started ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    rm -rf $J/src; cp -r out/xsrc/src $J/src
  fi
  if [ -f out/llsrc/llama.tar.gz ] && [ ! -f /tmp/ll/llama.cpp-0c1e570/XOVER_COMMIT ]; then  # absent where its build is carried
    rm -rf /tmp/ll; mkdir -p /tmp/ll && tar xzf out/llsrc/llama.tar.gz -C /tmp/ll
    echo 0c1e57098bba43ac29e6e3b677cdceebdd22334f > /tmp/ll/llama.cpp-0c1e570/XOVER_COMMIT
  fi
  if [ -f out/iksrc/ik.tgz ] && [ ! -f /tmp/ik/ik_llama.cpp-ik0.1.5/XOVER_COMMIT ]; then  # for studies that compare engines
    rm -rf /tmp/ik; mkdir -p /tmp/ik && tar xzf out/iksrc/ik.tgz -C /tmp/ik
    echo ik0.1.5 > /tmp/ik/ik_llama.cpp-ik0.1.5/XOVER_COMMIT
  fi
  vk_setup || exit 1
  stage_builds
}

# Vulkan (scripts/prepare-lease.sh VK=1). .gl: the loader (Debian trixie's libvulkan1, the one the Vulkan build links)
# and libglvnd's libraries, without which the loader cannot open NVIDIA's ICD (libGLX_nvidia.so.0): unpacked to /
# and ldconfig run, once a machine (a stamp names what was unpacked: unpacking again would rewrite libraries that a
# running llama-server has mapped). NVIDIA's ICD file on the lent machines is under /usr/local/nvidia, outside the
# loader's default search path (the device README's recipe names it where no driver is found), so VK_DRIVER_FILES
# names it wherever it exists (the job inherits it). .vkdeps: what the Vulkan build alone needs
# (trixie's libvulkan-dev, glslc with libshaderc1, spirv-headers), unpacked into /tmp/vkroot, never into /, in the
# call (synchronously, as the trees are) so the job's build_vulkan finds it whatever a later call carries.
VKROOT=/tmp/vkroot
vk_setup() {
  if compgen -G ".gl/*.deb" > /dev/null; then
    local sum=$(cat .gl/*.deb | sha256sum | cut -c1-16)
    if [ "$(cat /tmp/.xover-gl 2>/dev/null)" != "$sum" ]; then
      for f in .gl/*.deb; do dpkg -x "$f" / || { t "could not unpack $f to /"; return 1; }; done
      ldconfig && echo $sum > /tmp/.xover-gl && t "unpacked to /: $(cd .gl && ls *.deb | sed 's/_amd64.deb//' | tr '\n' ' ')"
    fi
  fi
  local icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  if [ -f $icd ]; then export VK_DRIVER_FILES=$icd; fi
  if compgen -G ".vkdeps/*.deb" > /dev/null; then
    local sum=$(cat .vkdeps/*.deb | sha256sum | cut -c1-16)
    if [ "$(cat $VKROOT/.xover-vkdeps 2>/dev/null)" != "$sum" ]; then
      rm -rf $VKROOT; mkdir -p $VKROOT
      for f in .vkdeps/*.deb; do dpkg -x "$f" $VKROOT || { t "could not unpack $f to $VKROOT"; return 1; }; done
      echo $sum > $VKROOT/.xover-vkdeps && t "unpacked to $VKROOT: $(cd .vkdeps && ls *.deb | sed 's/_[a-z0-9]*.deb//' | tr '\n' ' ')"
    fi
  fi
  return 0
}

# Builds a former lease packed (pack_builds), carried as out/bins: staged, because one call carries at most about
# 48 MiB of parts beside the repository and a build may need more (copy part of its parts into out/bins for each of
# several calls on the warm machine), and each build restored once all the parts its .sums file names are staged
# and check out. A restored build is marked packed, so it is neither packed nor returned again.
stage_builds() {
  for f in out/bins/*.tar.xz.*; do [ -f "$f" ] && [ ! -e /tmp/$NAME-stage/$(basename $f) ] && cp "$f" /tmp/$NAME-stage/; done
  for sums in /tmp/$NAME-stage/*.sums; do
    [ -e "$sums" ] || continue
    b=$(basename $sums .tar.xz.sums); [ -e /tmp/$NAME-bins/$b.packed ] && continue
    missing=$(cd /tmp/$NAME-stage && awk '{print $2}' $b.tar.xz.sums | while read f; do [ -e "$f" ] || echo $f; done)
    if [ -n "$missing" ]; then t "$b staged, still to carry: $(echo $missing)"; continue; fi
    touch /tmp/$NAME-bins/$b.packed  # before the manifest appears: the job's pack_builds must not pack it again
    if (cd /tmp/$NAME-stage && sha256sum --quiet -c $b.tar.xz.sums) && \
       (set -o pipefail; cd /tmp/$NAME-stage; cat $b.tar.xz.part* | xz -d | tar -xf - -C / --exclude='*/manifest.json' &&
        cat $b.tar.xz.part* | xz -d | tar -xf - -C / --wildcards '*/manifest.json'); then  # the manifest last: built()
      t "restored $b"
    else t "could not restore $b: it is built again"; rm -f /tmp/$NAME-stage/$b.tar.xz.* /tmp/$NAME-bins/$b.packed; fi
  done
}

lease_job() {
  [ -f $J/started ] && return 0
  # a call that carries neither a tree nor a build's parts, on a machine with nothing staged: the lease's machine was
  # given back (30 s idle) and this is a bare one; a job started here would wait 15 minutes for builds that no call
  # will bring, so return at once (carry out/llsrc or out/bins again to start afresh)
  if [ ! -f out/llsrc/llama.tar.gz ] && [ ! -f out/iksrc/ik.tgz ] && [ -z "$(ls /tmp/$NAME-stage 2>/dev/null)" ] &&
     [ -z "$(ls ${XOVER_CACHE_DIR:-$HOME/.cache/xover}/builds 2>/dev/null)" ]; then
    t "no job on this machine and nothing to build or restore it from: a fresh machine (the last one was given back?);"
    t "carry out/llsrc (and out/iksrc, .vkdeps) or out/bins to start the job again; the returned stores are in the repo"
    exit 1
  fi
  cat > $J/job.sh <<JOB
export PYTHONPATH=$J/src:/tmp/site PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=/usr/local/cuda/lib64:\${LD_LIBRARY_PATH:-}
X="python3 -m xover"; ST=$ST; J=$J
T0=\$(date +%s); t() { echo "[\$(( \$(date +%s) - T0 ))s] \$*"; }
CACHE=\${XOVER_CACHE_DIR:-\$HOME/.cache/xover}
built() { ls \$CACHE/builds/\$1-\${2:-cuda}-*/manifest.json > /dev/null 2>&1; }  # ID [BACKEND]: a build of ID is there
await_restore() {  # ID TREE [BACKEND]: where TREE was not carried, wait (15 min at most) for the build to be staged
  built \$1 \${3:-cuda} || [ -d \$2 ] || { t "waiting for \$1's \${3:-cuda} build, carried as out/bins in a later call"; \
    for i in \$(seq 180); do built \$1 \${3:-cuda} && break; sleep 5; done; }
}
build_cuda() {
  await_restore 0c1e570 /tmp/ll/llama.cpp-0c1e570
  if built 0c1e570; then t "llama.cpp's CUDA build restored (out/bins)"; return 0; fi
  \$X llama build --backend cuda --source /tmp/ll/llama.cpp-0c1e570 --cmake-arg=-DCMAKE_CUDA_ARCHITECTURES=90 \\
    > \$ST/build.log 2>&1 || { tail -30 \$ST/build.log; exit 1; }
  t built; \$X llama which | head -3
}
build_cuda_ik() {
  await_restore ik0.1.5 /tmp/ik/ik_llama.cpp-ik0.1.5
  if built ik0.1.5; then t "ik_llama.cpp's CUDA build restored (out/bins)"; return 0; fi
  \$X llama build --engine ik_llama.cpp --backend cuda --source /tmp/ik/ik_llama.cpp-ik0.1.5 \\
    --cmake-arg=-DCMAKE_CUDA_ARCHITECTURES=90 > \$ST/build-ik.log 2>&1 || { tail -30 \$ST/build-ik.log; exit 1; }
  t built ik_llama.cpp; \$X llama which --engine ik_llama.cpp | head -3
}
# The Vulkan build's dependencies by path (FindVulkan's Vulkan_INCLUDE_DIR, Vulkan_GLSLC_EXECUTABLE, Vulkan_LIBRARY;
# ggml-vulkan's find_package(SPIRV-Headers CONFIG)): the same arguments every time, since they key the build. The
# loader is the one .gl put in / (trixie's, as the headers), so the binaries need no path into /tmp/vkroot.
VK_ARGS="--cmake-arg=-DVulkan_INCLUDE_DIR=$VKROOT/usr/include --cmake-arg=-DVulkan_GLSLC_EXECUTABLE=$VKROOT/usr/bin/glslc \\
  --cmake-arg=-DVulkan_LIBRARY=/usr/lib/x86_64-linux-gnu/libvulkan.so.1 \\
  --cmake-arg=-DSPIRV-Headers_DIR=$VKROOT/usr/share/cmake/SPIRV-Headers"
build_vulkan() {  # glslc finds its libshaderc.so.1 in /tmp/vkroot through LD_LIBRARY_PATH (it has no RUNPATH)
  await_restore 0c1e570 /tmp/ll/llama.cpp-0c1e570 vulkan
  if built 0c1e570 vulkan; then t "llama.cpp's Vulkan build restored (out/bins)"; return 0; fi
  [ -x $VKROOT/usr/bin/glslc ] && [ -e /usr/lib/x86_64-linux-gnu/libvulkan.so.1 ] || \\
    { t "no Vulkan build: carry .vkdeps and .gl in the call that starts the job (scripts/prepare-lease.sh VK=1)"; exit 1; }
  local v; v=\$(LD_LIBRARY_PATH=$VKROOT/usr/lib/x86_64-linux-gnu $VKROOT/usr/bin/glslc --version 2>&1) || \\
    { t "glslc does not run here (its feature tests would pass falsely): \$v"; exit 1; }
  t "glslc: \$(echo "\$v" | head -1)"
  LD_LIBRARY_PATH=$VKROOT/usr/lib/x86_64-linux-gnu:\$LD_LIBRARY_PATH \$X llama build --backend vulkan \\
    --source /tmp/ll/llama.cpp-0c1e570 \$VK_ARGS > \$ST/build-vulkan.log 2>&1 || { tail -30 \$ST/build-vulkan.log; exit 1; }
  t built Vulkan
}
vk_check() {  # the builds xover takes, and the devices the Vulkan build's llama-bench lists; fails where none is Vulkan
  \$X llama which 2>&1 | head -12
  local bin=\$(ls -d \$CACHE/builds/0c1e570-vulkan-*/build/bin 2>/dev/null | head -1)
  [ -n "\$bin" ] || { t "no Vulkan build in \$CACHE/builds"; return 1; }
  t "the Vulkan build's devices (VK_DRIVER_FILES=\${VK_DRIVER_FILES:-unset}):"
  timeout 120 \$bin/llama-bench --list-devices > \$ST/vk-devices.log 2>&1; tail -12 \$ST/vk-devices.log
  grep -Eq '^ *Vulkan[0-9]+:' \$ST/vk-devices.log || { t "the Vulkan build sees no Vulkan device"; return 1; }
}
pack_builds() {  # each CUDA or Vulkan build not yet packed: its manifest, binaries and libraries (stripped; no objects) in 15 MiB xz parts
  mkdir -p /tmp/$NAME-bins; exec 9> /tmp/$NAME-bins/lock; flock 9  # one packer at a time (builds end apart)
  for d in \$CACHE/builds/*-cuda-* \$CACHE/builds/*-vulkan-*; do
    b=\$(basename \$d); [ -f \$d/manifest.json ] && [ ! -f /tmp/$NAME-bins/\$b.packed ] || continue
    tmp=/tmp/$NAME-bins/\$b.tmp; rm -rf \$tmp; mkdir -p \$tmp
    (cd / && find \${d#/}/manifest.json \${d#/}/build -not -path '*/CMakeFiles/*' \( -name manifest.json -o \
      -path '*/bin/*' -o -name '*.so*' \) \( -type f -o -type l \)) > \$tmp/list  # from /
    (cd / && grep -v manifest.json \$tmp/list | xargs strip --strip-unneeded 2>/dev/null)
    tar cf - -C / -T \$tmp/list | xz -T0 -6 | split -b 15M -d - \$tmp/\$b.tar.xz.part
    (cd \$tmp && sha256sum \$b.tar.xz.part* > \$b.tar.xz.sums)  # what stage_builds checks before it restores
    mv \$tmp/\$b.tar.xz.* /tmp/$NAME-bins/ && rm -rf \$tmp && touch /tmp/$NAME-bins/\$b.packed  # whole, then marked
    t "packed \$b: \$(du -ch /tmp/$NAME-bins/\$b.tar.xz.part* | tail -1)"
  done
  flock -u 9
}
synth() { [ -f "\$2" ] || (\$X synth --preset "\$1" -o "\$2" > \$ST/synth-\$1.log 2>&1; echo "synth rc=\$?" >> \$ST/synth-\$1.log); }
smi_on() {  # [DIR]: into DIR/smi.log (default \$ST)
  (while true; do echo "\$(date +%s) \$(nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits)"; sleep 2; done) >> \${1:-\$ST}/smi.log 2>&1 &
  SMI=\$!
}
smi_off() { kill \$SMI 2>/dev/null; }
study_into() {  # DIR SPEC [ARGS]: the study of SPEC into the store DIR (ARGS: more for xover study), nvidia-smi sampled
  local dir=\$1 spec=\$2 rc; shift 2; mkdir -p \$dir
  smi_on \$dir
  \$X study \$spec -o \$dir "\$@" > \$dir/study.log 2>&1; rc=\$?
  t "study\$([ \$dir = \$ST ] || echo " \${dir#\$ST/}") rc=\$rc"; tail -40 \$dir/study.log
  smi_off
}
study_once() { study_into \$ST \$J/study.toml "\$@"; }  # the study of \$J/study.toml into \$ST
done_() { t "after: \$(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"; touch $J/done; t done; }
one_model_study() {  # PRESET [ARGS]: the one-model lease: PRESET synthesized into \$ST/models while the CUDA build is
  # restored or made, then the study of \$J/study.toml into \$ST (ARGS: more for xover study), then done
  local preset=\$1; shift
  synth \$preset \$ST/models/\$preset.gguf &
  build_cuda
  wait; t synthesized; tail -qn1 \$ST/synth-*.log
  study_once "\$@"
  done_
}
nvidia-smi --query-gpu=name,memory.total,memory.free,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
grep -m1 "^flags" /proc/cpuinfo > \$ST/cpu-flags.txt; grep -m1 "^model name" /proc/cpuinfo
JOB
  cat >> $J/job.sh
  touch $J/started
  setsid bash $J/job.sh > $J/job.log 2>&1 < /dev/null &
  t "job started"
}

seed_store() {
  python3 - "$ST/results.sqlite" "$@" <<'PY'
import shutil, sqlite3, sys
new, old, keep = sys.argv[1], sys.argv[2], tuple(sys.argv[3:])
shutil.copy(old, new)
db = sqlite3.connect(new)
for table in ("bench_results", "ttft_samples", "failures", "session_turns"):
    db.execute(f"DELETE FROM {table}")
db.execute(f"DELETE FROM artifacts WHERE name NOT IN ({','.join('?' * len(keep))})", keep)
db.execute("DELETE FROM runs WHERE id NOT IN (SELECT run_id FROM artifacts WHERE run_id IS NOT NULL)")  # emptied
db.commit()
print("seeded:", dict(db.execute("SELECT name, count(*) FROM artifacts GROUP BY name").fetchall()))
PY
}

progress() {  # what the study is doing now: the job's log says only when it started and ended
  local slog=$(ls -t $ST/study.log $ST/*/study.log 2>/dev/null | head -1)  # $ST's, or the latest store's under it
  [ -n "$slog" ] || return 0
  echo "--- ${slog#$ST/} (last written $(( $(date +%s) - $(stat -c %Y $slog) )) s ago):"; tail -8 $slog
  echo "--- llama processes (pid ppid pgid seconds state):"
  ps -eo pid,ppid,pgid,etimes,stat,args | awk '$6 ~ /llama-(server|bench)$/ {print $1, $2, $3, $4, $5, $6}'
  local log=$(ls -t $(dirname $slog)/logs/*.log 2>/dev/null | head -1)
  [ -n "$log" ] && echo "--- $(basename $log) (last written $(( $(date +%s) - $(stat -c %Y $log) )) s ago):" && tail -3 "$log" | cut -c1-200
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null
}

lease_wait() {  # until the job is done, a build is newly packed, or $WAIT seconds
  # parts of the builds this lease packed, not returned yet (restored builds are staged elsewhere: never returned)
  unreturned() { for f in /tmp/$NAME-bins/*.tar.xz.*; do [ -e "$f" ] && ! grep -qxF "$(basename $f)" $J/returned 2>/dev/null && echo $f; done; }
  while [ ! -f $J/done ] && pgrep -f $J/job.sh > /dev/null && [ -z "$(unreturned)" ] && [ $(( $(date +%s) - T0 )) -lt $WAIT ]; do sleep 5; done
  t "waited"; tail -60 $J/job.log
  progress
  tar czf $OUT/$NAME.tgz -C $ST --exclude=models --exclude='*.gguf' . 2>/dev/null
  cp $J/job.log $OUT/ 2>/dev/null
  # the packed builds' parts, as many as this call can return (8 files and 64 MiB, these two included); the rest in
  # the next calls, which return at once while any is left. Keep them all: a later lease stages them (stage_builds).
  local files=$(ls $OUT | wc -l) mib=$(du -cm $OUT/* | tail -1 | cut -f1) f size
  for f in $(unreturned); do
    size=$(du -m $f | cut -f1)
    [ $(( files + 1 )) -le 8 ] && [ $(( mib + size )) -le 62 ] || { t "more parts in the next call"; break; }
    cp $f $OUT/ && basename $f >> $J/returned && files=$(( files + 1 )) && mib=$(( mib + size ))
  done
  ls -la $OUT
}

measured_here() {  # DIR: 0 where the store in DIR (results.sqlite, tune/results.sqlite) was measured on this machine's
  # kind of card or names none; else 1, said (never one study's numbers from two kinds of card)
  local dir=$1 on gpu
  on=$(python3 - $dir/results.sqlite $dir/tune/results.sqlite <<'PY'
import os, sqlite3, sys
for path in sys.argv[1:]:
    if os.path.isfile(path):
        q = "select distinct json_extract(provenance,'$.gpu_info') from runs"
        names = {r[0].split(",")[0] for r in sqlite3.connect(path).execute(q) if r[0]}
        if names:
            print(" and ".join(sorted(names)))  # two kinds never equal one card's name: afresh
            break
PY
)
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  if [ -n "$on" ] && [ "$on" != "$gpu" ]; then echo "$dir was measured on $on, this machine has $gpu: not resumed"; return 1; fi
  [ -z "$on" ] || echo "$dir was measured on $on"
}

resume_store() {  # DIR [DEST]: an earlier lease's committed store (DIR/results.sqlite with DIR/tune and DIR/logs) into
  # DEST (default $ST) to resume it, where it was measured on this machine's kind of card (measured_here); 1 where
  # there is none or the card differs
  local dir=$1 dest=${2:-$ST}
  [ -f $dir/results.sqlite ] && measured_here $dir || return 1
  mkdir -p $dest && cp $dir/results.sqlite $dest/ && { [ ! -d $dir/tune ] || cp -r $dir/tune $dest/; } &&
    { [ ! -d $dir/logs ] || cp -r $dir/logs $dest/; }  # the committed logs: the lease's servers take new names
  echo "resuming $dir/results.sqlite"
}
