"""`bftfs mount --relay` on a real 4-replica file-service cluster: two mounts see each other's changes after
close/open (close-to-open consistency), a stopped relay blocks operations without making them unkillable, and
a restarted relay is reconnected to transparently (a hard mount)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from harness.mount import relay_mounts
from harness.relay import Relay, short_dir
from harness.waiting import wait_until

pytestmark = pytest.mark.fuse


@pytest.fixture
def two_mounts(cluster, bftfs_bin, tmp_path):
    c = cluster(service="fs", replica_args=["--shim", "--no-fsync"])
    relay = Relay(bftfs_bin, c, short_dir(tmp_path)).start()
    try:
        with relay_mounts(bftfs_bin, relay.sock, tmp_path, counters=True) as (a, b):
            yield relay, a, b
    finally:
        relay.daemon.stop()


def test_two_mounts_see_each_others_changes_after_close_and_open(two_mounts):
    _, a, b = two_mounts
    pa, pb = a.mountpoint, b.mountpoint
    (pa / "dir").mkdir()
    (pa / "dir" / "f").write_bytes(b"version one")
    assert (pb / "dir" / "f").read_bytes() == b"version one"
    # Same size, new contents: only mtime tells B's page cache it is stale.
    with open(pb / "dir" / "f", "rb") as held:  # B's cache holds version one
        assert held.read() == b"version one"
        (pa / "dir" / "f").write_bytes(b"version two")
        assert (pb / "dir" / "f").read_bytes() == b"version two"
    # Growth, and a name created by A, are visible to B's next open.
    with open(pa / "dir" / "f", "ab") as f:
        f.write(b" and more")
    assert (pb / "dir" / "f").read_bytes() == b"version two and more"
    (pb / "dir" / "g").write_bytes(b"from b")
    assert (pa / "dir" / "g").read_bytes() == b"from b"
    os.rename(pa / "dir" / "g", pa / "dir" / "h")
    assert sorted(os.listdir(pb / "dir")) == ["f", "h"]
    data = os.urandom(3 << 20)
    (pa / "big").write_bytes(data)
    assert (pb / "big").read_bytes() == data


def test_a_cached_no_such_name_expires_and_own_creates_show_at_once(two_mounts):
    """Negative lookups are cached for --negative-timeout (1 s, docs/CLIENT.md): another mount's new file is
    found once that passes; this mount's own create after its own failed lookup is found at once."""
    _, a, b = two_mounts
    pa, pb = a.mountpoint, b.mountpoint
    (pa / "d").mkdir()
    assert not (pb / "d" / "x").exists()  # B now caches "no x"
    (pa / "d" / "x").write_bytes(b"from a")
    wait_until(lambda: (pb / "d" / "x").exists(), 30, "B to find A's new file once its negative entry expired")
    assert (pb / "d" / "x").read_bytes() == b"from a"
    assert not (pb / "d" / "y").exists()
    (pb / "d" / "y").write_bytes(b"from b")
    assert (pb / "d" / "y").read_bytes() == b"from b"
    assert sorted(os.listdir(pa / "d")) == ["x", "y"]


def test_small_writes_are_coalesced_and_land_exactly(two_mounts):
    """Writes staged per file go out together (docs/CLIENT.md "Coalescing"): contiguous pieces, a rewrite of
    the start, a piece past a hole, and a chmod and utime in between, all in the order written."""
    _, a, b = two_mounts
    p = a.mountpoint / "obj"
    expected = bytearray()
    with open(p, "wb", buffering=0) as f:
        for i in range(300):
            piece = bytes([i % 251]) * 97
            f.write(piece)
            expected += piece
        f.seek(0)
        f.write(b"HEAD")
        expected[0:4] = b"HEAD"
        f.seek(60_000)
        f.write(b"TAIL")
        expected += bytes(60_000 - len(expected)) + b"TAIL"
        os.fchmod(f.fileno(), 0o600)
        os.utime(f.fileno(), ns=(10**18, 10**18 + 7))
        f.write(b"!")
        expected += b"!"
    st = os.stat(p)
    assert st.st_size == len(expected)
    assert st.st_mode & 0o777 == 0o600
    assert st.st_mtime_ns != 10**18 + 7, "the write after utime moves mtime again"
    assert (b.mountpoint / "obj").read_bytes() == bytes(expected)

    def counters():
        c = json.loads(a.counters_file.read_text())
        return c if c["fuse_write"] >= 303 else None

    c = wait_until(counters, 30, "mount A's status file to count the writes")
    assert c["writes_coalesced"] > 0
    assert c["requests_ordered"] < c["fuse_write"]


def test_attributes_after_own_mutations_are_not_stale(two_mounts):
    """The client's attribute cache (docs/CLIENT.md) never answers with attributes a mutation of this client
    changed: link counts of files and directories, a truncated size, a mode."""
    _, a, _ = two_mounts
    pa = a.mountpoint
    f = pa / "n"
    f.write_bytes(b"x" * 1000)
    assert os.stat(f).st_nlink == 1
    os.link(f, pa / "n2")
    assert os.stat(f).st_nlink == 2
    os.unlink(pa / "n2")
    assert os.stat(f).st_nlink == 1
    (pa / "d0").mkdir()
    assert os.stat(pa / "d0").st_nlink == 2
    (pa / "d0" / "sub").mkdir()
    assert os.stat(pa / "d0").st_nlink == 3
    os.rmdir(pa / "d0" / "sub")
    assert os.stat(pa / "d0").st_nlink == 2
    os.truncate(f, 10)
    assert os.stat(f).st_size == 10
    os.chmod(f, 0o640)
    assert os.stat(f).st_mode & 0o777 == 0o640


def test_stopped_relay_blocks_operations_but_they_stay_killable_then_resume(two_mounts):
    relay, a, _ = two_mounts
    (a.mountpoint / "f").write_bytes(b"x")
    pid = relay.daemon.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        # A fresh process waits inside the file system (it cannot finish while the relay is stopped) ...
        blocked = subprocess.Popen([sys.executable, "-c",
                                    "import os,sys; os.mkdir(sys.argv[1]); print('done')",
                                    str(a.mountpoint / "newdir")], stdout=subprocess.PIPE)
        with pytest.raises(subprocess.TimeoutExpired):
            blocked.wait(timeout=1.0)
        # ... and SIGKILL still ends it (the daemon answers the interrupt).
        blocked.kill()
        assert wait_until(lambda: blocked.poll() is not None, 10, "the blocked process to die")
        assert blocked.returncode == -signal.SIGKILL
    finally:
        os.kill(pid, signal.SIGCONT)
    (a.mountpoint / "after").write_bytes(b"ok")
    assert (a.mountpoint / "after").read_bytes() == b"ok"


def test_restarted_relay_is_reconnected_and_pending_work_completes(two_mounts):
    relay, a, b = two_mounts
    (a.mountpoint / "before").write_bytes(b"1")
    relay.daemon.stop()
    # While the relay is down an operation waits (hard mount) and completes once it is back.
    writer = subprocess.Popen([sys.executable, "-c",
                               "import sys; open(sys.argv[1], 'wb').write(b'written while down')",
                               str(a.mountpoint / "during")])
    with pytest.raises(subprocess.TimeoutExpired):
        writer.wait(timeout=1.0)
    relay.start()
    assert writer.wait(timeout=60) == 0
    assert (b.mountpoint / "during").read_bytes() == b"written while down"
    assert (b.mountpoint / "before").read_bytes() == b"1"
