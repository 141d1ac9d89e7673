# The steps every study's lease on a lent GPU machine repeats; a study's run.sh sources this file from the
# repository root on the GPU machine, which carries out/llsrc, out/xsrc and .whl (scripts/prepare-lease.sh makes them
# on the development machine, which has the package registries):
#
#   lease_init NAME   the job's folder J=/tmp/NAME-job and the study's folder ST=/tmp/NAME; once, before the job
#                     starts: the wheels the GPU machine's Python lacks installed into /tmp/site, the committed src
#                     (out/xsrc) copied into $J/src; in every call, whatever this call carries: the pinned llama.cpp
#                     tree (out/llsrc) unpacked into /tmp/ll, ik_llama.cpp's (out/iksrc) into /tmp/ik, packed builds
#                     (out/bins) staged and restored once whole (stage_builds)
#   lease_job BODY    write $J/job.sh (the common prelude, then the bash text BODY) and start it under setsid once, so
#                     it outlives the call; BODY may use: $X (xover), $ST, t MSG (timestamped lines), build_cuda (the
#                     CUDA build for sm_90, llama-fit-params included), build_cuda_ik (ik_llama.cpp's, about 12-13
#                     minutes on the H200 machine's 16 cores), synth PRESET PATH, smi_on / smi_off (nvidia-smi
#                     every 2 s into $ST/smi.log), study_once [ARGS] (`xover study $J/study.toml -o $ST ARGS` with
#                     nvidia-smi sampled, its log's tail), pack_builds (below), done_ (mark the job done)
#   pack_builds       (in BODY, after each build) each CUDA build not yet packed, its binaries and libraries
#                     stripped, as /tmp/NAME-bins/<build>.tar.xz.partNN (15 MiB parts) with their sha256 sums in
#                     <build>.tar.xz.sums; lease_wait returns the parts as soon as a build is packed, as many as a
#                     call returns, the rest in the next calls. A later lease carries them as out/bins, in as many
#                     calls as the 64 MiB cap needs (about 48 MiB of parts a call beside the repository: put a
#                     different share in out/bins each time, the .sums in any), and build_cuda / build_cuda_ik then
#                     find the builds restored and skip their 4 and 13 minutes
#   seed_store SRC NAME...  $ST/results.sqlite as a copy of the committed store SRC without its measurements,
#                     keeping only the artifacts NAME... (placement, tuning, prediction): a study that reuses
#                     another's placement and measures the rest afresh
#   lease_wait        wait up to $WAIT seconds (default 560) for the job, then pack $ST (no models) into
#                     $OUT/NAME.tgz with the job's log, and print the study's progress: the end of study.log and of
#                     the latest llama log, how long ago each was written, and the llama processes and GPU memory.
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
  stage_builds
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
  cat > $J/job.sh <<JOB
export PYTHONPATH=$J/src:/tmp/site PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=/usr/local/cuda/lib64:\${LD_LIBRARY_PATH:-}
X="python3 -m xover"; ST=$ST; J=$J
T0=\$(date +%s); t() { echo "[\$(( \$(date +%s) - T0 ))s] \$*"; }
CACHE=\${XOVER_CACHE_DIR:-\$HOME/.cache/xover}
built() { ls \$CACHE/builds/\$1-cuda-*/manifest.json > /dev/null 2>&1; }  # a CUDA build of identity \$1 is there
await_restore() {  # ID TREE: where TREE was not carried, wait (15 min at most) for the build ID to be staged (out/bins)
  built \$1 || [ -d \$2 ] || { t "waiting for \$1's build, carried as out/bins in a later call"; \
    for i in \$(seq 180); do built \$1 && break; sleep 5; done; }
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
pack_builds() {  # each CUDA build not yet packed: its manifest, binaries and libraries (stripped; no objects) in 15 MiB xz parts
  mkdir -p /tmp/$NAME-bins; exec 9> /tmp/$NAME-bins/lock; flock 9  # one packer at a time (builds end apart)
  for d in \$CACHE/builds/*-cuda-*; do
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
smi_on() {
  (while true; do echo "\$(date +%s) \$(nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits)"; sleep 2; done) >> \$ST/smi.log 2>&1 &
  SMI=\$!
}
smi_off() { kill \$SMI 2>/dev/null; }
study_once() {  # the study of \$J/study.toml into \$ST (arguments: more for xover study), nvidia-smi sampled
  smi_on
  \$X study \$J/study.toml -o \$ST "\$@" > \$ST/study.log 2>&1
  t "study rc=\$?"; tail -40 \$ST/study.log
  smi_off
}
done_() { t "after: \$(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"; touch $J/done; t done; }
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
  [ -f $ST/study.log ] || return 0
  echo "--- study.log (last written $(( $(date +%s) - $(stat -c %Y $ST/study.log) )) s ago):"; tail -8 $ST/study.log
  echo "--- llama processes (pid ppid pgid seconds state):"
  ps -eo pid,ppid,pgid,etimes,stat,args | awk '$6 ~ /llama-(server|bench)$/ {print $1, $2, $3, $4, $5, $6}'
  local log=$(ls -t $ST/logs/*.log 2>/dev/null | head -1)
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
