#!/usr/bin/env bash
# `make lint`: the checks a reviewer would otherwise do by hand. Runs every check, then fails if any failed.
#   1. purity: protocol/, services/, shim/ and sim/ use no libevent, sockets, threads, clocks or ambient randomness
#      (house style: the core is driven by messages, ticks and an injected PRNG; one seed replays a run)
#   2. shell scripts parse (bash -n)
#   3. pyflakes on every Python file (when pyflakes is installed; `make deps` installs it)
#   4. the whole tree builds with -Werror (build-lint/, -DBFTFS_WERROR=ON)
# Environment: LINT_BUILD (default build-lint), JOBS (ninja -j), PYTHON (default python3),
# LINT_SKIP_BUILD=1 skips step 4 (for a quick pre-commit run).
#
# A line that must break the purity rule says why, on the same line: `// lint: allow-impure <reason>`.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
LINT_BUILD=${LINT_BUILD:-build-lint}
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-}
failed=()

section() { printf '\n== lint: %s\n' "$*"; }

# ---- 1. purity of the pure layers ----
section "purity of protocol/ services/ shim/ sim/"
if "$PYTHON" - protocol services shim sim <<'EOF'; then :; else failed+=(purity); fi
import os, re, sys

# Forbidden everywhere in the pure layers. Each entry: (regex on code with comments and strings removed, why).
RULES = [
    (r'#\s*include\s*[<"](event2/[^>"]*|event\.h)[>"]', "libevent belongs to the runtime (replica/)"),
    (r'#\s*include\s*[<"](sys/socket\.h|netinet/[^>"]*|arpa/inet\.h|netdb\.h|sys/un\.h|linux/(netlink|if_packet)\.h)[>"]',
     "sockets belong to the runtime (replica/)"),
    (r'#\s*include\s*<(thread|mutex|shared_mutex|condition_variable|future|semaphore|latch|barrier|stop_token|pthread\.h)>',
     "threads: the core is single-threaded and driven by its caller"),
    (r'#\s*include\s*<(chrono|ctime|time\.h|sys/time\.h)>', "clocks: time in the core is ticks"),
    (r'#\s*include\s*<(random)>', "randomness comes from the injected Prng (common/prng.h)"),
    (r'\bstd::(chrono|this_thread|thread|jthread|mutex|async|random_device|mt19937(_64)?|default_random_engine)\b',
     "threads, clocks and ambient randomness are not allowed here"),
    (r'(?<![\w.>:])(rand|srand|random|srandom|drand48|clock_gettime|gettimeofday|getrandom|arc4random|sleep|usleep|nanosleep)\s*\(',
     "ambient time, sleep or randomness"),
    (r'(?<![\w.>:])(std::)?time\s*\(\s*(nullptr|NULL|0|&)', "wall-clock time: time in the core is ticks"),
    (r'\brandombytes_\w+\s*\(', "libsodium randomness: the core takes keys and seeds from its caller"),
]
# The pure state machines (not the simulator, which owns a run's files and output) also do no file I/O.
RULES_NO_IO = [
    (r'#\s*include\s*<(fstream|filesystem|fcntl\.h|unistd\.h|sys/stat\.h|dirent\.h)>',
     "file I/O: protocol/, services/ and shim/ reach storage only through injected interfaces"),
    (r'(?<![\w.>:])(fopen|open|openat|fsync|fdatasync|opendir)\s*\(', "file I/O in a pure layer"),
]
ALLOW = re.compile(r'//\s*lint:\s*allow-impure\s+\S')

def strip(line, state):
    """Removes comments and string/char literals; `state` carries an open /* comment across lines."""
    out, i, n = [], 0, len(line)
    while i < n:
        if state["block"]:
            j = line.find("*/", i)
            if j < 0:
                return "".join(out)
            state["block"], i = False, j + 2
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["block"], i = True, i + 2
            continue
        if c in "\"'" and not (c == "'" and i > 0 and line[i - 1].isalnum()):  # skip 1'000 digit separators
            if c == '"' and line.lstrip().startswith("#") and "include" in line:
                out.append(line[i:])  # keep #include "x.h" intact
                break
            j = i + 1
            while j < n and line[j] != c:
                j += 2 if line[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)

problems = allowed = files = 0
for top in sys.argv[1:]:
    if not os.path.isdir(top):
        continue
    for dirpath, _, names in os.walk(top):
        for name in sorted(names):
            if not name.endswith((".h", ".hh", ".hpp", ".cc", ".cpp", ".c")):
                continue
            path = os.path.join(dirpath, name)
            files += 1
            rules = RULES + (RULES_NO_IO if top in ("protocol", "services", "shim") else [])
            state = {"block": False}
            with open(path, encoding="utf-8", errors="replace") as fh:
                for lineno, raw in enumerate(fh, 1):
                    code = strip(raw.rstrip("\n"), state)
                    for pattern, why in rules:
                        if re.search(pattern, code):
                            if ALLOW.search(raw):
                                allowed += 1
                                print(f"  allowed {path}:{lineno}: {raw.strip()}")
                            else:
                                problems += 1
                                print(f"  {path}:{lineno}: {why}\n      {raw.strip()}")
                            break
print(f"  {files} files checked, {problems} violations, {allowed} allowed by annotation")
sys.exit(1 if problems else 0)
EOF

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

# ---- 4. -Werror build ----
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
