"""The relay (`bftfs relay`, docs/RELAY.md) in front of a real 4-replica file-service cluster, driven with
`bftfs fsop` (the relay protocol without FUSE) and with raw bytes on its socket: many requests in flight, a
killed backup, a restarted relay (clean and after SIGKILL), garbage and a mount that never reads. Also the
one-command local cluster (`bftfs cluster start --service fs`, with and without --norep): it starts a relay,
`status` shows it, and `cluster stop` leaves nothing running."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import struct
import subprocess
from pathlib import Path

import pytest

from harness.relay import (FRAME_BODY_MAX, HELLO_BODY, STATUS_BODY, Relay, frame, read_frame, short_dir,
                           submit_frame)
from harness.relay import fsop as relay_fsop
from harness.waiting import wait_until

def fsop(bftfs: Path, sock: Path, op: str, path: str = "/", *args: str, check: bool = True,
         timeout_s: float = 60) -> subprocess.CompletedProcess:
    return relay_fsop(bftfs, sock, "--op", op, "--path", path, *args, check=check, timeout_s=timeout_s)


def relay_status(bftfs: Path, sock: Path) -> dict[str, str]:
    out = fsop(bftfs, sock, "status").stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


@pytest.fixture
def fs_cluster(cluster, bftfs_bin, tmp_path):
    """A 4-replica fs cluster behind the shim, and a relay (stopped and checked for ERROR lines at teardown)."""
    c = cluster(service="fs", replica_args=["--shim", "--no-fsync"])
    relay = Relay(bftfs_bin, c, short_dir(tmp_path)).start()
    yield c, relay
    relay.daemon.stop()
    assert not relay.errors(), "unexpected ERROR lines in the relay log:\n" + "\n".join(relay.errors())


def test_many_requests_in_flight_and_a_killed_backup(fs_cluster, bftfs_bin):
    c, relay = fs_cluster
    sock = relay.sock
    assert "ino 2 " in fsop(bftfs_bin, sock, "mkdir", "/d").stdout
    out = fsop(bftfs_bin, sock, "create", "/d/f%d", "--parallel", "200").stdout
    assert "200 of 200 operations succeeded" in out
    names = fsop(bftfs_bin, sock, "readdir", "/d").stdout.split()
    assert {f"f{i}" for i in range(200)} <= set(names)

    fsop(bftfs_bin, sock, "create", "/d/data")
    fsop(bftfs_bin, sock, "write", "/d/data", "--data", "before the crash")
    c.kill(3)  # a backup: the remaining 2f+1 still order and answer
    out = fsop(bftfs_bin, sock, "create", "/d/g%d", "--parallel", "100").stdout
    assert "100 of 100 operations succeeded" in out
    fsop(bftfs_bin, sock, "write", "/d/data", "--data", "AFTER", "--offset", "0")
    assert fsop(bftfs_bin, sock, "read", "/d/data").stdout == "AFTERe the crash"
    # A file-system error is a result, not a failure of the relay.
    missing = fsop(bftfs_bin, sock, "getattr", "/d/nope", check=False)
    assert missing.returncode == 1 and "errno 2" in missing.stdout
    st = relay_status(bftfs_bin, sock)
    assert int(st["completed"]) >= 300
    assert st["in_flight"] == "0"
    assert st["protocol_errors"] == "0"
    assert st["client_id"] == str(relay.client_id)


def test_a_mount_over_its_in_flight_limit_is_read_later_not_dropped(cluster, bftfs_bin, tmp_path):
    c = cluster(service="fs", replica_args=["--shim", "--no-fsync"])
    relay = Relay(bftfs_bin, c, short_dir(tmp_path), "--mount-in-flight-max", "3").start()
    try:
        fsop(bftfs_bin, relay.sock, "mkdir", "/p")
        assert "150 of 150" in fsop(bftfs_bin, relay.sock, "create", "/p/f%d", "--parallel", "150").stdout
        assert "150 of 150" in fsop(bftfs_bin, relay.sock, "getattr", "/p/f%d", "--parallel", "150").stdout
        assert len(fsop(bftfs_bin, relay.sock, "readdir", "/p").stdout.split()) == 152  # with . and ..
        assert int(relay_status(bftfs_bin, relay.sock)["read_pauses"]) > 0
    finally:
        relay.daemon.stop()
    assert not relay.errors(), "\n".join(relay.errors())


def test_speculative_chain_survives_a_lying_primary(cluster, bftfs_bin, tmp_path):
    """PBFT-CS through the relay: each create is sent as soon as the one before has a first reply, predicated
    on it (SUBMIT dependencies). The primary corrupts every early reply, so predictions fail: the relay reports
    rollbacks or not-executed requests, the mount resubmits, the library stops trusting the primary, and in the
    end every file exists exactly once."""
    c = cluster(service="fs", replica_args=["--shim", "--no-fsync", "--early-replies", "--corrupt-early-replies", "1"])
    relay = Relay(bftfs_bin, c, short_dir(tmp_path)).start()
    try:
        fsop(bftfs_bin, relay.sock, "mkdir", "/c")
        out = fsop(bftfs_bin, relay.sock, "create", "/c/f%d", "--parallel", "40", "--chain").stdout
        assert "40 of 40 operations succeeded" in out
        names = fsop(bftfs_bin, relay.sock, "readdir", "/c").stdout.split()
        assert sorted(n for n in names if n not in (".", "..")) == sorted(f"f{i}" for i in range(40))
        st = relay_status(bftfs_bin, relay.sock)
        assert "0" not in st["replicas_trusted"].split(","), st
        assert st["in_flight"] == "0"
        assert int(st["first_mismatches_0"]) >= 2 and st["first_mismatches_1"] == "0", st
    finally:
        relay.daemon.stop()
    assert not relay.errors(), "\n".join(relay.errors())


def test_a_relay_told_to_always_trust_keeps_using_a_lying_primary(cluster, bftfs_bin, tmp_path):
    """`--distrust-window 0` turns the 1% rule off (as the paper's fault experiment did, PBFT-CS §6.2): the relay
    keeps delivering the primary's wrong early replies, every prediction on them fails and is redone, and the
    result is still every file exactly once. STATUS counts each replica's early replies and wrong ones."""
    c = cluster(service="fs", replica_args=["--shim", "--no-fsync", "--early-replies", "--corrupt-early-replies", "1"])
    relay = Relay(bftfs_bin, c, short_dir(tmp_path), "--distrust-window", "0").start()
    try:
        fsop(bftfs_bin, relay.sock, "mkdir", "/c")
        out = fsop(bftfs_bin, relay.sock, "create", "/c/f%d", "--parallel", "20", "--chain").stdout
        assert "20 of 20 operations succeeded" in out
        names = fsop(bftfs_bin, relay.sock, "readdir", "/c").stdout.split()
        assert sorted(n for n in names if n not in (".", "..")) == sorted(f"f{i}" for i in range(20))
        st = relay_status(bftfs_bin, relay.sock)
        assert st["replicas_trusted"] == "0,1,2,3", st
        compared, wrong = int(st["first_compared_0"]), int(st["first_mismatches_0"])
        assert wrong == compared and wrong > 2, st
        assert int(st["rollbacks"]) > 2, st
    finally:
        relay.daemon.stop()
    assert not relay.errors(), "\n".join(relay.errors())


def test_speculative_chain_with_an_honest_primary(cluster, bftfs_bin, tmp_path):
    c = cluster(service="fs", replica_args=["--shim", "--no-fsync", "--early-replies"])
    relay = Relay(bftfs_bin, c, short_dir(tmp_path)).start()
    try:
        fsop(bftfs_bin, relay.sock, "mkdir", "/c")
        out = fsop(bftfs_bin, relay.sock, "create", "/c/f%d", "--parallel", "40", "--chain").stdout
        assert "40 of 40 operations succeeded" in out and "resubmitted" not in out
        st = relay_status(bftfs_bin, relay.sock)
        assert st["rollbacks"] == "0" and int(st["first_sent"]) >= 1
        assert st["replicas_trusted"] == "0,1,2,3"
    finally:
        relay.daemon.stop()
    assert not relay.errors(), "\n".join(relay.errors())


def test_primary_killed_requests_complete_after_the_view_change(fs_cluster, bftfs_bin):
    """The primary is dead when 300 creates arrive: the relay's requests to it go unanswered, it retransmits
    to every replica, the backups change view, and every create completes exactly once."""
    c, relay = fs_cluster
    fsop(bftfs_bin, relay.sock, "mkdir", "/v")
    c.kill(0)
    out = fsop(bftfs_bin, relay.sock, "create", "/v/f%d", "--parallel", "300", "--timeout-s", "120",
               timeout_s=150).stdout
    assert "300 of 300 operations succeeded" in out
    names = fsop(bftfs_bin, relay.sock, "readdir", "/v").stdout.split()
    assert sorted(n for n in names if n not in (".", "..")) == sorted(f"f{i}" for i in range(300))
    assert int(relay_status(bftfs_bin, relay.sock)["retransmissions"]) > 0


def test_relay_restart_keeps_the_file_system(fs_cluster, bftfs_bin):
    c, relay = fs_cluster
    fsop(bftfs_bin, relay.sock, "create", "/kept")
    fsop(bftfs_bin, relay.sock, "write", "/kept", "--data", "one")
    relay.daemon.stop()  # SIGTERM: the socket file is removed
    assert not relay.sock.exists()
    relay.daemon.restart()
    fsop(bftfs_bin, relay.sock, "write", "/kept", "--data", "two", "--offset", "3")
    relay.daemon.kill()  # SIGKILL leaves a stale socket file behind; a new relay must replace it
    assert relay.sock.exists()
    relay.daemon.restart()
    assert fsop(bftfs_bin, relay.sock, "read", "/kept").stdout == "onetwo"


HELLO = frame(HELLO_BODY)
STATUS = frame(STATUS_BODY)


def closed_by_peer(s: socket.socket, timeout_s: float = 10) -> bool:
    """True when the relay closes the connection (EOF or reset) within the timeout; replies are discarded."""
    s.settimeout(timeout_s)
    try:
        while s.recv(1 << 16):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def connect(sock: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(sock))
    return s


def test_garbage_and_a_mount_that_does_not_read(cluster, bftfs_bin, tmp_path):
    c = cluster(service="fs", replica_args=["--shim", "--no-fsync"])
    relay = Relay(bftfs_bin, c, short_dir(tmp_path), "--mount-output-max-bytes", "65536").start()
    rng = random.Random(5)
    try:
        fsop(bftfs_bin, relay.sock, "mkdir", "/ok")
        violations = [
            ("random bytes", rng.randbytes(256 << 10)),
            ("zero length", struct.pack("<I", 0)),
            ("oversized length", struct.pack("<I", FRAME_BODY_MAX + 1) + rng.randbytes(100)),
            ("length 0xFFFFFFFF", struct.pack("<I", 0xFFFFFFFF)),
            ("SUBMIT before HELLO", submit_frame(1, b"\x01")),
            ("unknown type", HELLO + frame(b"\x77")),
            ("HELLO of version 2", frame(b"\x01" + struct.pack("<H", 2))),
            ("second HELLO", HELLO + HELLO),
            ("SUBMIT with unknown flags", HELLO + submit_frame(1, b"\x01", flags=0x80)),
            ("truncated SUBMIT", HELLO + frame(b"\x02" + bytes(5))),
        ]
        for what, data in violations:
            with connect(relay.sock) as s:
                with contextlib.suppress(OSError):
                    s.sendall(data)
                assert closed_by_peer(s), f"the relay kept a connection open after {what}"
        # Half a frame, then the mount goes away: nothing to do but forget it.
        with connect(relay.sock) as s:
            s.sendall(HELLO + struct.pack("<I", 1000) + b"\x02" * 10)

        # A malformed fs request is refused with a reason (FINAL status 2), and the connection stays usable.
        with connect(relay.sock) as s:
            s.sendall(HELLO)
            hello_ok = read_frame(s)
            assert hello_ok[0] == 129
            assert struct.unpack("<HIII", hello_ok[1:]) == (1, relay.client_id, 4, 1)
            s.sendall(submit_frame(7, b"\xff\xff\xff"))
            final = read_frame(s)
            tag, status, n = struct.unpack("<QBI", final[1:14])
            assert (final[0], tag, status) == (131, 7, 2)
            assert b"malformed fs request" in final[14:14 + n]
            s.sendall(STATUS)
            assert read_frame(s)[0] == 132

        # A mount that sends requests but never reads the replies is disconnected, not buffered for forever.
        with connect(relay.sock) as s:
            s.sendall(HELLO)
            s.settimeout(30)
            with contextlib.suppress(OSError):
                for _ in range(200):
                    s.sendall(STATUS * 1000)
            assert closed_by_peer(s)

        st = relay_status(bftfs_bin, relay.sock)
        assert int(st["protocol_errors"]) >= len(violations)
        assert int(st["slow_disconnects"]) >= 1
        assert int(st["refused"]) >= 1
        # Still serving.
        assert "ino" in fsop(bftfs_bin, relay.sock, "getattr", "/ok").stdout
        assert relay.daemon.alive()
    finally:
        relay.daemon.stop()
    assert not relay.errors(), "\n".join(relay.errors())


def test_random_frames_through_the_socket(fs_cluster, bftfs_bin):
    """A fuzzer through the socket: valid frames with random bytes changed, cut or repeated, over many
    connections. Whatever the relay makes of them, it stays up and keeps serving."""
    c, relay = fs_cluster
    rng = random.Random(11)
    templates = [HELLO, submit_frame(1, b"\x01\x01\x00\x00"), submit_frame(2, rng.randbytes(40), flags=3),
                 frame(b"\x03" + struct.pack("<Q", 1)), STATUS]
    for _ in range(60):
        stream = bytearray(HELLO if rng.random() < 0.8 else b"")
        for _ in range(rng.randrange(1, 12)):
            f = bytearray(rng.choice(templates))
            for _ in range(rng.randrange(0, 4)):
                f[rng.randrange(len(f))] = rng.randrange(256)
            if rng.random() < 0.2:
                f = f[:rng.randrange(len(f))]
            stream += f
        with connect(relay.sock) as s:
            with contextlib.suppress(OSError):
                s.sendall(bytes(stream))
                s.settimeout(0.05)
                with contextlib.suppress(socket.timeout, OSError):
                    s.recv(1 << 16)
    assert relay.daemon.alive()
    fsop(bftfs_bin, relay.sock, "mkdir", "/after-fuzz")
    assert "after-fuzz" in fsop(bftfs_bin, relay.sock, "readdir", "/").stdout.split()


def test_requests_wait_for_unreachable_replicas(cluster, bftfs_bin, tmp_path):
    """Like an NFS hard mount: with too few replicas for a quorum an operation waits (the relay retransmits)
    and completes once they are back."""
    c = cluster(service="fs", replica_args=["--shim"])
    relay = Relay(bftfs_bin, c, short_dir(tmp_path)).start()
    try:
        fsop(bftfs_bin, relay.sock, "mkdir", "/w")
        c.stop(2)
        c.stop(3)
        pending = subprocess.Popen([str(bftfs_bin), "fsop", "--socket", str(relay.sock), "--op", "create",
                                    "--path", "/w/late", "--timeout-s", "120"],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: int(relay_status(bftfs_bin, relay.sock)["in_flight"]) == 1, 30,
                       "the create to be in flight at the relay")
            assert pending.poll() is None, "the create finished without a quorum"
            c.start([2, 3])
            out, err = pending.communicate(timeout=120)
        finally:
            if pending.poll() is None:
                pending.kill()
                pending.wait()
        assert pending.returncode == 0, out + err
        assert "type file" in out
        assert int(relay_status(bftfs_bin, relay.sock)["retransmissions"]) > 0
    finally:
        relay.daemon.stop()
    assert not relay.errors(), "\n".join(relay.errors())


def run_cli(bftfs: Path, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(bftfs), *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout_s)


def pids_in(d: Path) -> list[int]:
    return [int(p.read_text()) for p in d.glob("*.pid") if p.read_text().strip().isdigit()]


@pytest.mark.parametrize("norep", [False, True], ids=["pbft", "norep"])
def test_cluster_start_runs_a_relay_and_stop_leaves_nothing(bftfs_bin, ports, tmp_path, norep):
    d = short_dir(tmp_path) / "c"
    extra = ["--norep"] if norep else ["--no-fsync"]
    started = run_cli(bftfs_bin, "cluster", "start", "--dir", str(d), "--service", "fs", "--base-port",
                      str(ports.alloc(5)), *extra)
    pids = pids_in(d)
    try:
        assert started.returncode == 0, started.stderr
        assert "relay pid" in started.stdout
        assert (d / "relay.sock").exists()
        status = run_cli(bftfs_bin, "status", "--dir", str(d))
        assert status.returncode == 0, status.stdout + status.stderr
        assert ("norep" if norep else "pbft") in status.stdout
        sock = d / "relay.sock"
        fsop(bftfs_bin, sock, "mkdir", "/x")
        assert "50 of 50" in fsop(bftfs_bin, sock, "create", "/x/f%d", "--parallel", "50", "--first").stdout
        assert "f49" in fsop(bftfs_bin, sock, "readdir", "/x").stdout.split()
    finally:
        stopped = run_cli(bftfs_bin, "cluster", "stop", "--dir", str(d))
    assert stopped.returncode == 0, stopped.stderr
    assert "relay (pid" in stopped.stdout
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "bftfs" not in Path(f"/proc/{pid}/cmdline").read_text(), \
            f"pid {pid} still runs after cluster stop"
    assert not (d / "relay.sock").exists()
    assert not list(d.glob("*.pid"))


def test_durable_norep_keeps_the_file_system_on_disk_across_a_kill(bftfs_bin, ports, tmp_path):
    """NO-REP runs the file service on the replicas' disk store (DIR/norep/fs) with a checkpoint every 128
    requests and, with --norep-durable, logs every request before it replies: after SIGKILL and a restart
    (checkpoint, then the log replayed from it) every answered create is there."""
    d = short_dir(tmp_path) / "c"
    argv = ["cluster", "start", "--dir", str(d), "--service", "fs", "--base-port", str(ports.alloc(5)),
            "--norep", "--norep-durable"]
    started = run_cli(bftfs_bin, *argv)
    try:
        assert started.returncode == 0, started.stderr
        sock = d / "relay.sock"
        fsop(bftfs_bin, sock, "mkdir", "/x")
        assert "300 of 300" in fsop(bftfs_bin, sock, "create", "/x/f%d", "--parallel", "300").stdout

        def status():
            st = json.loads((d / "norep" / "status.json").read_text())
            return st if st["checkpoints"] >= 2 else None

        st = wait_until(status, 30, "the NO-REP server to report its checkpoints")
        assert st["store"] == "disk" and st["durable"] is True
        assert (d / "norep" / "fs" / "index").exists()
        pid = int((d / "norep.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
                   .rsplit(")", 1)[1].split()[:1], 30, "the killed NO-REP server to exit")
        assert run_cli(bftfs_bin, "cluster", "stop", "--dir", str(d)).returncode == 0
        restarted = run_cli(bftfs_bin, *argv)
        assert restarted.returncode == 0, restarted.stderr
        names = set(fsop(bftfs_bin, sock, "readdir", "/x").stdout.split())
        assert {f"f{i}" for i in range(300)} <= names
    finally:
        run_cli(bftfs_bin, "cluster", "stop", "--dir", str(d))
