#!/usr/bin/env bash
# Installs everything bftfs needs to build, test, benchmark and demo on Debian 12 (`make deps`).
#
# Idempotent and fast when everything is present: apt is consulted only for packages that are missing (and
# `apt-get update` runs only then), pip only for requirements that are not satisfied, and install-criu.sh
# returns at once when its wrapper already reports CRIU 4.1.x.
#
# python3 may be pyenv's rather than Debian's, so Python packages go to whatever `python3` is, through
# `python3 -m pip`. Environment: BFTFS_SKIP_CRIU=1 skips the CRIU step.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
say() { printf 'deps: %s\n' "$*"; }
die() { printf 'deps: ERROR: %s\n' "$*" >&2; exit 1; }

# Required: the build (compilers, cmake/ninja, libsodium, libevent, Catch2 v2, CLI11 (option parsing), clang for fuzzing and
# sanitizers, libfuse3, protobuf-c headers for libcriu), runtime tools (fuse3, iproute2 for network namespaces),
# and pip for the Python tooling.
APT_REQUIRED=(
  build-essential cmake ninja-build pkg-config
  libsodium-dev libevent-dev catch2 libcli11-dev
  clang-14 libclang-rt-14-dev
  libfuse3-dev fuse3
  libprotobuf-c-dev
  iproute2 procps
  python3-pip
  ca-certificates debian-archive-keyring
)
# Optional: nice to have, never fails the install.
APT_OPTIONAL=(linux-perf ccache)

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then SUDO=(sudo); fi
fi

is_installed() {
  [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]
}

missing_of() {
  local p
  for p in "$@"; do is_installed "$p" || printf '%s\n' "$p"; done
}

APT_UPDATED=0
apt_update_once() {
  if [[ $APT_UPDATED -eq 0 ]]; then
    say "apt-get update"
    "${SUDO[@]}" apt-get -q update >/dev/null
    APT_UPDATED=1
  fi
}

apt_install() {
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get -q -y install --no-install-recommends "$@"
}

# ---- Debian packages ----
command -v dpkg-query >/dev/null || die "this script supports Debian (dpkg not found)"
mapfile -t missing < <(missing_of "${APT_REQUIRED[@]}")
if [[ ${#missing[@]} -gt 0 ]]; then
  if [[ $(id -u) -ne 0 && ${#SUDO[@]} -eq 0 ]]; then
    die "missing packages (${missing[*]}) and not root; run as root or install sudo"
  fi
  say "installing: ${missing[*]}"
  apt_update_once
  apt_install "${missing[@]}"
  mapfile -t still < <(missing_of "${APT_REQUIRED[@]}")
  [[ ${#still[@]} -eq 0 ]] || die "still missing after install: ${still[*]}"
fi
mapfile -t missing_opt < <(missing_of "${APT_OPTIONAL[@]}")
if [[ ${#missing_opt[@]} -gt 0 ]] && [[ $(id -u) -eq 0 || ${#SUDO[@]} -gt 0 ]]; then
  say "installing optional: ${missing_opt[*]}"
  if ! { apt_update_once && apt_install "${missing_opt[@]}"; } >/dev/null 2>&1; then
    say "optional packages not installed (continuing): ${missing_opt[*]}"
  fi
fi
say "Debian packages: ok"

# ---- Python packages (for whatever python3 is on PATH) ----
command -v python3 >/dev/null || die "python3 not found"
REQ="$ROOT/requirements.txt"
# Fast check without pip: every requirement importable at a satisfying version.
py_satisfied() {
  python3 - "$REQ" <<'EOF'
import re, sys
from importlib import metadata
def key(v):
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])
ok = True
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    m = re.match(r"^([A-Za-z0-9_.-]+)\s*(.*)$", line)
    name, spec = m.group(1), m.group(2)
    try:
        have = key(metadata.version(name))
    except metadata.PackageNotFoundError:
        ok = False
        continue
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        op, v = re.match(r"^(>=|<=|==|<|>|!=)\s*(.+)$", clause).groups()
        want = key(v)
        n = max(len(have), len(want))
        h = have + (0,) * (n - len(have)); w = want + (0,) * (n - len(want))
        if not {">=": h >= w, "<=": h <= w, "==": h == w, "<": h < w, ">": h > w, "!=": h != w}[op]:
            ok = False
sys.exit(0 if ok else 1)
EOF
}
if ! py_satisfied; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    say "bootstrapping pip for $(command -v python3)"
    python3 -m ensurepip --upgrade >/dev/null 2>&1 || die "python3 has no pip and ensurepip failed"
  fi
  PIP_ARGS=(-q install -r "$REQ")
  # Debian's own python3 is externally managed (PEP 668); these are development tools for this machine.
  if python3 -c 'import sys, sysconfig, os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) and sys.prefix == sys.base_prefix else 1)'; then
    PIP_ARGS+=(--break-system-packages)
  fi
  say "python3 -m pip ${PIP_ARGS[*]}"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip "${PIP_ARGS[@]}"
  py_satisfied || die "Python requirements still not satisfied after pip install"
fi
say "Python packages ($(command -v python3)): ok"

# ---- CRIU 4.1.1 (private prefix + wrapper) ----
if [[ ${BFTFS_SKIP_CRIU:-0} == 1 ]]; then
  say "skipping CRIU (BFTFS_SKIP_CRIU=1)"
else
  bash "$ROOT/scripts/install-criu.sh"
fi
# ---- the C source tree the file-system benchmarks build (Lua 5.4 from Debian's source package) ----
bash "$ROOT/scripts/fetch-lua-source.sh"
# ---- the tarball bench-spec-run unpacks (Apache httpd 2.4 from Debian's source package) ----
bash "$ROOT/scripts/fetch-httpd-source.sh"
say "done"
