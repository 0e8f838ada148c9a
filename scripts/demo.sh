#!/usr/bin/env bash
# `make demo`: bftfs as a file system people build software on (`make demo-counter` is the engine alone).
#
#   1. `bftfs cluster start --f 1 --service fs`: keys for a new cluster (keygen), four replicas and the relay
#   2. `bftfs mount --relay`: the FUSE client mounts the replicated file system
#   3. the Andrew-style benchmark on the mount (benchmarks/bench_fs.py --demo): create the directories, copy
#      Lua 5.4's source tree (from Debian's source package, fetched by `make deps`), stat every file, read every
#      byte, compile it with its own makefile; then every file is read back and checked after a remount, and
#      the lua interpreter built on the mount runs a script
#   4. unmount, stop the cluster; the same on NO-REP (`cluster start --norep`: one unreplicated server)
#   5. the phase times side by side
# Nothing is left running or mounted, also when interrupted: bench_fs.py unmounts and stops what it started,
# and an EXIT trap here does it again for anything under this run's directory (mounts, then clusters). The
# directory is removed unless something failed (then it is kept, with the daemons' and compilers' logs).
#
# Environment: BFTFS_BUILD (build directory, default ./build), DEMO_ANDREW_N (copies of the tree, default 1),
# BFTFS_DEMO_KEEP=1 keeps the directory even on success.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BFTFS_BUILD:-$ROOT/build}
BFTFS=$BUILD/cli/bftfs
ANDREW_N=${DEMO_ANDREW_N:-1}

say() { printf 'demo: %s\n' "$*"; }
die() { printf 'demo: ERROR: %s\n' "$*" >&2; exit 1; }

[[ -x $BFTFS ]] || die "$BFTFS is not built (run: make)"
command -v python3 >/dev/null || die "python3 is required"
[[ -e /dev/fuse ]] || die "/dev/fuse is missing: FUSE is not available on this machine"

DIR=$(mktemp -d /tmp/bftfs-demo.XXXXXX)
PY_PID=""

# Mount points under $DIR, deepest first (/proc/mounts escapes blanks as \040; $DIR has none).
mounts_under_dir() {
  awk -v d="$DIR/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r
}

cleanup() {
  local rc=$? m c deadline
  trap - EXIT INT TERM
  if [[ -n $PY_PID ]] && kill -0 "$PY_PID" 2>/dev/null; then
    # bench_fs.py turns TERM into its own orderly shutdown (unmount, cluster stop); give it time for that.
    kill -TERM "$PY_PID" 2>/dev/null || true
    deadline=$((SECONDS + 60))
    while kill -0 "$PY_PID" 2>/dev/null && [[ $SECONDS -lt $deadline ]]; do sleep 0.1; done
    kill -KILL "$PY_PID" 2>/dev/null || true
    wait "$PY_PID" 2>/dev/null || true
  fi
  while read -r m; do
    [[ -n $m ]] || continue
    say "unmounting $m"
    "$BFTFS" umount "$m" >/dev/null 2>&1 || fusermount3 -u -z "$m" >/dev/null 2>&1 || umount -l "$m" || true
  done < <(mounts_under_dir)
  for c in "$DIR"/*/cluster-*; do
    if [[ -f $c/cluster.conf ]]; then "$BFTFS" cluster stop --dir "$c" >/dev/null 2>&1 || true; fi
  done
  if [[ -n $(mounts_under_dir) ]]; then
    say "WARNING: still mounted: $(mounts_under_dir | tr '\n' ' ')"
    if [[ $rc -eq 0 ]]; then rc=1; fi
  fi
  if [[ ${BFTFS_DEMO_KEEP:-0} == 1 || $rc -ne 0 ]]; then
    say "logs and data kept in $DIR"
  else
    rm -rf "$DIR"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "run directory $DIR; Andrew$ANDREW_N on PBFT (4 replicas, f=1) and on NO-REP"
# In the background, waited for: bash runs a trap only between commands, so a foreground child would delay the
# cleanup on Ctrl-C until it finished by itself.
BFTFS_BUILD=$BUILD python3 "$ROOT/benchmarks/bench_fs.py" --demo --andrew-n "$ANDREW_N" --scratch "$DIR" &
PY_PID=$!
rc=0
wait "$PY_PID" || rc=$?
PY_PID=""
[[ $rc -eq 0 ]] || die "the benchmark failed (exit $rc)"
say "done; unmounted and all processes stopped"
