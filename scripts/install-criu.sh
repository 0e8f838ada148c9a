#!/usr/bin/env bash
# Makes CRIU 4.1.1 from Debian 13 (trixie) available on Debian 12 without touching the system libc or the
# system's apt sources (../shared/notes/criu-on-this-kernel.md explains why and how):
#
#   /opt/bftfs/criu             criu, libcompel1 and every library they need (trixie glibc included), unpacked
#                               with dpkg -x; nothing there is registered with dpkg
#   /usr/local/bin/bftfs-criu   wrapper that runs that criu under its own loader (template: scripts/bftfs-criu)
#   /opt/bftfs/libcriu          trixie's libcriu2 + libcriu-dev (include/criu/*.h, lib/libcriu.{so,a},
#                               lib/pkgconfig/criu.pc). libcriu runs against the system libc and bookworm's
#                               libprotobuf-c1; building against it needs libprotobuf-c-dev (scripts/deps.sh).
#
# Idempotent: exits in well under a second when the wrapper already reports 4.1.x and libcriu is in place.
# Environment: BFTFS_CRIU_PREFIX, BFTFS_LIBCRIU_PREFIX, BFTFS_CRIU_WRAPPER override the three paths above;
# BFTFS_CRIU_FORCE=1 reinstalls; BFTFS_CRIU_REQUIRE_CHECK=1 makes a failing `criu check` fatal (by default it
# is reported loudly but does not fail the install: only the speculation/rollback features need it).
set -euo pipefail

PREFIX=${BFTFS_CRIU_PREFIX:-/opt/bftfs/criu}
LIBCRIU=${BFTFS_LIBCRIU_PREFIX:-/opt/bftfs/libcriu}
WRAPPER=${BFTFS_CRIU_WRAPPER:-/usr/local/bin/bftfs-criu}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TEMPLATE="$HERE/bftfs-criu"
WANT_SERIES="4.1."   # the version measured on this kernel; anything else is refused
MULTIARCH=x86_64-linux-gnu

say() { printf 'install-criu: %s\n' "$*"; }
die() { printf 'install-criu: ERROR: %s\n' "$*" >&2; exit 1; }

[[ $(uname -m) == x86_64 ]] || die "only x86_64 is supported (the wrapper uses ld-linux-x86-64.so.2)"
[[ -f $TEMPLATE ]] || die "wrapper template $TEMPLATE is missing"

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || die "must run as root (or with sudo available)"
  SUDO=(sudo)
fi

rendered_wrapper() { sed "s|@PREFIX@|$PREFIX|g" "$TEMPLATE"; }

criu_version() {  # prints e.g. 4.1.1, or nothing
  "$1" --version 2>/dev/null | awk '/^Version:/{print $2; exit}'
}

install_wrapper() {
  local tmp
  tmp=$(mktemp)
  rendered_wrapper >"$tmp"
  chmod 0755 "$tmp"
  "${SUDO[@]}" mkdir -p "$(dirname "$WRAPPER")"
  "${SUDO[@]}" install -m 0755 "$tmp" "$WRAPPER"
  rm -f "$tmp"
}

libcriu_present() {
  [[ -f $LIBCRIU/include/criu/criu.h && -e $LIBCRIU/lib/libcriu.so.2 && -f $LIBCRIU/lib/pkgconfig/criu.pc ]]
}

# ---- fast path ----
if [[ ${BFTFS_CRIU_FORCE:-0} != 1 && -x $PREFIX/usr/sbin/criu ]] && libcriu_present; then
  if [[ ! -f $WRAPPER ]] || ! cmp -s <(rendered_wrapper) "$WRAPPER"; then
    install_wrapper
  fi
  v=$(criu_version "$WRAPPER")
  if [[ $v == "$WANT_SERIES"* ]]; then
    say "CRIU $v already installed ($WRAPPER -> $PREFIX; libcriu in $LIBCRIU)"
    exit 0
  fi
  say "installed wrapper reports '${v:-nothing}', reinstalling"
fi

# ---- private apt state for trixie (the system's sources, lists and status are not touched) ----
command -v apt-get >/dev/null || die "apt-get not found (Debian is required)"
command -v dpkg-deb >/dev/null || die "dpkg-deb not found"

