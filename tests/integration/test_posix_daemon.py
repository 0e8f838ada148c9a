"""The mount daemon's life cycle as a local file system's users meet it: `bftfs umount` returns only when the
daemon is gone (so a following mount of the same directory or an rmdir works at once); SIGTERM ends the daemon
cleanly also while its backend is unreachable; a process that exits with writes in flight while the replicas
are down is not stuck in close (the kernel cannot interrupt a FLUSH sent from an exiting process).

The backend-down cases use a NO-REP cluster (one server, the same relay and client as PBFT) whose server is
stopped: the relay stays up, so the mount's requests wait, as they do while replicas are unreachable."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness.binaries import build_dir
from harness.daemon import Daemon
from harness.mount import is_mountpoint
from harness.ports import PORTS
from harness.waiting import wait_until

# Generous bounds for "it ends": the daemon's own grace for writes in flight is 10 s; nothing here measures time.
END_TIMEOUT_S = 60


@pytest.fixture
def bftfs() -> Path:
    b = build_dir() / "cli" / "bftfs"
    if not os.access(b, os.X_OK):
        pytest.skip(f"{b} is not built")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse does not exist")
    return b


def _mount(bftfs: Path, backend: list, mnt: Path, log: Path) -> Daemon:
    mnt.mkdir(exist_ok=True)
    d = Daemon("mount", [bftfs, "mount", "-f", *backend, mnt], log).start()
    wait_until(lambda: is_mountpoint(mnt) or not d.alive(), 20, f"{mnt} to be mounted")
    assert is_mountpoint(mnt), d.log_tail()
    return d


def _exited(d: Daemon, timeout_s: float = END_TIMEOUT_S) -> int:
    try:
        return d.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the mount daemon did not exit; log:\n{d.log_tail()}") from None


@pytest.fixture
def norep_mount(bftfs, tmp_path):
    """A NO-REP cluster with a mount on it and a file `f` written through it. Yields (daemon, mnt, stop_server):
    stop_server() kills the server (the relay stays up, so the mount's requests wait)."""
    cluster = tmp_path / "c"
    out = subprocess.run([str(bftfs), "cluster", "start", "--dir", str(cluster), "--f", "1", "--base-port",
                          str(PORTS.alloc(3)), "--service", "fs", "--norep"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    mnt = tmp_path / "mnt"
    d = _mount(bftfs, ["--relay", cluster / "relay.sock"], mnt, tmp_path / "mount.log")
    try:
        (mnt / "f").write_bytes(b"before")
        def stop(which: str = "norep") -> None:
            """Kills the server ("norep") or the relay ("relay") the mount talks to."""
            os.kill(int((cluster / f"{which}.pid").read_text()), signal.SIGKILL)

        yield d, mnt, stop
    finally:
        if is_mountpoint(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, timeout=30)
        d.kill()
        subprocess.run([str(bftfs), "cluster", "stop", "--dir", str(cluster)], capture_output=True, timeout=60)


def test_umount_returns_after_the_daemon_has_exited(bftfs, tmp_path):
    data, mnt = tmp_path / "data", tmp_path / "mnt"
    data.mkdir()
    for round_ in range(3):
        d = _mount(bftfs, ["--local", data], mnt, tmp_path / "mount.log")
        (mnt / f"f{round_}").write_bytes(b"x" * 300_000)
        out = subprocess.run([str(bftfs), "umount", str(mnt)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        # Not a wait: when umount returns the daemon has saved its state and let go of DIR (a second daemon
        # on DIR would be refused while the first holds DIR/LOCK); only its process teardown may be left.
        with open(data / "LOCK", "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise AssertionError(f"round {round_}: bftfs umount returned while the daemon held {data}") from None
        assert _exited(d) == 0, d.log_tail()
    os.rmdir(mnt)
    d = _mount(bftfs, ["--local", data], tmp_path / "mnt2", tmp_path / "mount.log")
    try:
        assert sorted(os.listdir(tmp_path / "mnt2")) == ["f0", "f1", "f2"]
    finally:
        subprocess.run([str(bftfs), "umount", str(tmp_path / "mnt2")], capture_output=True, timeout=60)
        d.stop()


@pytest.mark.parametrize("down", ["norep", "relay"])
def test_sigterm_while_the_backend_is_down_unmounts_and_exits(norep_mount, down):
    d, mnt, stop = norep_mount
    stop(down)
    # A caller blocked in the mount (its GETATTR cannot be answered), as a shell's `ls` would be.
    blocked = subprocess.Popen(["stat", str(mnt / "f")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)  # not a timing assertion: only gives the stat a chance to be inside the mount
        d.proc.send_signal(signal.SIGTERM)
        _exited(d)
        assert not is_mountpoint(mnt), "the daemon exited but left its mount behind"
        assert blocked.wait(timeout=END_TIMEOUT_S) is not None
    finally:
        if blocked.poll() is None:
            blocked.kill()


def test_a_process_exiting_with_writes_in_flight_is_not_stuck_while_the_backend_is_down(norep_mount):
    d, mnt, stop_server = norep_mount
    code = ("import os, sys\n"
            "fd = os.open(sys.argv[1], os.O_WRONLY)\n"
            "sys.stdout.write('open\\n'); sys.stdout.flush()\n"
            "sys.stdin.readline()\n"
            "os.write(fd, b'y' * 100000)\n"   # write-behind: answered at once, in flight for good
            "os._exit(0)\n")                  # exits with the descriptor open: FLUSH from the kernel's exit path
    p = subprocess.Popen(["python3", "-c", code, str(mnt / "f")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline() == "open\n"
        stop_server()
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.wait(timeout=END_TIMEOUT_S) == 0, "the exiting process was stuck in close"
    finally:
        if p.poll() is None:  # stuck in the kernel's exit path: only the daemon's death frees it
            d.kill()
            p.kill()
            p.wait(timeout=END_TIMEOUT_S)
    d.proc.send_signal(signal.SIGTERM)
    assert _exited(d) != 0, "writes were lost at the stop: the daemon must say so in its exit status"
    assert not is_mountpoint(mnt)


def test_appends_from_two_mounts_through_mapped_descriptors_stay_whole(norep_mount, bftfs, tmp_path):
    """O_APPEND descriptors go through the page cache (so they can be mapped, POSIX_FINDINGS.md #7); an append
    lands at the service's end, atomically across mounts. When another mount appended meanwhile, this mount's
    cached pages of the file are dropped: after reopening, both mounts read every record, whole."""
    _, mnt_a, _ = norep_mount
    mnt_b = tmp_path / "mnt_b"
    b = _mount(bftfs, ["--relay", tmp_path / "c" / "relay.sock"], mnt_b, tmp_path / "mount_b.log")
    try:
        p_a, p_b = mnt_a / "log", mnt_b / "log"
        p_a.write_bytes(b"")
        fa = os.open(p_a, os.O_RDWR | os.O_APPEND)
        assert os.read(fa, 10) == b""          # the kernel of mount A caches the (empty) file
        records = []
        for i in range(20):
            rec_b = b"B%02d" % i + b"b" * 97
            with open(p_b, "ab") as fb:          # mount B appends: A's idea of the end is now stale
                fb.write(rec_b)
            rec_a = b"A%02d" % i + b"a" * 97
            assert os.write(fa, rec_a) == len(rec_a)
            records += [rec_b, rec_a]
        os.close(fa)
        want = sorted(records)
        for p in (p_a, p_b):
            data = p.read_bytes()
            got = sorted(data[i:i + 100] for i in range(0, len(data), 100))
            assert len(data) == 4000 and got == want, f"{p}: records torn, lost or stale"
    finally:
        subprocess.run([str(bftfs), "umount", str(mnt_b)], capture_output=True, timeout=60)
        b.stop()
