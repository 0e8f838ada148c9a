"""The counter service on a real 4-replica cluster (f = 1) on loopback: increments are counted exactly once, in
order, across clients."""

from __future__ import annotations

from harness.cluster import wait_converged


def test_sequential_increments_from_several_clients_return_consecutive_values(cluster):
    c = cluster(clients=24)
    values = []
    # One increment per run, alternating between client ids: the counter is shared, so the values the clients
    # see must be 1, 2, 3, ... with no gap and no repeat.
    for k in range(12):
        r = c.counter(client_id=c.client_ids[k % 3], requests=1, extra=["--warmup", "0"], timeout_s=60)
        assert r["requests"] == 1
        values.append(r["final_value"])
    assert values == list(range(1, 13)), f"values seen by successive increments: {values}"

    # A longer sequential run: every one of its increments is counted exactly once.
    n = 300
    r = c.counter(client_id=c.client_ids[5], requests=n, extra=["--warmup", "0"], timeout_s=120)
    assert r["resyncs"] == 0
    assert r["final_value"] == 12 + n

    # All four replicas executed everything (the fourth may lag behind the quorum, but catches up). The 312
    # increments were strictly sequential, so each was in a batch of its own: at least 312 sequence numbers.
    wait_converged(c, range(c.n), 20, above=12 + n - 1)


def test_closed_loop_clients_increment_a_shared_counter_without_loss(cluster):
    c = cluster(clients=24)
    r = c.counter(client_id=c.client_ids[0], clients=8, duration_s=1.5, extra=["--warmup-s", "0"], timeout_s=120)
    assert r["ops"] > 0
    assert r["resyncs"] == 0
    # Every completed increment of the closed loop is in the counter: the next increment sees ops + 1 at least
    # (increments still in flight when the loop stopped may have been counted too, up to one per client).
    after = c.counter(client_id=c.client_ids[10], requests=1, extra=["--warmup", "0"], timeout_s=60)
    assert r["ops"] + 1 <= after["final_value"] <= r["ops"] + 8 + 1
