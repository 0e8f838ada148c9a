#!/usr/bin/env bash
# Fetches the tarball that `make bench-spec-run` unpacks into a mount (benchmarks/bench_spec_run.py, the untar
# measurement of docs/SPECULATION.md §15): Apache httpd 2.4's upstream source, from Debian's source package.
#
#   $BFTFS_SRC_CACHE/httpd2.4/<orig tarball>   the .orig tarball of the source package apache2, as Debian ships
#                                               it (checked by apt against the signed Sources index), kept packed:
#                                               unpacking it is what the benchmark measures
#   $BFTFS_SRC_CACHE/httpd2.4/SOURCE            what was fetched: package, version, suite, orig tarball, its
#                                               sha256, and the files, directories and bytes it unpacks to
#
# The system's apt sources, lists and status are not touched (scripts/debian-source.sh). Idempotent: exits at
# once when the tarball named in SOURCE is present and its sha256 matches SOURCE.
# Environment: BFTFS_SRC_CACHE (default /opt/bftfs/src), BFTFS_SRC_FORCE=1 fetches again.
set -euo pipefail

CACHE=${BFTFS_SRC_CACHE:-/opt/bftfs/src}/httpd2.4
PACKAGE=apache2

say() { printf 'httpd-source: %s\n' "$*"; }
die() { printf 'httpd-source: ERROR: %s\n' "$*" >&2; exit 1; }

field() { awk -v k="$1" '$1 == k {print $2}' "$CACHE/SOURCE"; }

if [[ ${BFTFS_SRC_FORCE:-0} != 1 && -f $CACHE/SOURCE && -n $(field orig) && -f $CACHE/$(field orig) ]]; then
  if [[ $(sha256sum "$CACHE/$(field orig)" | awk '{print $1}') == "$(field sha256)" ]]; then
    say "$(field version) already in $CACHE/$(field orig) ($(field files) files)"
    exit 0
  fi
  say "$CACHE/$(field orig) does not match the sha256 in SOURCE: fetching again"
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

# Count what the tarball unpacks to (the benchmark checks the tree on the mount against these numbers).
mkdir "$WORK/unpack"
tar -xf "$ORIG" -C "$WORK/unpack" --no-same-owner
tops=("$WORK"/unpack/*)
[[ ${#tops[@]} -eq 1 && -d ${tops[0]} ]] || die "$(basename "$ORIG") does not hold exactly one top directory"
[[ -f ${tops[0]}/server/main.c && -f ${tops[0]}/include/ap_release.h ]] \
  || die "$(basename "$ORIG") is not an Apache httpd source tree"
grep -q '#define AP_SERVER_MAJORVERSION_NUMBER 2' "${tops[0]}/include/ap_release.h" \
  && grep -q '#define AP_SERVER_MINORVERSION_NUMBER 4' "${tops[0]}/include/ap_release.h" \
  || die "$(basename "$ORIG") is not httpd 2.4"

mkdir -p "$(dirname "$CACHE")"
STAGE=$(mktemp -d "$CACHE.new.XXXXXX")
cp "$ORIG" "$STAGE/"
{
  echo "package $PACKAGE"
  echo "version $ORIG_VERSION"
  echo "suite $ORIG_SUITE"
  echo "orig $(basename "$ORIG")"
  echo "sha256 $(sha256sum "$ORIG" | awk '{print $1}')"
  echo "top $(basename "${tops[0]}")"
  echo "files $(find "${tops[0]}" -type f | wc -l)"
  echo "dirs $(find "${tops[0]}" -type d | wc -l)"
  echo "symlinks $(find "${tops[0]}" -type l | wc -l)"
  echo "bytes $(find "${tops[0]}" -type f -printf '%s\n' | awk '{s += $1} END {print s}')"
} >"$STAGE/SOURCE"
chmod -R a+rX "$STAGE"
rm -rf "$CACHE"
mv "$STAGE" "$CACHE"
STAGE=""
say "$PACKAGE $ORIG_VERSION: $(basename "$ORIG") in $CACHE ($(field files) files)"
