"""Per-client order of pipelined requests across a kill -9 of every replica (docs/ARCHITECTURE.md, "Per-client
order of pipelined requests"; TOCS §5.1.4).

The speculating counter client (`bftfs counter --spec`) keeps up to --spec-window increments in flight, each
predicated on the first reply of the increment issued just before it (NSDI'09 §3.2). The replicas run the shim,
which turns an increment whose dependency it has not executed yet into a "dependency unknown" no-op, reported by
the client as a retry. So the client's replies tell whether the replicas kept its order: an increment executed
before the one issued ahead of it comes back as a retry. Killing every replica with a window of increments in
flight makes the client retransmit all of them, in any order, to replicas that lost every queued request.

What it shows and what it does not: it runs the order rule through the real transport, the version-2 wire
format and recovery from disk, with a pipelined client, and fails if any increment ran out of order. It did not
reproduce the reordering against replicas with the rule switched off (6 runs, windows 16 and 64, staggered
restarts): a restarted cluster changes views before it orders anything, and the new primary orders what it has
queued lowest id first, so the race needs a retransmission that arrives after the new view. The simulator shows
the bug deterministically (sim/FINDINGS.md F6, seeds 3 and 1 --scenario reorder-client).
"""

from __future__ import annotations

import subprocess

from harness.cluster import last_executed, wait_converged
from harness.counter import parse_json_output
from harness.daemon import kill_all
from harness.waiting import wait_until

PBFTCS = ["--shim", "--early-replies"]
REQUESTS = 4000
WINDOW = 16


def test_pipelined_increments_keep_their_order_across_a_kill_of_every_replica(cluster):
    c = cluster(clients=4, replica_args=PBFTCS)
    argv = [str(c.bftfs), "counter", "--config", str(c.config), "--id", str(c.client_ids[0]), "--json",
            "--spec", "--spec-window", str(WINDOW), "--requests", str(REQUESTS), "--warmup", "0",
            "--timeout-s", "60"]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_until(lambda: (last_executed(c, 1) or 0) > 50, 60, "the pipelining client to make progress")
        assert proc.poll() is None, "the client finished before the replicas could be killed: raise REQUESTS"
        kill_all(c.replicas)  # kill -9 of the whole cluster with a window of increments in flight
        for d in c.replicas:
            d.restart(wait_ready=False)  # same arguments, same data directories
        c.wait_ready()
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-4000:]
    r = parse_json_output(out)
    print(f"pipelined run across the kill: {r}")
    assert r["committed"] == REQUESTS
    assert r["counter_delta"] == REQUESTS
    assert r["violations"] == 0 and r["bad_tokens"] == 0
    # No increment ran before the one its client issued ahead of it (its dependency was always there).
    assert r["retries"] == 0, f"{r['retries']} increments executed out of their client's order"
    assert r["rollbacks"] == 0
    wait_converged(c, range(c.n), 30, above=0)
