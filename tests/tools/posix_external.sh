#!/usr/bin/env bash
# make posix-external: the independent tools against a bftfs mount.
#
#   pjdfstest  the Rust rewrite of the pjd POSIX file system test suite (crates.io `pjdfstest`)
#   fsx        Apple/BSD fsx in Rust (crates.io `fsx`, fsx-rs), a seeded random exerciser with mmap
#
# Both are installed with `cargo install --locked` into $POSIX_TOOLS_DIR (default /var/tmp/bftfs-posix-tools)
# the first time; they need cargo >= 1.85 (Debian 12's cargo is too old: then this says so and exits 2).
# The mount is `bftfs mount -f --local` in a fresh temporary directory (or POSIX_EXTERNAL_DIR=DIR runs both
# tools against DIR instead, e.g. ext4 or tmpfs, to see their baseline). pjdfstest runs one module at a time
# under a time limit, because one hung module (see tests/integration/POSIX_FINDINGS.md) must not hide the
# others' results. Keep TARGET short (pjdfstest binds Unix sockets about 55 bytes below it). Logs go to $POSIX_OUT (default build/posix-external/); the last lines are a summary.
#
# POSIX_EXTERNAL_MOUNT=pbft (or norep) runs them on the replicated file system instead: `bftfs cluster start
# --service fs` (four replicas behind the shim, and the relay) and `bftfs mount --relay`.
# Environment: BFTFS_BUILD (build dir), POSIX_TOOLS_DIR, POSIX_OUT, FSX_OPS (default 20000), FSX_SEED
# (default 1), PJD_TIMEOUT_S (per module, default 180), PJD_MODULES (default: all), BFTFS_MOUNT_ARGS,
# POSIX_EXTERNAL_MOUNT (local, pbft, norep), POSIX_EXTERNAL_PORT (replica 0's port for pbft/norep, 27600).
# Exit status: 0 nothing failed, 1 something failed or hung, 2 the tools could not be installed or run.
set -uo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BFTFS_BUILD:-$REPO/build}
BFTFS=$BUILD/cli/bftfs
TOOLS=${POSIX_TOOLS_DIR:-/var/tmp/bftfs-posix-tools}
OUT=${POSIX_OUT:-$BUILD/posix-external}
FSX_OPS=${FSX_OPS:-20000}
FSX_SEED=${FSX_SEED:-1}
PJD_TIMEOUT_S=${PJD_TIMEOUT_S:-180}
PJD_MODULES=${PJD_MODULES:-"chmod chown ftruncate link mkdir mkfifo mknod open posix_fallocate rename rmdir symlink truncate unlink utimensat"}

say() { echo "posix-external: $*"; }

# ---- tools ----
install_tools() {
  if [[ -x $TOOLS/bin/pjdfstest && -x $TOOLS/bin/fsx ]]; then return 0; fi
  local cargo
  cargo=$(command -v cargo || true)
  [[ -z $cargo && -x $HOME/.cargo/bin/cargo ]] && cargo=$HOME/.cargo/bin/cargo
  if [[ -z $cargo ]]; then
    say "cargo is not installed (pjdfstest and fsx need cargo >= 1.85; Debian 12's is older): nothing run"
    return 2
  fi
  # exacl (pjdfstest's ACL tests) links libacl.
  if ! dpkg -s libacl1-dev >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
    apt-get install -y -qq libacl1-dev >/dev/null 2>&1 || say "warning: could not install libacl1-dev"
  fi
  say "installing pjdfstest and fsx into $TOOLS (cargo install --locked; a few minutes the first time)"
  mkdir -p "$TOOLS"
  if ! nice -n 10 "$cargo" install --locked --root "$TOOLS" pjdfstest fsx >"$TOOLS/install.log" 2>&1; then
    say "cargo install failed; see $TOOLS/install.log"
    tail -5 "$TOOLS/install.log"
    return 2
  fi
}

install_tools || exit $?
mkdir -p "$OUT"

# ---- the directory under test ----
MNT_PID=""
WORK=""
cleanup() {
  if [[ -n $WORK ]]; then
    if mountpoint -q "$WORK/mnt"; then
      "$BFTFS" umount "$WORK/mnt" >/dev/null 2>&1 || fusermount3 -u -z "$WORK/mnt" >/dev/null 2>&1 || true
    fi
    if [[ -n $MNT_PID ]] && kill -0 "$MNT_PID" 2>/dev/null; then
      kill "$MNT_PID" 2>/dev/null
      for _ in $(seq 50); do kill -0 "$MNT_PID" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$MNT_PID" 2>/dev/null || true
    fi
    if [[ -f $WORK/cluster/cluster.conf ]]; then "$BFTFS" cluster stop --dir "$WORK/cluster" >/dev/null 2>&1; fi
    mountpoint -q "$WORK/mnt" || rm -rf "$WORK"
  fi
}
trap cleanup EXIT

if [[ -n ${POSIX_EXTERNAL_DIR:-} ]]; then
  mkdir -p "$POSIX_EXTERNAL_DIR"
  TARGET=$(mktemp -d "$POSIX_EXTERNAL_DIR/px.XXXXXX")
  say "target: $TARGET (POSIX_EXTERNAL_DIR)"
