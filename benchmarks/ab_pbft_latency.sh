#!/bin/bash
# Usage: build the old commit into /work/wt-old/build (git worktree add --detach /work/wt-old <commit>; cmake; ninja bftfs),
# then run this; it prints one line per run. Used for bench-results/wal-ab.txt.
# A/B: sequential 2000 increments, PBFT durable and --no-fsync, old vs new binary, alternating, fresh clusters.
OLD=${OLD:-/work/wt-old/build/cli/bftfs}; NEW=${NEW:-$(dirname "$0")/../build/cli/bftfs}
for round in 1 2 3; do
  for mode in durable nofsync; do
    for which in old new; do
      B=$OLD; [ $which = new ] && B=$NEW
      extra=""; [ $mode = nofsync ] && extra="--no-fsync"
      rm -rf /tmp/ab; $B cluster start --dir /tmp/ab --f 1 --base-port 7600 --service counter $extra >/dev/null 2>&1
      $B counter --config /tmp/ab/cluster.conf --id 4 --requests 100 --warmup 0 --json >/dev/null 2>&1
      r=$(nice -n -10 $B counter --config /tmp/ab/cluster.conf --id 5 --requests 2000 --warmup 10 --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d['p50_us']), round(d['total_ms']))")
      echo "round $round $mode $which: p50_us total_ms = $r"
      $B cluster stop --dir /tmp/ab >/dev/null 2>&1
    done
  done
done
