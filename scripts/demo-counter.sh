#!/usr/bin/env bash
# `make demo-counter`: the replication engine on its own, with the counter service (`make demo` is the file system).
#
#   1. `bftfs keygen` a 4-replica (f=1) cluster into a fresh directory under /tmp, on a random free port range
#   2. start the 4 replicas with the counter service, wait until each reports ready (status.json)
#   3. run the counter client against the BFT cluster, then stop the cluster
#   4. the same with PBFT-CS: fresh replicas with --shim --early-replies, and the speculating client (--spec),
#      which sends each increment on the primary's early reply and checks that every increment counted once
#   5. start the unreplicated NO-REP server with the same service, run the same client against it
#   6. print the three results side by side
# Nothing is left running: an EXIT trap stops every process this script started (TERM, then KILL) and removes
# the directory (BFTFS_DEMO_KEEP=1 keeps it, with the daemons' logs).
#
# Environment: BFTFS_BUILD (build directory, default ./build), DEMO_REQUESTS (default 2000),
# DEMO_READY_TIMEOUT_S (default 30).
#
# Readiness follows runtime/status_file.h: each `bftfs replica` / `bftfs norep` writes <data dir>/status.json
# (replaced atomically); a daemon is ready when that file names its pid and says "running": true.
# `bftfs counter --json` prints one JSON object with its measurements.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BFTFS_BUILD:-$ROOT/build}
BFTFS=$BUILD/cli/bftfs
REQUESTS=${DEMO_REQUESTS:-2000}
READY_TIMEOUT_S=${DEMO_READY_TIMEOUT_S:-30}
F=1
N=$((3 * F + 1))

say() { printf 'demo: %s\n' "$*"; }
die() { printf 'demo: ERROR: %s\n' "$*" >&2; exit 1; }

[[ -x $BFTFS ]] || die "$BFTFS is not built (run: make)"
command -v python3 >/dev/null || die "python3 is required"

DIR=$(mktemp -d /tmp/bftfs-demo.XXXXXX)
PIDS=()

