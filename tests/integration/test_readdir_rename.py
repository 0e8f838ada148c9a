"""A directory listing ends, and returns each entry once, while every entry it returns is renamed away and back
(docs/FILESERVICE.md §7, "Directory positions"). The program: read a directory of N files with one open stream
(os.scandir: one descriptor, getdents64 underneath) and, for each entry returned, rename it to a temporary name
and back. A local ext4 returns exactly N entries; so must the replicated mount, on a 4-replica cluster that
checkpoints every few batches, and on a replica that rejoined by state transfer and is in every quorum.

Which FUSE request the kernel sends: with READDIRPLUS_AUTO (the client asks for it) the kernel uses READDIRPLUS
for the first read of a stream and after any lookup in the directory, else READDIR. Renaming through the
listing mount revalidates the entries readdirplus made, which asks for plus again: every read is a READDIRPLUS.
Renaming through a second mount of the same cluster leaves the listing mount's directory untouched: every read
after the first is a READDIR. The relay counts both (ops_readdir, ops_readdirplus), and the tests check them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.daemon import Daemon
from harness.mount import Mount
from harness.waiting import wait_until

pytestmark = [pytest.mark.fuse, pytest.mark.slow]

CHECKPOINT_INTERVAL = 8  # a checkpoint every 8 batches (log window 16): many during one listing
CATCH_UP_TIMEOUT_S = 120.0


def rename_while_listing(listed: Path, renamed: Path, limit: int) -> list[str]:
    """Reads directory `listed` with one open stream and, for each entry returned, renames it in `renamed` (the
    same directory, possibly through another mount) to a temporary name and back. Returns the names in the
    order returned; stops after `limit` entries (a listing that would otherwise not end)."""
    seen: list[str] = []
    with os.scandir(listed) as stream:
        for entry in stream:
            seen.append(entry.name)
            if len(seen) >= limit:
                break
            os.rename(renamed / entry.name, renamed / f"{entry.name}.moving")
            os.rename(renamed / f"{entry.name}.moving", renamed / entry.name)
    return seen


def make_files(directory: Path, count: int) -> list[str]:
    """Makes directory/file-00000... (several at a time: the cluster batches concurrent requests)."""
    directory.mkdir()
    names = [f"file-{i:05d}" for i in range(count)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda name: os.close(os.open(directory / name, os.O_CREAT | os.O_WRONLY, 0o644)), names))
    return names


def check_listing(seen: list[str], names: list[str], where: str) -> None:
    assert len(seen) == len(names), f"{where}: {len(seen)} entries returned for {len(names)} files"
    assert sorted(seen) == sorted(names), f"{where}: entries missing or repeated"


def local_listing(tmp_path: Path, count: int) -> None:
    """The same program on the local file system of tmp_path (ext4 or tmpfs here): the reference behaviour."""
    local = tmp_path / f"local-{count}"
    names = make_files(local, count)
    check_listing(rename_while_listing(local, local, 4 * count), names, f"local {local}")


class Relay:
    """`bftfs relay` for the cluster, on a short socket path (sun_path holds 108 bytes)."""

    def __init__(self, bftfs: Path, cluster, root: Path) -> None:
        self.sock = root / "relay.sock"
        self.status_path = root / "relay" / "status.json"
        self.daemon = Daemon("relay", [bftfs, "relay", "--config", cluster.config, "--id", cluster.client_ids[-1],
                                       "--socket", self.sock, "--status", self.status_path],
                             cluster.root / "relay.log", root / "relay")

    def counters(self) -> dict:
        """The relay's status.json as written after this call began (the relay rewrites it about every 500 ms),
        so it counts every request that completed before the call."""
        asked_ms = time.time() * 1000

        def fresh() -> dict | None:
            try:
                c = json.loads(self.status_path.read_text())
            except (OSError, ValueError):
                return None
            return c if c.get("updated_unix_ms", 0) > asked_ms else None

        return wait_until(fresh, 10, "a fresh relay status.json")


class System:
    """A 4-replica file-service cluster (shim, frequent checkpoints), a relay, and two mounts of it."""

    def __init__(self, cluster, bftfs: Path, tmp_path: Path) -> None:
        self.cluster = cluster(service="fs", replica_args=["--shim", "--no-fsync", "--checkpoint-interval",
                                                           str(CHECKPOINT_INTERVAL)])
        self.top = Path(tempfile.mkdtemp(prefix="bftfs-rd-"))
        self.relay = Relay(bftfs, self.cluster, self.top)
        self.mounts = [Mount(bftfs, self.top / name, tmp_path / f"mount-{name}.log", ["--relay", str(self.relay.sock)])
                       for name in ("a", "b")]

    def start(self) -> "System":
        self.relay.daemon.start()
        self.relay.daemon.wait_ready()
        for m in self.mounts:
            m.start()
        return self

    def stop(self) -> list:
        codes = [m.stop() for m in self.mounts]
        self.relay.daemon.stop()
        shutil.rmtree(self.top, ignore_errors=True)
        return codes

    def replica_value(self, i: int, key: str) -> int:
        """A counter of replica i's status.json (top level, or in its "stats" object); 0 until it is written."""
        status = self.cluster.status(i) or {}
        return int(status.get(key, status.get("stats", {}).get(key, 0)))

    def stable_checkpoint(self, i: int) -> int:
        return self.replica_value(i, "stable_checkpoint")

    def readdir_ops(self) -> tuple[int, int]:
        """(READDIR, READDIRPLUS) ops the relay has sent so far."""
        c = self.relay.counters()
        return int(c["ops_readdir"]), int(c["ops_readdirplus"])


