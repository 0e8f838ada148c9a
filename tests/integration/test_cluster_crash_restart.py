"""Crashes of real replica processes: all four killed at once during a stream of increments, and the primary
killed under load. What was acknowledged must survive; the cluster must go on; a restarted replica rejoins."""

from __future__ import annotations

import time

from harness.cluster import last_executed, status_value, wait_caught_up, wait_converged
from harness.counter import CounterStream, LoadProcess
from harness.daemon import kill_all
from harness.waiting import wait_until

REQUESTS_PER_RUN = 5


def test_kill_all_replicas_during_increments_then_restart_keeps_every_acknowledged_increment(cluster):
    c = cluster(clients=120)
    stream_ids = c.client_ids[:100]
    probe_id = c.client_ids[-1]
    with CounterStream(c.bftfs, c.config, stream_ids, requests_per_run=REQUESTS_PER_RUN, cli_timeout_s=40,
                       deadline_s=90) as stream:
        stream.wait_acks(4, timeout_s=30)
        acked_before_crash = max(stream.acked_values())
        kill_all(c.replicas)  # kill -9 of the whole cluster; the client run in flight keeps retrying
        crashed_at = time.monotonic()
        for d in c.replicas:
            d.restart(wait_ready=False)  # same arguments, same data directories
        c.wait_ready()
        # Runs that start after the crash complete too: the restarted cluster serves.
        stream.wait_acks(3, timeout_s=60, after=crashed_at)
        stream.stop()

    runs = stream.snapshot()
    failed = [r for r in runs if not r.ok]
    assert not failed, f"counter runs failed across the crash: {stream.describe()}"
    acked = stream.acked_values()
    summary = [(r.client_id, round(r.ended - r.started, 2), r.result.get("final_value"), r.result.get("resyncs"))
               for r in runs]
    print(f"stream runs (id, seconds, value, resyncs): {summary}")
    probe = c.counter(client_id=probe_id, requests=1, extra=["--warmup", "0"], timeout_s=60)
    # Durability: no acknowledged increment was lost (the probe's own increment comes on top).
    assert probe["final_value"] > max(acked) >= acked_before_crash
    # Exactly once: every run completed, so the counter holds each of its increments once, plus one increment
    # per resync (a request executed before the crash whose reply was lost, reported to the client as such).
    expected = sum(r.requests + r.result.get("resyncs", 0) for r in runs) + 1
    assert probe["final_value"] == expected, f"runs: {[(r.client_id, r.result) for r in runs]}"

    # All replicas converge on the same executed prefix. Every increment was sequential (one client run at a
    # time), so each counted one had a batch of its own: at least final_value sequence numbers.
    wait_converged(c, range(c.n), 20, above=probe["final_value"] - 1)


def test_primary_killed_under_load_view_changes_and_restarted_replica_catches_up(cluster):
    c = cluster(clients=40)
    primary = status_value(c.status(0), "primary")
    assert primary == 0, f"a fresh cluster starts in view 0 with primary 0, status says {primary}"
    backups = [i for i in range(c.n) if i != primary]

    with LoadProcess(c.bftfs, c.config, c.client_ids[0], clients=4, duration_s=6, cli_timeout_s=30) as load:
        # Let the load run, then crash the primary in the middle of it.
        wait_until(lambda: (last_executed(c, primary) or 0) >= 20, 20, "the load to get 20 batches executed")
        c.kill(primary)
        killed_at_executed = max(last_executed(c, i) or 0 for i in backups)
        result = load.finish()
    print(f"load across the primary crash: {result}")
    # The closed loop ran to its end: requests kept completing after the primary died.
    assert result["ops"] > 0

    # The backups moved to a new view whose primary is alive, and execute new requests there.
    def new_view():
        views = [status_value(c.status(i), "view") for i in backups]
        return views if all(v is not None and v >= 1 and v % c.n != primary for v in views) else None
    wait_until(new_view, 20, "the backups to install a view with a live primary")
    # Something was executed after the primary was killed.
    before = wait_converged(c, backups, 20, above=killed_at_executed)
    r = c.counter(client_id=c.client_ids[10], requests=30, extra=["--warmup", "0"], timeout_s=60)
    assert r["resyncs"] == 0
    after = wait_converged(c, backups, 20, above=before)

    # The old primary restarts from its data directory and catches up with the others, then keeps up.
    c.restart(primary)
    wait_caught_up(c, [primary], after, 30, f"restarted replica {primary} to reach last_executed {after}")
    c.counter(client_id=c.client_ids[11], requests=20, extra=["--warmup", "0"], timeout_s=60)
    wait_converged(c, range(c.n), 20, above=after)  # the restarted replica executes new requests too
    views = {status_value(c.status(i), "view") for i in range(c.n)}
    assert len(views) == 1, f"replicas disagree on the view after the restart: {views}"
