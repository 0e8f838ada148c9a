# Sourced by the scripts that fetch an upstream source tarball from Debian's source packages
# (fetch-lua-source.sh, fetch-httpd-source.sh). Needs `say` and `die` defined.
#
# debian_orig_fetch PACKAGE WORKDIR
#   Downloads the .orig tarball of source package PACKAGE for this release (from /etc/os-release) into
#   WORKDIR/get and sets ORIG (its path), ORIG_VERSION (the package version) and ORIG_SUITE. apt runs on a
#   private state in WORKDIR (private-apt.sh) with one deb-src line on the system's own Debian mirror, so the
#   system's apt sources, lists and status are not touched, and apt checks every file it downloads against the
#   signed Sources index (--download-only: nothing is unpacked or built).
debian_orig_fetch() {
  local package=$1 work=$2
  command -v apt-get >/dev/null || die "apt-get not found (Debian is required)"
  ORIG_SUITE=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
  [[ -n $ORIG_SUITE ]] || ORIG_SUITE=bookworm
  mkdir -p "$work/get"
  # shellcheck source=scripts/private-apt.sh
  . "$(dirname "${BASH_SOURCE[0]}")/private-apt.sh"
  private_apt_setup "$work" deb-src "$ORIG_SUITE" main
  say "fetching the $ORIG_SUITE source index from $MIRROR (private apt state in $work)"
  apt-get "${APT_OPTS[@]}" -q update >"$work/update.log" 2>&1 \
    || { cat "$work/update.log" >&2; die "apt-get update (deb-src) failed"; }
  ORIG_VERSION=$(apt-cache "${APT_OPTS[@]}" showsrc "$package" 2>/dev/null | awk '/^Version:/{print $2; exit}')
  [[ -n $ORIG_VERSION ]] || die "source package $package not found in $ORIG_SUITE"
  (cd "$work/get" && apt-get "${APT_OPTS[@]}" -q source --download-only "$package=$ORIG_VERSION") \
    >"$work/source.log" 2>&1 || { cat "$work/source.log" >&2; die "apt-get source $package=$ORIG_VERSION failed"; }
  local origs=() f
  shopt -s nullglob
  for f in "$work"/get/"${package}"_*.orig.tar.*; do
    # Upstream's detached signature (.asc) may come along; apt has already checked the tarball itself.
    [[ $f == *.asc ]] || origs+=("$f")
  done
  shopt -u nullglob
  [[ ${#origs[@]} -eq 1 ]] || die "expected one .orig tarball for $package, found ${#origs[@]}"
  ORIG=${origs[0]}
}