stop_pids() {  # TERM every started process, wait up to 5 s, then KILL what is left
  local pid deadline
  [[ ${#PIDS[@]} -gt 0 ]] || return 0
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  deadline=$((SECONDS + 5))
  for pid in "${PIDS[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [[ $SECONDS -lt $deadline ]]; do sleep 0.05; done
    if kill -0 "$pid" 2>/dev/null; then
      say "pid $pid did not stop on TERM; killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
  done
  PIDS=()
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n ${CLIENT_PID:-} ]]; then PIDS+=("$CLIENT_PID"); fi
  stop_pids
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

# ---- a free port range: N replica ports from a random base (TCP and UDP both unused) ----
ports_free() {  # base count
  local used p
  used=$(ss -Htuan 2>/dev/null | awk '{n=split($5, a, ":"); print a[n]}' | sort -u)
  for ((p = $1; p < $1 + $2; p++)); do
    grep -qx "$p" <<<"$used" && return 1
  done
  return 0
}
BASE_PORT=""
for _ in $(seq 1 50); do
  candidate=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
  if ports_free "$candidate" $((N + 1)); then BASE_PORT=$candidate; break; fi
done
[[ -n $BASE_PORT ]] || die "no free port range found"

# ---- readiness: poll status.json with a deadline, failing fast if the daemon died ----
wait_ready() {  # name pid status_file
  local name=$1 pid=$2 file=$3 deadline=$((SECONDS + READY_TIMEOUT_S))
  while true; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$DIR/$name.log" >&2 || true
      die "$name exited before becoming ready (log above)"
    fi
    if [[ -s $file ]] && python3 - "$file" "$pid" <<'EOF'; then return 0; fi
import json, sys
try:
    status = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit(1)
ok = isinstance(status, dict) and status.get("pid") == int(sys.argv[2]) and status.get("running") is True
sys.exit(0 if ok else 1)
EOF
    if [[ $SECONDS -ge $deadline ]]; then
      tail -n 20 "$DIR/$name.log" >&2 || true
      die "$name not ready after ${READY_TIMEOUT_S}s (no ready $file)"
    fi
    sleep 0.05
  done
}

start_daemon() {  # name data_dir command...
  local name=$1 data=$2
  shift 2
  mkdir -p "$data"
  "$@" >"$DIR/$name.log" 2>&1 &
  PIDS+=($!)
  LAST_PID=$!
}

# The client runs in the background and the script waits for it: bash runs a trap only between commands, so a
# foreground client would delay Ctrl-C / TERM handling (and the cleanup) until it finished by itself.
CLIENT_PID=""
run_counter() {  # output_json extra_args...
  local out=$1 rc=0
  shift
  "$BFTFS" counter --config "$DIR/cluster.conf" --id "$CLIENT_ID" --requests "$REQUESTS" --json "$@" \
    >"$out" 2>"$out.err" &
  CLIENT_PID=$!
  wait "$CLIENT_PID" || rc=$?
  CLIENT_PID=""
  if [[ $rc -ne 0 ]]; then
    cat "$out.err" >&2
    die "bftfs counter $* failed (exit $rc)"
  fi
}

say "cluster directory $DIR, ports $BASE_PORT..$((BASE_PORT + N - 1))"
"$BFTFS" keygen --dir "$DIR" --f "$F" --clients 16 --hosts 127.0.0.1 --base-port "$BASE_PORT" >"$DIR/keygen.log" 2>&1 \
  || { cat "$DIR/keygen.log" >&2; die "bftfs keygen failed"; }
[[ -f $DIR/cluster.conf ]] || die "keygen wrote no $DIR/cluster.conf"
CLIENT_ID=$(awk '$1 == "client" {print $2; exit}' "$DIR/cluster.conf")
[[ -n $CLIENT_ID ]] || die "no client in $DIR/cluster.conf"

# Starts the N replicas named PREFIX-<i> (data in $DIR/PREFIX-<i>) with the counter service and the extra
# replica options given, and waits until each is ready.
start_replicas() {  # prefix extra_args...
  local prefix=$1 i
  shift
  for ((i = 0; i < N; i++)); do
    start_daemon "$prefix-$i" "$DIR/$prefix-$i" \
      "$BFTFS" replica --config "$DIR/cluster.conf" --id "$i" --data "$DIR/$prefix-$i" --service counter "$@"
    REPLICA_PIDS[i]=$LAST_PID
  done
  for ((i = 0; i < N; i++)); do
    wait_ready "$prefix-$i" "${REPLICA_PIDS[i]}" "$DIR/$prefix-$i/status.json"
  done
}

# ---- BFT: 4 replicas ----
start_replicas replica
say "$N replicas ready; running $REQUESTS counter increments (client $CLIENT_ID)"
run_counter "$DIR/bft.json"
stop_pids

# ---- PBFT-CS: the same cluster with early replies and the shim, a speculating client ----
start_replicas cs-replica --shim --early-replies
say "$N PBFT-CS replicas ready; running $REQUESTS speculative counter increments"
run_counter "$DIR/pbftcs.json" --spec
stop_pids

# ---- NO-REP: one unreplicated server, same service, same client ----
start_daemon norep "$DIR/norep" "$BFTFS" norep --config "$DIR/cluster.conf" --data "$DIR/norep" --service counter
wait_ready norep "$LAST_PID" "$DIR/norep/status.json"
say "NO-REP ready; running $REQUESTS counter increments"
run_counter "$DIR/norep.json" --norep
stop_pids

# ---- side by side ----
python3 - "$DIR/bft.json" "$DIR/pbftcs.json" "$DIR/norep.json" "$N" "$F" <<'EOF'
import json, sys

def load(path):
    text = open(path).read().strip()
    try:
        return json.loads(text)
    except ValueError:  # tolerate log lines before the JSON object: take the last line that parses
        for line in reversed(text.splitlines()):
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)
        raise SystemExit(f"demo: no JSON object in {path}")

bft, cs, norep = load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[3])
n, f = sys.argv[4], sys.argv[5]

def flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out

bft, cs, norep = flat(bft), flat(cs), flat(norep)
for d in (bft, cs, norep):  # a sequential run reports its duration; its throughput follows from it
    if "ops_per_s" not in d and isinstance(d.get("requests"), int) and d.get("total_ms"):
        d["ops_per_s"] = d["requests"] / (d["total_ms"] / 1e3)
keys = list(bft) + [k for k in cs if k not in bft] + [k for k in norep if k not in bft and k not in cs]

def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)

head = ("", f"PBFT (n={n}, f={f})", "PBFT-CS", "NO-REP")
rows = [(k, fmt(bft.get(k)), fmt(cs.get(k)), fmt(norep.get(k))) for k in keys]
widths = [max(len(r[c]) for r in rows + [head]) for c in range(4)]
print()
print("  ".join(f"{head[c]:<{widths[c]}}" if c == 0 else f"{head[c]:>{widths[c]}}" for c in range(4)))
print("  ".join("-" * w for w in widths))
for r in rows:
    print("  ".join(f"{r[c]:<{widths[c]}}" if c == 0 else f"{r[c]:>{widths[c]}}" for c in range(4)))
# The cost of replication, and what speculation wins back, for the figures both sides report.
ratios = []
for name, d in (("PBFT", bft), ("PBFT-CS", cs)):
    for k in ("total_ms", "ops_per_s"):
        a, b = d.get(k), norep.get(k)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
            ratios.append(f"{k} {name}/NO-REP = {a / b:.3g}x")
a, b = cs.get("total_ms"), bft.get("total_ms")
if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
    ratios.append(f"total_ms PBFT-CS/PBFT = {a / b:.3g}x (the client speculates on the primary's early replies; "
                  f"counter moved by {cs.get('counter_delta')} for {cs.get('committed')} committed increments)")
if ratios:
    print()
    for r in ratios:
        print(r)
EOF
say "done; all processes stopped"
