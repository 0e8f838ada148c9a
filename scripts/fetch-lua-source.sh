#!/usr/bin/env bash
# Fetches the C source tree the file-system benchmarks build (benchmarks/bench_fs.py, the Andrew-style
# benchmark's phases 2-5): Lua 5.4 from Debian's source package, unpacked into a cache directory.
#
#   $BFTFS_SRC_CACHE/lua5.4/lua      the upstream tree as Debian ships it (the .orig tarball of the source
#                                    package lua5.4, signed through the Sources index); Debian's own patches are
#                                    NOT applied: they switch the build to libtool, and the benchmark compiles
#                                    with Lua's own makefile (`make linux`)
#   $BFTFS_SRC_CACHE/lua5.4/SOURCE   what was fetched: package, version, orig tarball, its sha256
#
# The system's apt sources, lists and status are not touched: like scripts/install-criu.sh, apt runs on a
# private state in a temporary directory with one deb-src line for this release (from /etc/os-release) on the
# system's own Debian mirror. Idempotent: exits at once when the tree and SOURCE are present.
# Environment: BFTFS_SRC_CACHE (default /opt/bftfs/src), BFTFS_SRC_FORCE=1 fetches again.
set -euo pipefail

CACHE=${BFTFS_SRC_CACHE:-/opt/bftfs/src}/lua5.4
PACKAGE=lua5.4

say() { printf 'lua-source: %s\n' "$*"; }
die() { printf 'lua-source: ERROR: %s\n' "$*" >&2; exit 1; }

if [[ ${BFTFS_SRC_FORCE:-0} != 1 && -f $CACHE/SOURCE && -f $CACHE/lua/src/lua.c && -f $CACHE/lua/Makefile ]]; then
  say "$(awk '$1 == "version" {print $2}' "$CACHE/SOURCE") already in $CACHE/lua"
  exit 0
fi

command -v tar >/dev/null || die "tar not found"

WORK=$(mktemp -d /tmp/bftfs-src-apt.XXXXXX)
STAGE=""
cleanup() {
  rm -rf "$WORK"
  if [[ -n $STAGE ]]; then rm -rf "$STAGE"; fi
}
trap cleanup EXIT
# shellcheck source=scripts/debian-source.sh
. "$(dirname "${BASH_SOURCE[0]}")/debian-source.sh"
debian_orig_fetch "$PACKAGE" "$WORK"
orig=$ORIG
version=$ORIG_VERSION
SUITE=$ORIG_SUITE

mkdir -p "$(dirname "$CACHE")"
STAGE=$(mktemp -d "$CACHE.new.XXXXXX")
mkdir "$STAGE/unpack"
tar -xf "$orig" -C "$STAGE/unpack" --no-same-owner
tops=("$STAGE"/unpack/*)
[[ ${#tops[@]} -eq 1 && -d ${tops[0]} ]] || die "$(basename "$orig") does not hold exactly one top directory"
mv "${tops[0]}" "$STAGE/lua"
rmdir "$STAGE/unpack"
[[ -f $STAGE/lua/src/lua.c && -f $STAGE/lua/Makefile ]] || die "$(basename "$orig") is not a Lua source tree"
{
  echo "package $PACKAGE"
  echo "version $version"
  echo "suite $SUITE"
  echo "orig $(basename "$orig")"
  echo "sha256 $(sha256sum "$orig" | awk '{print $1}')"
  echo "files $(find "$STAGE/lua" -type f | wc -l)"
  echo "bytes $(find "$STAGE/lua" -type f -printf '%s\n' | awk '{s += $1} END {print s}')"
} >"$STAGE/SOURCE"
chmod -R a+rX "$STAGE"
rm -rf "$CACHE"
mv "$STAGE" "$CACHE"
STAGE=""
say "$PACKAGE $version unpacked into $CACHE/lua ($(awk '$1 == "files" {print $2}' "$CACHE/SOURCE") files)"
