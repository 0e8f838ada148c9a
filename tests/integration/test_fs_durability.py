"""Durability of fsynced data on the mounted file system across `kill -9` of every replica (issue 5), and the
hard-mount behaviour while they are all down.

A 4-replica fs cluster (durable: the replicas sync their logs), a relay and `bftfs mount --relay`. A writer
process (harness/durability.py) appends records to three files with fsync after each, replaces files by
rename after fsync and creates files with an fsync of the directory, logging outside the mount every operation
it saw fsync return for. In each round every replica gets SIGKILL at once, at a different moment of the
workload; they are restarted on the same data directories, the writer's blocked operation must complete by
itself (nothing is retried by the test), and then every logged byte must be in the files, byte for byte; after
a clean stop of the writer the files must hold exactly what it wrote.

While every replica is down: a process blocked in the file system ends on SIGINT and on SIGKILL (never
unkillable), the writer stays blocked without getting an error, and `bftfs umount` detaches the mount; the
mount daemon then finishes its writes in flight once the replicas are back, and a new mount sees every fsynced
byte.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.daemon import kill_all
from harness.durability import Writer, check_dir, read_log, run_round, run_total_crash_round
from harness.mount import Mount
from harness.relay import Relay, short_dir
from harness.waiting import wait_until

# How long a process must stay blocked before we call it blocked, and the bound on everything that must end.
BLOCKED_S = 1.0
END_TIMEOUT_S = 20.0

pytestmark = pytest.mark.fuse


def require_fuse() -> None:
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse is not available")
    if os.geteuid() != 0:
        pytest.skip("mounting needs root here")


class Stack:
    """The cluster (fixture-owned), a relay and one mount, torn down in reverse order."""

    def __init__(self, cluster, bftfs: Path, tmp_path: Path) -> None:
        require_fuse()
        self.bftfs = bftfs
        # Durable replicas: no --no-fsync. The shim because the relay speaks PBFT-CS requests.
        self.cluster = cluster(service="fs", replica_args=["--shim"])
        self.relay = Relay(bftfs, self.cluster, short_dir(tmp_path)).start()
        self.top = Path(tempfile.mkdtemp(prefix="bftfs-dur-"))
        self.work = tmp_path / "work"
        self.work.mkdir()
        self.mounts: list[Mount] = []
        self.tmp_path = tmp_path

    def mount(self) -> Mount:
        k = len(self.mounts)
        m = Mount(self.bftfs, self.top / f"mnt{k}", self.tmp_path / f"mount{k}.log", ["--relay", str(self.relay.sock)])
        self.mounts.append(m)
        return m.start()

    def kill_replicas(self) -> None:
        kill_all(self.cluster.replicas)

    def restart_replicas(self) -> None:
        self.cluster.start()  # Daemon.start removes the old status.json: readiness is the new incarnation's word

    def kill_everything(self) -> None:
        """SIGKILL to every replica, the relay and every mount daemon, all signalled before any is reaped; then
        detaches the dead mounts (their mount points answer ENOTCONN until then)."""
        mounts = [m for m in self.mounts if m.proc is not None]
        kill_all(self.cluster.replicas + [self.relay.daemon] + mounts)
        for m in mounts:
            m.proc = None
            subprocess.run(["umount", "-l", str(m.mountpoint)], capture_output=True, timeout=END_TIMEOUT_S)

    def restart_everything(self) -> Path:
        """The replicas on their data directories, the relay, and a new mount (returned)."""
        self.restart_replicas()
        self.relay.daemon.restart()
        return self.mount().mountpoint

    def close(self) -> list[str]:
        problems = []
        for m in self.mounts:
            code = m.stop()
            if code not in (0, None) or m.error_lines():
                problems.append(f"{m.mountpoint}: exit {code}, errors {m.error_lines()}")
        self.relay.daemon.stop()
        problems += [f"relay: {line}" for line in self.relay.errors()]
        shutil.rmtree(self.top, ignore_errors=True)
        return problems


@pytest.fixture
def stack(cluster, bftfs_bin, tmp_path):
    s = Stack(cluster, bftfs_bin, tmp_path)
    try:
        yield s
    finally:
        problems = s.close()
    assert not problems, "\n".join(problems)


def blocked_process(path: Path) -> subprocess.Popen:
    """A process that creates a directory at `path` (an operation that needs the replicas)."""
    return subprocess.Popen([sys.executable, "-c", "import os, sys; os.mkdir(sys.argv[1]); print('done')", str(path)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def assert_blocked_then_ended_by(sig: int, path: Path) -> None:
    p = blocked_process(path)
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=BLOCKED_S)  # it cannot finish: every replica is down
    p.send_signal(sig)
    try:
        code = p.wait(timeout=END_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError(f"a process blocked on the mount did not end within {END_TIMEOUT_S} s of "
                             f"{signal.Signals(sig).name}") from None
    assert b"done" not in p.stdout.read(), "the operation completed while every replica was down"
    assert code != 0, f"exit {code} after {signal.Signals(sig).name}"


def test_every_fsynced_byte_survives_kill_9_of_every_replica(stack):
    m = stack.mount()
    rounds = []

    def while_down(writer: Writer) -> None:
        # A hard mount: the writer waits (no error, no exit) and other callers can still be interrupted.
        assert_blocked_then_ended_by(signal.SIGINT, m.mountpoint / f"blocked-int-{len(rounds)}")
        assert_blocked_then_ended_by(signal.SIGKILL, m.mountpoint / f"blocked-kill-{len(rounds)}")
        assert writer.proc.poll() is None, f"the writer ended while replicas were down: {writer.logged().error}"
        assert not writer.logged().error

    # Kill early (first files being created), in the middle, and later on a longer history.
    for index, kill_after in enumerate((3, 30, 60)):
        r = run_round(index, m.mountpoint, stack.work, seed=1000 + index, kill_after_records=kill_after,
                      kill_replicas=stack.kill_replicas, restart_replicas=stack.restart_replicas,
                      while_down=while_down if index < 2 else None)
        rounds.append(r)
        print(r.as_json())
        assert not r.problems, f"round {index}: " + "\n".join(r.problems)
        assert r.records_fsynced_at_kill >= kill_after
        assert r.records_found == r.records_fsynced > r.records_fsynced_at_kill
        assert r.bytes_found == r.bytes_fsynced > 0
    # Every round's files are still intact after the later rounds' crashes.
    for r in rounds:
        final = read_log(stack.work / f"round{r.index}.log")
        c = check_dir(m.mountpoint / f"round{r.index}", final, r.seed, exact=True)
        assert c.ok(), f"round {r.index} after all rounds: {c.problems}"
    # The blocked mkdirs were interrupted; they may still have executed (as on an NFS intr mount), nothing else.
    names = set(os.listdir(m.mountpoint))
    assert names - {f"round{r.index}" for r in rounds} <= {f"blocked-{k}-{i}" for k in ("int", "kill")
                                                           for i in range(2)}


def test_fsynced_bytes_survive_kill_9_of_replicas_relay_and_mount_together(stack):
    """Only the replicas' data directories survive: no relay or client memory can replay a lost write."""
    m = stack.mount()
    for index, kill_after in enumerate((8, 25, 45)):
        r = run_total_crash_round(index, m.mountpoint, stack.work, seed=2000 + index, kill_after_records=kill_after,
                                  kill_everything=stack.kill_everything, restart_everything=stack.restart_everything)
        print(r.as_json())
        assert not r.problems, f"round {index}: " + "\n".join(r.problems)
        assert r.records_fsynced_at_kill >= kill_after
        assert r.records_found == r.records_fsynced == r.records_fsynced_at_kill
        assert r.bytes_found == r.bytes_fsynced > 0
        m = stack.mounts[-1]


