"""Overload through `bftfs mount --relay` on a durable 4-replica cluster (issue 19, item 3: six O_APPEND
writers of 4-byte records once became millions of separate operations, stalled every other request of the
mount for minutes and set off hundreds of view changes).

- Several processes append small records to one file with O_APPEND while this test keeps calling stat,
  stat of a new name (a LOOKUP round trip) and statvfs on the mount: every record lands exactly once and whole
  (one write() call's bytes together: records of 7 to 207 bytes, each with its writer, sequence number and
  length, parsed back to back), each writer's records in its order; the probes complete while the writers
  still write; the records travel in few write ops (coalesced); and the primary keeps its view.
- An unmount while writes are in flight to a relay that does not answer says so in the mount's log, with
  progress, and completes the writes once the relay answers again."""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.mount import Mount
from harness.relay import Relay, relay_counters, short_dir
from harness.waiting import wait_until

pytestmark = pytest.mark.fuse

WRITERS = 4
RECORDS = 10000  # per writer

# One writer process: `RECORDS` records, one write() each: a 7-byte header (writer id, sequence number, body
# length) and a body of 0 to 200 bytes, every byte (writer + seq) & 0xff. A record split by another writer's
# bytes, or one landing twice or never, breaks the parse.
WRITER = r"""
import os, struct, sys
path, writer, records = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_WRONLY | os.O_APPEND)
for seq in range(records):
    size = (seq * 37 + writer * 11) % 201
    os.write(fd, struct.pack("<BIH", writer, seq, size) + bytes([(writer + seq) & 0xFF]) * size)
os.close(fd)
"""
HEADER = struct.Struct("<BIH")


def check_records(data: bytes, writers: int, records: int) -> None:
    """Every record exactly once and whole, each writer's in its order, nothing else in the file."""
    want = [0] * writers
    at = 0
    while at < len(data):
        writer, seq, size = HEADER.unpack_from(data, at)
        assert writer < writers and seq == want[writer], \
            f"at byte {at}: writer {writer} seq {seq}, expected seq {want[writer] if writer < writers else '?'}"
        assert size == (seq * 37 + writer * 11) % 201, f"at byte {at}: record of writer {writer} seq {seq} split"
        body = data[at + HEADER.size:at + HEADER.size + size]
        assert body == bytes([(writer + seq) & 0xFF]) * size, f"at byte {at}: body of writer {writer} seq {seq}"
        want[writer] += 1
        at += HEADER.size + size
    assert want == [records] * writers


@pytest.fixture
def relay_mount(cluster, bftfs_bin, tmp_path):
    """A durable 4-replica file-service cluster (the replicas fdatasync their logs), a relay and one mount."""
    c = cluster(service="fs", replica_args=["--shim"])
    relay = Relay(bftfs_bin, c, short_dir(tmp_path)).start()
    top = Path(tempfile.mkdtemp(prefix="bftfs-mnt-"))
    mounts: list[Mount] = []

    def mount(name: str) -> Mount:
        m = Mount(bftfs_bin, top / name, tmp_path / f"{name}.log", ["--relay", str(relay.sock)],
                  counters_file=tmp_path / f"{name}.status.json")
        mounts.append(m)
        return m.start()

    try:
        yield c, relay, mount
    finally:
        with_errors = []
        for m in mounts:
            code = m.stop()
            if code not in (0, None) or m.error_lines():
                with_errors.append(m.log_text())
        relay.daemon.stop()
        shutil.rmtree(top, ignore_errors=True)
    assert not with_errors, "\n".join(with_errors)


def test_small_appends_coalesce_land_once_in_order_while_stat_and_statfs_answer(relay_mount):
    c, relay, mount = relay_mount
    m = mount("m")
    log = m.mountpoint / "records.log"
    log.touch()
    probe = m.mountpoint / "probe"
    probe.write_bytes(b"probe")
    ops_write_before = relay_counters(relay.sock)["ops_write"]
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(log), str(w), str(RECORDS)])
               for w in range(WRITERS)]
    try:
        # Probe rounds (stat of a file, stat of a new name, statvfs) that returned while every writer was
        # still writing: none of them waited for the writers' backlog to drain.
        rounds_during_writes = 0
        i = 0
        while all(w.poll() is None for w in writers):
            os.stat(probe)
            with pytest.raises(FileNotFoundError):
                os.stat(m.mountpoint / f"absent-{i}")
            os.statvfs(m.mountpoint)
            if all(w.poll() is None for w in writers):
                rounds_during_writes += 1
            i += 1
        codes = [w.wait(timeout=600) for w in writers]
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
                w.wait()
    assert codes == [0] * WRITERS
    assert rounds_during_writes >= 3, f"only {rounds_during_writes} probe rounds returned while writers ran"
    check_records(log.read_bytes(), WRITERS, RECORDS)
    # Coalesced: the records went to the replicas in a few write ops per round of the write-behind, not one op
    # per record.
    ops_write = relay_counters(relay.sock)["ops_write"] - ops_write_before
    assert ops_write * 50 < WRITERS * RECORDS, f"{ops_write} write ops for {WRITERS * RECORDS} records"
    # A correct primary under this load keeps its view.
    statuses = [r.status() for r in c.replicas]
    assert all(s is not None for s in statuses)
    views = [s["view"] for s in statuses]
    started = [s["stats"]["view_changes_started"] for s in statuses]
    assert views == [0] * c.n and started == [0] * c.n, f"views {views}, view changes started {started}"


# A process that opens the file, says so, waits for a line on stdin, then appends 64 records of 4 KiB and
# exits without waiting for them (its close from do_exit is answered at once; the release that follows waits
# for the writes in the daemon).
EXITING_WRITER = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
print("open", flush=True)
sys.stdin.readline()
for i in range(64):
    os.write(fd, bytes([i]) * 4096)
os._exit(0)
"""


def test_unmount_with_writes_in_flight_reports_progress_and_completes_them(relay_mount):
    _, relay, mount = relay_mount
    m = mount("a")
    target = m.mountpoint / "late"
    target.touch()
    relay_pid = relay.daemon.pid
    assert relay_pid is not None
    writer = subprocess.Popen([sys.executable, "-c", EXITING_WRITER, str(target)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "open\n"  # opened while the relay answers (close-to-open)
        os.kill(relay_pid, signal.SIGSTOP)  # the relay (and so the cluster) answers nothing for now
        writer.communicate("go\n", timeout=60)
        assert writer.returncode == 0
        # `bftfs umount` returns once the daemon lets go of the mount point (2 s without the writes final).
        subprocess.run([str(m.bftfs), "umount", str(m.mountpoint)], capture_output=True, timeout=60)
        wait_until(lambda: "none became final" in m.log_text(), 30, "a progress line saying nothing moves")
        assert "unmount: waiting for" in m.log_text()
    finally:
        os.kill(relay_pid, signal.SIGCONT)
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert m.proc is not None
    assert m.proc.wait(timeout=120) == 0, m.log_text()
    assert not m.error_lines(), m.log_text()
    again = mount("b")
    assert (again.mountpoint / "late").read_bytes() == b"".join(bytes([i]) * 4096 for i in range(64))