@pytest.fixture
def system(cluster, bftfs_bin, tmp_path):
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse is missing")
    s = System(cluster, bftfs_bin, tmp_path)
    try:
        yield s.start()
    finally:
        codes = s.stop()
    assert codes == [0, 0], "\n".join(m.log_text() for m in s.mounts)
    for m in s.mounts:
        assert not m.error_lines(), m.log_text()
    assert not s.relay.daemon.error_lines(), s.relay.daemon.log_tail()


def listing_on_mounts(system: System, count: int, plus: bool) -> list[str]:
    """Makes `count` files on mount a and runs the program, listing through mount a; renaming through mount a
    itself (every read a READDIRPLUS) or through mount b (reads after the first are READDIRs)."""
    a, b = (m.mountpoint for m in system.mounts)
    names = make_files(a / "d", count)
    checkpoint_before = system.stable_checkpoint(0)
    plain_before, plus_before = system.readdir_ops()
    seen = rename_while_listing(a / "d", (a if plus else b) / "d", 4 * count)
    plain_after, plus_after = system.readdir_ops()
    if plus:
        assert plus_after - plus_before >= 2, "renames through the listing mount keep the kernel in plus mode"
    else:
        assert plain_after - plain_before >= 1, "renames through another mount leave plain READDIRs"
    assert system.stable_checkpoint(0) > checkpoint_before, "no checkpoint was taken during the listing"
    check_listing(seen, names, f"mount ({count} files, {'readdirplus' if plus else 'readdir'})")
    assert sorted(os.listdir(b / "d")) == sorted(names), "the other mount sees every name back in place"
    return seen


@pytest.mark.parametrize("plus", [True, False], ids=["readdirplus", "readdir"])
def test_listing_of_300_ends_while_each_entry_is_renamed_away_and_back(system, tmp_path, plus):
    local_listing(tmp_path, 300)
    listing_on_mounts(system, 300, plus)


@pytest.mark.timeout(900)
def test_listing_of_5000_ends_while_each_entry_is_renamed_away_and_back(system, tmp_path):
    """The issue's program as it was run: listing and renaming through one mount (READDIRPLUS)."""
    local_listing(tmp_path, 5000)
    listing_on_mounts(system, 5000, True)


def test_root_listing_never_shows_the_mounts_hidden_files(system, tmp_path):
    """A file removed while open is hidden in the root's orphan directory (client/orphans.cc), which no
    listing returns, also while every entry of the root is renamed during the listing."""
    a = system.mounts[0].mountpoint
    names = [f"top-{i:03d}" for i in range(100)]
    for name in names:
        os.close(os.open(a / name, os.O_CREAT | os.O_WRONLY, 0o644))
    held = os.open(a / "held", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(held, b"still readable")
        os.unlink(a / "held")  # hidden, not removed: it is open
        seen = rename_while_listing(a, a, 4 * len(names))
        check_listing(seen, names, "root of the mount")
        assert os.pread(held, 100, 0) == b"still readable"
    finally:
        os.close(held)


def test_listing_on_a_replica_that_rejoined_by_state_transfer(system, tmp_path):
    """A backup is killed; the directory is made and changed while it is down (far past its log); it restarts
    and catches up by state transfer; then another backup stops, so the rejoined one is in every quorum (every
    read-only READDIR needs its matching reply) while the program runs."""
    local_listing(tmp_path, 300)
    c = system.cluster
    primary = system.replica_value(0, "primary")
    rejoined, stopped = [i for i in range(c.n) if i != primary][-2:]  # two backups
    a = system.mounts[0].mountpoint
    c.kill(rejoined)
    names = make_files(a / "d", 300)
    for name in names[::3]:  # entries renamed away and back, and removed and made again, while it is down
        os.rename(a / "d" / name, a / "d" / f"{name}.away")
        os.rename(a / "d" / f"{name}.away", a / "d" / name)
        os.unlink(a / "d" / name)
        os.close(os.open(a / "d" / name, os.O_CREAT | os.O_WRONLY, 0o644))
    c.replicas[rejoined].start()
    c.wait_ready([rejoined])
    os.mkdir(a / "nudge")  # work after the restart, so the replica learns of the cluster's checkpoints
    target = max(system.replica_value(i, "last_executed") for i in range(c.n) if i != rejoined)

    def caught_up() -> bool:
        return (system.replica_value(rejoined, "last_executed") >= target
                and system.replica_value(rejoined, "state_transfers") >= 1)

    wait_until(caught_up, CATCH_UP_TIMEOUT_S, f"replica {rejoined} to catch up by state transfer")
    c.stop(stopped)
    seen = rename_while_listing(a / "d", a / "d", 4 * len(names))
    check_listing(seen, names, "mount with a rejoined replica in every quorum")