def test_umount_works_while_every_replica_is_down_and_writes_land_after(stack):
    m = stack.mount()
    writer = Writer(m.mountpoint / "w", stack.work / "w.log", stack.work / "w.stop", seed=77)
    try:
        wait_until(lambda: writer.logged().records >= 20 or writer.proc.poll() is not None, 60,
                   "the writer to log 20 durable operations")
        assert writer.proc.poll() is None, writer.logged().error
        stack.kill_replicas()
        # The writer is blocked (at the latest in its next fsync); SIGKILL ends it.
        writer.proc.send_signal(signal.SIGKILL)
        try:
            writer.proc.wait(timeout=END_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError("the writer, blocked on the mount, survived SIGKILL") from None
        logged = writer.logged()
        assert logged.records >= 20 and not logged.error
        daemon = m.proc
        assert daemon is not None
        done = subprocess.run([str(stack.bftfs), "umount", str(m.mountpoint)], capture_output=True, text=True,
                              timeout=END_TIMEOUT_S)
        if done.returncode != 0:  # busy: detach it
            done = subprocess.run([str(stack.bftfs), "umount", "--lazy", str(m.mountpoint)], capture_output=True,
                                  text=True, timeout=END_TIMEOUT_S)
        assert done.returncode == 0, done.stderr
        assert not os.path.ismount(m.mountpoint)
        stack.restart_replicas()
        # The daemon finishes the writes it had accepted, then exits by itself.
        try:
            code = daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the unmounted daemon did not exit after the replicas came back:\n"
                                 f"{m.log_text()[-3000:]}") from None
        assert code == 0, m.log_text()[-3000:]
        m.proc = None
        again = stack.mount()
        c = check_dir(again.mountpoint / "w", logged, 77, exact=False)
        assert c.ok(), c.problems
        assert c.records_found == logged.records
    finally:
        writer.kill()


