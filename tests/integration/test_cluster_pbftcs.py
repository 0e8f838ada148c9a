"""PBFT-CS on a real 4-replica cluster (f = 1): the primary's early replies, the shim's predicates, and the
speculating counter client (`bftfs counter --spec`), which checks itself that no increment relying on a wrong
prediction executed and that the counter moved by exactly the increments that committed (it exits non-zero
otherwise). NSDI'09 §3.1, §3.2, §3.4."""

from __future__ import annotations

import subprocess

from harness.cluster import wait_converged
from harness.counter import parse_json_output
from harness.waiting import wait_until

PBFTCS = ["--shim", "--early-replies"]


def test_speculating_client_pipelines_on_early_replies_and_every_increment_counts(cluster):
    c = cluster(clients=8, replica_args=PBFTCS)
    r = c.counter(client_id=c.client_ids[0], requests=600, extra=["--spec", "--warmup", "0"], timeout_s=120)
    assert r["committed"] == 600
    assert r["counter_delta"] == 600
    assert r["violations"] == 0 and r["bad_tokens"] == 0
    assert r["rollbacks"] == 0 and r["first_mismatches"] == 0
    # The client acted on the early replies (one per increment, plus the two reads around the run).
    assert r["first_delivered"] >= 600
    before = r["final_value"]
    # A client that does not speculate sees the same counter through the shim.
    plain = c.counter(client_id=c.client_ids[1], requests=50, extra=["--spec", "--shim", "--warmup", "0"],
                      timeout_s=120)
    assert plain["first_delivered"] == 0
    assert plain["final_value"] == before + 50
    wait_converged(c, range(c.n), 30, above=0)
    # The primary sent the early replies; status.json counts them.
    assert (c.status(0) or {}).get("stats", {}).get("early_replies", 0) >= 600


def test_lying_primary_costs_rollbacks_but_no_wrong_increment_executes(cluster):
    # The primary corrupts 5% of its early replies (a wrong token with a matching digest). Every increment the
    # client sent on a corrupted reply is predicated on it, so the replicas turn it, and everything after it in
    # the chain, into no-ops; the client rolls back and continues from the committed value.
    c = cluster(clients=8, replica_args=PBFTCS + ["--corrupt-early-replies", "0.05"])
    r = c.counter(client_id=c.client_ids[0], requests=400,
                  extra=["--spec", "--spec-failure-window", "0", "--warmup", "0"], timeout_s=180)
    assert r["committed"] == 400
    assert r["counter_delta"] == 400
    assert r["violations"] == 0 and r["bad_tokens"] == 0
    assert r["rollbacks"] > 0
    assert r["retries"] > 0  # increments sent on a lie came back as the shim's no-ops
    # With the §3.4 rule on (the default), the client stops trusting a primary that fails more than 1%.
    r = c.counter(client_id=c.client_ids[1], requests=300, extra=["--spec", "--warmup", "0"], timeout_s=180)
    assert r["counter_delta"] == 300 and r["violations"] == 0
    assert r["first_withheld_distrusted"] > 0


def test_primary_killed_while_a_speculating_client_runs(cluster):
    # Early executions at the primary that never committed die with it; the new view re-proposes what prepared
    # and the client's retransmissions carry the rest. The count must still be exact.
    c = cluster(clients=8, replica_args=PBFTCS)
    argv = [str(c.bftfs), "counter", "--config", str(c.config), "--id", str(c.client_ids[0]), "--json",
            "--spec", "--requests", "40000", "--warmup", "0", "--timeout-s", "60"]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_until(lambda: ((c.status(1) or {}).get("last_executed") or 0) > 20, 60,
                   "the speculating client to make progress")
        assert proc.poll() is None, "the client finished before the primary could be killed: raise --requests"
        c.kill(0)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-4000:]
    r = parse_json_output(out)
    assert r["committed"] == 40000
    assert r["counter_delta"] == 40000
    assert r["violations"] == 0 and r["bad_tokens"] == 0
    # The survivors moved to a new view and agree.
    wait_until(lambda: all(((c.status(i) or {}).get("view") or 0) >= 1 for i in (1, 2, 3)), 30, "a new view")
    wait_converged(c, (1, 2, 3), 30, above=0)
