# Sourced by scripts that fetch Debian packages without touching the system's apt configuration
# (install-criu.sh: trixie's CRIU; debian-source.sh: the source packages lua5.4 and apache2). Needs `die` defined.
#
# private_apt_setup WORKDIR SOURCES_LINE_SUFFIX
#   Writes WORKDIR/sources.list with "SOURCES_LINE_SUFFIX" completed as "<type> [signed-by=...] MIRROR <suffix>"
#   where the caller passes the type and suite, e.g. `private_apt_setup "$WORK" deb trixie main`, and sets the
#   APT_OPTS array that points apt-get at WORKDIR only. MIRROR is the system's own Debian mirror (deb822 or
#   one-line format, never the security archive), so a local mirror or proxy setup applies.
private_apt_setup() {
  local work=$1 type=$2
  shift 2
  mkdir -p "$work/lists/partial" "$work/archives/partial" "$work/parts"
  MIRROR=""
  if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    MIRROR=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [[ -z $MIRROR && -f /etc/apt/sources.list ]]; then
    MIRROR=$(awk '$1=="deb" && $0 ~ /debian/ && $0 !~ /security/ {for (i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list)
  fi
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
  local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  [[ -f $keyring ]] || die "$keyring missing (package debian-archive-keyring)"
  echo "$type [signed-by=$keyring] $MIRROR $*" >"$work/sources.list"
  APT_OPTS=(
    -o "Dir::Etc::sourcelist=$work/sources.list"
    -o "Dir::Etc::sourceparts=$work/parts"
    -o "Dir::Etc::preferences=/dev/null"
    -o "Dir::Etc::preferencesparts=$work/parts"
    -o "Dir::State::Lists=$work/lists"
    -o "Dir::Cache::archives=$work/archives"
    -o "Dir::Cache::pkgcache="
    -o "Dir::Cache::srcpkgcache="
    -o "Dir::State::status=/dev/null"
    -o "APT::Sandbox::User=root"
    -o "Acquire::Languages=none"
  )
}