WORK=$(mktemp -d /tmp/bftfs-criu-apt.XXXXXX)
STAGE=""
cleanup() {
  rm -rf "$WORK"
  if [[ -n $STAGE ]]; then "${SUDO[@]}" rm -rf "$STAGE"; fi
}
trap cleanup EXIT
mkdir -p "$WORK/extract"
# shellcheck source=scripts/private-apt.sh
. "$(dirname "${BASH_SOURCE[0]}")/private-apt.sh"
private_apt_setup "$WORK" deb trixie main
APT_OPTS+=(
  -o "APT::Default-Release=trixie"
  -o "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false"
  -o "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false"
  -o "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false"
  -o "Acquire::IndexTargets::deb::DEP-11-icons-hidpi::DefaultEnabled=false"
)
papt_get() { "${SUDO[@]}" apt-get "${APT_OPTS[@]}" "$@"; }
papt_cache() { apt-cache "${APT_OPTS[@]}" "$@"; }

say "fetching the trixie package index from $MIRROR (private apt state in $WORK)"
papt_get -q update >"$WORK/update.log" 2>&1 || { cat "$WORK/update.log" >&2; die "apt-get update (trixie) failed"; }

cand=$(papt_cache show --no-all-versions criu 2>/dev/null | awk '/^Version:/{print $2; exit}')
[[ -n $cand ]] || die "criu not found in trixie"
upstream=${cand#*:}; upstream=${upstream%%-*}
[[ $upstream == "$WANT_SERIES"* ]] || die "trixie offers criu $cand; only ${WANT_SERIES}x was validated on this kernel"

# The dependency closure of criu and libcriu2 (Depends and Pre-Depends only). Debian 13 is merged-/usr and its
# glibc is part of the closure, so the prefix is self-contained: nothing resolves to a bookworm library.
mapfile -t PKGS < <(papt_cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
                      --no-replaces --no-enhances criu libcriu2 2>/dev/null | grep -v '^ ' | grep -v '^<' | sort -u)
[[ ${#PKGS[@]} -gt 0 ]] || die "could not resolve the dependencies of criu"
say "downloading ${#PKGS[@]} packages: ${PKGS[*]} libcriu-dev"
(cd "$WORK/archives" && papt_get -q download "${PKGS[@]}" libcriu-dev) >"$WORK/download.log" 2>&1 \
  || { cat "$WORK/download.log" >&2; die "apt-get download failed"; }

# ---- unpack into a staging prefix, verify, then swap it in ----
"${SUDO[@]}" mkdir -p "$(dirname "$PREFIX")"
STAGE=$("${SUDO[@]}" mktemp -d "$PREFIX.new.XXXXXX")
for deb in "$WORK"/archives/*.deb; do
  case $(basename "$deb") in
    libcriu-dev_*) continue ;;  # headers go to $LIBCRIU only
  esac
  "${SUDO[@]}" dpkg-deb -x "$deb" "$STAGE"
done
"${SUDO[@]}" chmod 0755 "$STAGE"
printf '%s\n' "${PKGS[@]}" | "${SUDO[@]}" tee "$STAGE/.bftfs-packages" >/dev/null

SLIB="$STAGE/usr/lib/$MULTIARCH"
LOADER="$SLIB/ld-linux-x86-64.so.2"
[[ -x $LOADER ]] || die "the unpacked libc6 has no $LOADER"
[[ -x $STAGE/usr/sbin/criu ]] || die "the unpacked criu has no usr/sbin/criu"
# ldd-style check through the private loader: every library must resolve inside the prefix.
if ! deps=$("$LOADER" --library-path "$SLIB" --list "$STAGE/usr/sbin/criu" 2>&1); then
  echo "$deps" >&2
  die "the private loader cannot load criu"
fi
if grep -q 'not found' <<<"$deps"; then
  echo "$deps" >&2
  die "criu has unresolved libraries (see above)"
fi
outside=$(awk '/=>/ && $3 ~ /^\// && index($3, "'"$STAGE"'") != 1 {print $1 " => " $3}' <<<"$deps")
[[ -z $outside ]] || { echo "$outside" >&2; die "criu resolves libraries outside the prefix"; }
staged_version=$("$LOADER" --library-path "$SLIB" "$STAGE/usr/sbin/criu" --version | awk '/^Version:/{print $2}')
[[ $staged_version == "$WANT_SERIES"* ]] || die "staged criu reports '$staged_version'"

if [[ -e $PREFIX ]]; then "${SUDO[@]}" rm -rf "$PREFIX"; fi
"${SUDO[@]}" mv "$STAGE" "$PREFIX"
STAGE=""

# ---- libcriu for the build ----
for deb in "$WORK"/archives/libcriu2_*.deb "$WORK"/archives/libcriu-dev_*.deb; do
  dpkg-deb -x "$deb" "$WORK/extract"
done
LSTAGE="$WORK/libcriu"
mkdir -p "$LSTAGE/include" "$LSTAGE/lib/pkgconfig"
cp -a "$WORK/extract/usr/include/criu" "$LSTAGE/include/"
cp -a "$WORK/extract/usr/lib/$MULTIARCH"/libcriu.* "$LSTAGE/lib/"
cat >"$LSTAGE/lib/pkgconfig/criu.pc" <<EOF
# Written by scripts/install-criu.sh from trixie's libcriu-dev $cand.
prefix=$LIBCRIU
libdir=\${prefix}/lib
includedir=\${prefix}/include/criu

Name: CRIU
Description: RPC library for userspace checkpoint and restore (service binary: $WRAPPER)
Version: $upstream
Requires.private: libprotobuf-c
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lcriu
Cflags: -I\${prefix}/include -I\${includedir}
EOF
"${SUDO[@]}" rm -rf "$LIBCRIU"
"${SUDO[@]}" mkdir -p "$(dirname "$LIBCRIU")"
"${SUDO[@]}" cp -a "$LSTAGE" "$LIBCRIU"

install_wrapper

# ---- verification ----
v=$(criu_version "$WRAPPER")
[[ $v == "$WANT_SERIES"* ]] || die "$WRAPPER --version reports '${v:-nothing}'"
say "$WRAPPER --version: $v"

# libcriu against the system libc, driving the wrapper in swrk mode (criu_get_version asks criu over RPC).
if command -v cc >/dev/null && [[ -f /usr/include/protobuf-c/protobuf-c.h ]]; then
  cat >"$WORK/libcriu_probe.c" <<'EOF'
#include <stdio.h>
#include <criu/criu.h>
int main(int argc, char** argv) {
  if (argc != 2 || criu_init_opts() != 0) return 2;
  criu_set_service_binary(argv[1]);
  int v = criu_get_version();
  printf("%d\n", v);
  return v > 0 ? 0 : 1;
}
EOF
  if cc -o "$WORK/libcriu_probe" "$WORK/libcriu_probe.c" -I"$LIBCRIU/include" -L"$LIBCRIU/lib" \
       -Wl,-rpath,"$LIBCRIU/lib" -lcriu 2>"$WORK/probe.log"; then
    pv=$("$WORK/libcriu_probe" "$WRAPPER" 2>>"$WORK/probe.log") || { cat "$WORK/probe.log" >&2; die "libcriu probe failed"; }
    say "libcriu (system libc) -> $WRAPPER swrk: criu_get_version() = $pv"
  else
    cat "$WORK/probe.log" >&2
    die "could not build a program against $LIBCRIU"
  fi
else
  say "skipping the libcriu probe: cc or libprotobuf-c-dev is not installed (scripts/deps.sh installs both)"
fi

say "$WRAPPER check:"
set +e
check_out=$("${SUDO[@]}" "$WRAPPER" check 2>&1)
check_rc=$?
set -e
printf '%s\n' "$check_out" | sed 's/^/  | /'
# The sandbox lacks CAP_SYS_RESOURCE, so criu may log "Can't setup RLIMIT_NOFILE": harmless (see the note).
if [[ $check_rc -eq 0 ]] && grep -q 'Looks good' <<<"$check_out"; then
  say "criu check passed"
else
  msg="criu check failed (exit $check_rc): checkpoint/rollback will not work on this machine"
  if [[ ${BFTFS_CRIU_REQUIRE_CHECK:-0} == 1 ]]; then die "$msg"; fi
  say "WARNING: $msg"
fi
