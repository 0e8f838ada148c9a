"""Four replicas on four "hosts" (network namespaces with their own addresses, joined by veth pairs and a
bridge; harness.netns.NetnsLab) and the client on a fifth. One replica's link goes down: the other three carry on;
the link comes back: the cut-off replica catches up with what it missed."""

from __future__ import annotations

import pytest

from harness.cluster import last_executed, status_value, wait_caught_up, wait_converged

pytestmark = pytest.mark.netns


def test_cluster_across_namespaces_survives_a_cut_off_replica_which_then_catches_up(cluster, netns):
    lab = netns(5)  # hosts 0..3: replicas; host 4: the client
    c = cluster(clients=8, lab=lab)
    client_host = lab.hosts[4]
    assert [a for a, _ in c.addresses] == lab.addresses[:4]

    r = c.counter(client_id=c.client_ids[0], requests=20, extra=["--warmup", "0"], prefix=client_host.prefix,
                  timeout_s=60)
    assert r["final_value"] == 20

    cut = 3  # a backup in view 0
    assert status_value(c.status(0), "primary") == 0
    before_cut = wait_converged(c, range(c.n), 20)  # all four executed the first 20 requests
    with lab.isolate(lab.hosts[cut]):
        # Enough sequential requests (one batch each) to move past the log window (2 x 128 checkpoint interval
        # by default), so catching up may need a checkpoint and state transfer rather than only the log.
        n = 300
        r = c.counter(client_id=c.client_ids[1], requests=n, extra=["--warmup", "0"], prefix=client_host.prefix,
                      timeout_s=120)
        assert r["final_value"] == 20 + n
        others = [i for i in range(c.n) if i != cut]
        target = wait_converged(c, others, 20, above=before_cut)
        assert last_executed(c, cut) == before_cut, "the cut-off replica kept executing"
        assert c.replicas[cut].alive()

    wait_caught_up(c, [cut], target, 30, f"replica {cut} to catch up after its link came back")
    # And it takes part again: new requests are executed by all four.
    c.counter(client_id=c.client_ids[2], requests=10, extra=["--warmup", "0"], prefix=client_host.prefix,
              timeout_s=60)
    wait_converged(c, range(c.n), 20, above=target)