else
  [[ -x $BFTFS ]] || { say "$BFTFS is not built (run make)"; exit 2; }
  # Short paths: pjdfstest binds Unix sockets deep below the target (sun_path holds 107 bytes).
  WORK=$(mktemp -d /tmp/bpx.XXXXXX)
  chmod 755 "$WORK"
  mkdir "$WORK/data" "$WORK/mnt"
  KIND=${POSIX_EXTERNAL_MOUNT:-local}
  case $KIND in
    local) BACKEND=(--local "$WORK/data") ;;
    pbft|norep)
      extra=()
      [[ $KIND == norep ]] && extra=(--norep)
      if ! "$BFTFS" cluster start --dir "$WORK/cluster" --f 1 --base-port "${POSIX_EXTERNAL_PORT:-27600}" \
           --service fs "${extra[@]}" >"$OUT/cluster.log" 2>&1; then
        say "bftfs cluster start failed; see $OUT/cluster.log"; exit 2
      fi
      BACKEND=(--relay "$WORK/cluster/relay.sock") ;;
    *) say "POSIX_EXTERNAL_MOUNT=$KIND: expected local, pbft or norep"; exit 2 ;;
  esac
  # shellcheck disable=SC2086 # BFTFS_MOUNT_ARGS is a list of options
  "$BFTFS" mount -f "${BACKEND[@]}" "$WORK/mnt" ${BFTFS_MOUNT_ARGS:-} >"$OUT/mount.log" 2>&1 &
  MNT_PID=$!
  for _ in $(seq 200); do mountpoint -q "$WORK/mnt" && break; sleep 0.05; done
  mountpoint -q "$WORK/mnt" || { say "the mount did not come up; see $OUT/mount.log"; exit 2; }
  TARGET=$WORK/mnt
  say "target: $TARGET (bftfs mount, $KIND backend, log $OUT/mount.log)"
fi
chmod 755 "$TARGET"

# ---- pjdfstest ----
CONF=$OUT/pjdfstest.toml
cat >"$CONF" <<'EOF'
# Written by tests/tools/posix_external.sh. Linux features that ext4 and tmpfs have; the two unprivileged users
# exist on every Debian system.
[features]
posix_fallocate = {}
rename_ctime = {}
utime_now = {}
utimensat = {}
[settings]
naptime = 0.02
allow_remount = false
[dummy_auth]
entries = [ ["nobody", "nogroup"], ["daemon", "daemon"] ]
EOF

: >"$OUT/pjdfstest-failures.txt"
failed=0
summary=()
for m in $PJD_MODULES; do
  dir=$TARGET/$m
  mkdir -p "$dir" && chmod 755 "$dir"
  log=$OUT/pjdfstest-$m.log
  timeout -k 10 "$PJD_TIMEOUT_S" "$TOOLS/bin/pjdfstest" -c "$CONF" -p "$dir" "tests::$m::" >"$log" 2>&1
  rc=$?
  line=$(grep -E '^Summary:' "$log" | tail -1)
  if [[ $rc == 124 || $rc == 137 ]]; then
    summary+=("pjdfstest $m: HUNG (killed after ${PJD_TIMEOUT_S}s; last: $(grep -E '::' "$log" | tail -1 | awk '{print $1}'))")
    failed=1
  elif [[ -z $line ]]; then
    summary+=("pjdfstest $m: did not finish (exit $rc; see $log)")
    failed=1
  else
    summary+=("pjdfstest $m: ${line#Summary: }")
    [[ $line == *" 0 failed"* ]] || failed=1
  fi
  grep -E 'FAILED$' "$log" | awk '{print "    " $1}' >>"$OUT/pjdfstest-failures.txt"
done

# ---- fsx ----
FSXCONF=$OUT/fsx.toml
cat >"$FSXCONF" <<'EOF'
# Written by tests/tools/posix_external.sh: 4 MiB files (several 64 KiB bftfs blocks), every operation a
# FUSE file system must support (no hole punching or preallocation: not offered by the client).
flen = 4194304
[opsize]
max = 200000
min = 0
align = 1
[weights]
close_open = 2
read = 10
write = 10
mapread = 5
mapwrite = 5
invalidate = 1
truncate = 3
fsync = 1
fdatasync = 1
posix_fallocate = 0
punch_hole = 0
sendfile = 1
posix_fadvise = 1
copy_file_range = 1
EOF
mkdir -p "$TARGET/fsx"
( cd "$OUT" && timeout -k 10 1800 "$TOOLS/bin/fsx" -f "$FSXCONF" -N "$FSX_OPS" -S "$FSX_SEED" -P "$OUT" \
    "$TARGET/fsx/fsx.dat" >"$OUT/fsx.log" 2>&1 )
rc=$?
if [[ $rc == 0 ]]; then
  summary+=("fsx: ok, $FSX_OPS ops, seed $FSX_SEED")
else
  summary+=("fsx: FAILED (exit $rc, seed $FSX_SEED; log $OUT/fsx.log): $(grep -iE 'error|fail|mismatch' "$OUT/fsx.log" | head -1)")
  failed=1
fi

echo
say "logs in $OUT"
if [[ -s $OUT/pjdfstest-failures.txt ]]; then
  say "pjdfstest failures (details in $OUT/pjdfstest-MODULE.log):"
  cat "$OUT/pjdfstest-failures.txt"
fi
for s in "${summary[@]}"; do echo "  $s"; done
exit $failed