HOLDER = r"""
import os, sys, threading
threading.Thread(target=threading.Event().wait, daemon=True).start()  # a second thread (most programs have one)
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)  # opened while the replicas are up
print("open", flush=True)
sys.stdin.readline()                                          # the replicas are down now
os.write(fd, b"x" * 65536)                                    # write-behind: answered at once, still in flight
print("written", flush=True)
sys.stdin.readline()                                          # killed here, never closes by itself
"""


def test_a_process_killed_with_writes_in_flight_ends_while_every_replica_is_down(stack):
    m = stack.mount()
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(m.mountpoint / "held")], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "open\n"
        stack.kill_replicas()
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline() == "written\n"
        p.kill()
        try:
            p.wait(timeout=END_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"a process SIGKILLed with writes in flight did not end within {END_TIMEOUT_S} s "
                                 f"while every replica was down") from None
    finally:
        if any(not d.alive() for d in stack.cluster.replicas):
            stack.restart_replicas()
        p.kill()
        p.wait(timeout=60)  # with the replicas back, its FLUSH completes and it exits
    assert (m.mountpoint / "held").stat().st_size == 65536


def test_a_writer_on_a_healthy_cluster_checks_exactly(stack):
    """The checker is not vacuous: without crashes it accepts the writer's files, and it rejects one byte
    changed in a fsynced record, a missing created file and an old version renamed back into place."""
    m = stack.mount()
    writer = Writer(m.mountpoint / "h", stack.work / "h.log", stack.work / "h.stop", seed=5)
    try:
        wait_until(lambda: writer.logged().records >= 25 or writer.proc.poll() is not None, 60,
                   "the writer to log 25 durable operations")
        assert writer.stop(60) == 0
    finally:
        writer.kill()
    logged = writer.logged()
    d = m.mountpoint / "h"
    assert check_dir(d, logged, 5, exact=True).ok()
    with open(d / "a1", "r+b") as f:
        f.seek(10)
        byte = f.read(1)
        f.seek(10)
        f.write(bytes([byte[0] ^ 1]))
    bad = check_dir(d, logged, 5, exact=True)
    assert not bad.ok() and any("a1:" in p for p in bad.problems)
    os.unlink(d / "n0")
    assert any("n0: missing" in p for p in check_dir(d, logged, 5, exact=False).problems)
    (d / "r0").write_bytes(b"r0 version 0\nnot the content")
    assert any("r0:" in p for p in check_dir(d, logged, 5, exact=False).problems)
