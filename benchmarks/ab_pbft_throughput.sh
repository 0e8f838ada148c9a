#!/bin/bash
# Interleaved A/B of PBFT closed-loop throughput: two configurations (binary + replica options) alternate on
# fresh 4-replica clusters, ROUNDS times, K closed-loop clients for S seconds each. On a machine shared with
# compiles only interleaved comparisons mean anything. Prints one line per run.
#   A_BIN/B_BIN    bftfs binaries (default: both this worktree's build)
#   A_ARGS/B_ARGS  extra `cluster start` options (e.g. "--batch-window 4")
#   CLIENTS (32), DURATION_S (3), ROUNDS (3), PORT (7600)
here=$(cd "$(dirname "$0")/.." && pwd)
A_BIN=${A_BIN:-$here/build/cli/bftfs}; B_BIN=${B_BIN:-$here/build/cli/bftfs}
CLIENTS=${CLIENTS:-32}; DURATION_S=${DURATION_S:-3}; ROUNDS=${ROUNDS:-3}; PORT=${PORT:-7600}
dir=$(mktemp -d /tmp/ab-tput.XXXXXX); trap 'rm -rf "$dir"' EXIT
for round in $(seq 1 "$ROUNDS"); do
  for which in A B; do
    if [ $which = A ]; then bin=$A_BIN; args=$A_ARGS; else bin=$B_BIN; args=$B_ARGS; fi
    rm -rf "$dir/c"
    # shellcheck disable=SC2086
    $bin cluster start --dir "$dir/c" --f 1 --base-port "$PORT" --service counter --clients $((CLIENTS + 8)) $args >/dev/null 2>&1
    $bin counter --config "$dir/c/cluster.conf" --id 4 --requests 50 --warmup 0 --json >/dev/null 2>&1
    r=$(nice -n -10 "$bin" counter --config "$dir/c/cluster.conf" --id 5 --clients "$CLIENTS" --duration-s "$DURATION_S" \
          --warmup-s 0.5 --json 2>/dev/null |
        python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d['ops_per_s']), round(d['p50_us']))")
    s=$(python3 -c "
import json
d=json.load(open('$dir/c/r1/status.json'))
st,l=d['stats'],d['log']
print('batch %.1f syncs %d sync_us %.0f' % (st['requests_executed']/max(1,st['batches_committed']), l['wal_syncs'], l['wal_sync_us_avg']))" 2>/dev/null)
    echo "round $round $which: ops_per_s p50_us = $r | r1: $s"
    $bin cluster stop --dir "$dir/c" >/dev/null 2>&1
  done
done
