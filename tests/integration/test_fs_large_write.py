"""A large sequential write through a relay mount on a durable 4-replica cluster (fsync on, four replicas
sharing one disk): it must complete without a single view change, and every byte must read back.

The regression this guards (tests/integration/POSIX_FINDINGS.md #14): one large write set off a view-change
storm. The body of an 8 MiB batch was still in transit to a slow replica when its PREPAREs and COMMITs
arrived, so it fetched the body from every peer at once (again every 40 ms), STATUS answers re-sent megabytes
to it every interval, connections overflowed and were dropped, and a checkpoint that hashed and synced a
gigabyte on the event loop stalled the primary long enough for its backups to suspect it. 64 MiB took 441 s
and the replicas grew to several GiB. The write crosses a checkpoint (128 batches of at most 2 MiB)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from harness.mount import Mount
from harness.relay import Relay, short_dir

pytestmark = pytest.mark.fuse

TOTAL_BYTES = 320 << 20   # > 128 batches of 2 MiB: the replicas take a checkpoint in the middle
CHUNK_BYTES = 1 << 20


def chunk(i: int) -> bytes:
    """Distinct, reproducible contents per MiB (a misplaced or lost chunk changes the digest)."""
    seed = hashlib.sha256(i.to_bytes(8, "little")).digest()
    return seed * (CHUNK_BYTES // len(seed))


def test_large_write_completes_without_view_changes_and_reads_back(cluster, bftfs_bin, tmp_path):
    c = cluster(service="fs", replica_args=["--shim"])   # durable: the replicas fdatasync their logs
    relay = Relay(bftfs_bin, c, short_dir(tmp_path)).start()
    top = Path(tempfile.mkdtemp(prefix="bftfs-mnt-"))
    m = Mount(bftfs_bin, top / "m", tmp_path / "m.log", ["--relay", str(relay.sock)])
    try:
        m.start()
        path = m.mountpoint / "big"
        want = hashlib.sha256()
        with open(path, "wb") as f:
            for i in range(TOTAL_BYTES // CHUNK_BYTES):
                data = chunk(i)
                f.write(data)
                want.update(data)
            f.flush()
            os.fsync(f.fileno())
        assert path.stat().st_size == TOTAL_BYTES
        got = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(4 << 20):
                got.update(block)
        assert got.hexdigest() == want.hexdigest()
        statuses = [r.status() for r in c.replicas]
        assert all(s is not None for s in statuses)
        views = [s["view"] for s in statuses]
        started = [s["stats"]["view_changes_started"] for s in statuses]
        assert views == [0] * c.n and started == [0] * c.n, (
            f"views {views}, view changes started {started}\n" + "\n".join(r.log_tail() for r in c.replicas))
        assert max(s["stable_checkpoint"] for s in statuses) >= 128
    finally:
        code = m.stop()
        relay.daemon.stop()
        shutil.rmtree(top, ignore_errors=True)
    assert code == 0, m.log_text()
    assert not m.error_lines(), m.log_text()
