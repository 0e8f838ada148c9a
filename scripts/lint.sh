#!/usr/bin/env bash
# `make lint`: the checks a reviewer would otherwise do by hand. Runs every check, then fails if any failed.
#   1. layers and purity (scripts/check_layers.py): includes, imports and links between folders follow what each
#      folder's README.md declares, with no cycle; the files declared pure use no libevent, sockets, threads,
#      clocks or ambient randomness (house style: a core is driven by messages, ticks and an injected PRNG)
#   2. shell scripts parse (bash -n)
#   3. pyflakes on every Python file (when pyflakes is installed; `make deps` installs it)
#   4. sizes (scripts/size_report.py --check): no source file over 1,000 lines and no production function over 70
#      unless a `size:` comment says why
#   5. the whole tree builds with -Werror (build-lint/, -DBFTFS_WERROR=ON)
# Environment: LINT_BUILD (default build-lint), JOBS (ninja -j), PYTHON (default python3),
# LINT_SKIP_BUILD=1 skips step 5 (for a quick pre-commit run).
#
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
LINT_BUILD=${LINT_BUILD:-build-lint}
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-}
failed=()

section() { printf '\n== lint: %s\n' "$*"; }

# ---- 1. layers and purity ----
section "layers (folder dependencies, cycles) and purity (scripts/check_layers.py)"
"$PYTHON" scripts/check_layers.py || failed+=(layers)

# ---- 2. shell syntax ----
section "shell scripts (bash -n)"
shell_bad=0
while IFS= read -r f; do
  if ! bash -n "$f"; then shell_bad=1; echo "  syntax error: $f"; fi
done < <( { find scripts -maxdepth 2 -type f \( -name '*.sh' -o -name 'bftfs-criu' \) 2>/dev/null; \
            [[ -f .ci/run ]] && echo .ci/run; } | sort -u)
if command -v shellcheck >/dev/null; then
  find scripts -maxdepth 2 -type f -name '*.sh' -print0 | xargs -0 -r shellcheck -S error .ci/run || shell_bad=1
fi
[[ $shell_bad -eq 0 ]] && echo "  ok" || failed+=(shell)

# ---- 3. pyflakes ----
section "pyflakes"
mapfile -t pyfiles < <(find . -name '*.py' -not -path './.git/*' -not -path './build*' -not -path '*/__pycache__/*' | sort)
if [[ ${#pyfiles[@]} -eq 0 ]]; then
  echo "  no Python files"
elif "$PYTHON" -c 'import pyflakes' 2>/dev/null; then
  if "$PYTHON" -m pyflakes "${pyfiles[@]}"; then
    echo "  ok (${#pyfiles[@]} files)"
  else
    failed+=(pyflakes)
  fi
else
  echo "  pyflakes is not installed for $PYTHON: skipped (run make deps)"
fi

# ---- 4. sizes ----
section "sizes (scripts/size_report.py --check)"
if "$PYTHON" -c 'import lizard' 2>/dev/null; then
  "$PYTHON" scripts/size_report.py --check || failed+=(sizes)
else
  echo "  lizard is not installed for $PYTHON: skipped (run make deps)"
fi

# ---- 5. -Werror build ----
if [[ ${LINT_SKIP_BUILD:-0} == 1 ]]; then
  section "-Werror build skipped (LINT_SKIP_BUILD=1)"
else
  section "-Werror build in $LINT_BUILD/"
  mkdir -p "$LINT_BUILD"
  if cmake -S . -B "$LINT_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBFTFS_WERROR=ON >"$LINT_BUILD/cmake.log" 2>&1 \
     && ninja -C "$LINT_BUILD" ${JOBS:+-j "$JOBS"}; then
    echo "  ok"
  else
    [[ -s $LINT_BUILD/cmake.log ]] && tail -n 30 "$LINT_BUILD/cmake.log"
    failed+=(werror-build)
  fi
fi

echo
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "lint: FAILED: ${failed[*]}"
  exit 1
fi
echo "lint: all checks passed"
