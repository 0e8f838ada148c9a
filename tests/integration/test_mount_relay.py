"""`bftfs mount --relay` on a real 4-replica file-service cluster: two mounts see each other's changes after
close/open (close-to-open consistency), a stopped relay blocks operations without making them unkillable, and
a restarted relay is reconnected to transparently (a hard mount)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bftfs_mount import Mount
from conftest import wait_until
from test_relay import Relay, short_dir

pytestmark = pytest.mark.fuse


@pytest.fixture
def two_mounts(cluster, bftfs_bin, tmp_path):
    c = cluster(service="fs", replica_args=["--shim", "--no-fsync"])
    relay = Relay(bftfs_bin, c, short_dir(tmp_path)).start()
    top = Path(tempfile.mkdtemp(prefix="bftfs-mnt-"))
    mounts = [Mount(bftfs_bin, top / name, tmp_path / f"{name}.log", ["--relay", str(relay.sock)])
              for name in ("a", "b")]
    try:
        for m in mounts:
            m.start()
        yield relay, mounts[0], mounts[1]
    finally:
        codes = [m.stop() for m in mounts]
        relay.daemon.stop()
        shutil.rmtree(top, ignore_errors=True)
    assert codes == [0, 0], "\n".join(m.log_text() for m in mounts)
    for m in mounts:
        assert not m.error_lines(), m.log_text()


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
