"""The fsync workload of the durability test and benchmark (tests/integration/test_fs_durability.py,
benchmarks/bench_fs_durability.py): a writer process that makes data durable on a bftfs mount and logs, OUTSIDE
the mount, every operation it saw fsync return for; a checker that says whether every logged byte is there; and
one crash round (writer running, every replica SIGKILLed at once, replicas restarted) that both scripts share.

Nothing here knows how the cluster is run: a round gets `kill_replicas` and `restart_replicas` callables, so the
test drives its pytest fixtures and the benchmark drives `bftfs cluster start` processes.

The writer (`python3 -m harness.durability writer --dir D --log L --seed S --stop STOPFILE`) cycles through
  append   a record to one of three files: a0 is opened O_APPEND (the client's direct-I/O append path), a1 and a2
           are written at their end through the page cache; each record is write() then fsync()
  replace  a new version of r0 or r1: write r<j>.tmp, fsync it, rename it over r<j>, fsync the directory
  create   a new file n<k> (O_EXCL), written, fsynced, closed, then the directory fsynced
and after each one appends a line to the log ("A file seq end", "R j version", "N k"). Records are
deterministic functions of (seed, file, number), with sizes from a few bytes to several pages and unaligned, so
the checker can rebuild every expected byte. Any error ends the writer with an "ERR" line and exit status 1: on
a hard mount no operation may fail because replicas were down. The log is appended with one write() per line, so
a killed writer never leaves half a line (the log's own durability is the local file system's; the writer is
never crashed with the machine).

Checking (check_dir): for every append file, the logged records must be its first bytes, byte for byte, and
whatever follows must continue the same stream (anything else is data nobody wrote); for r0/r1, the content must
be one whole version not older than the last logged; every logged n<k> must exist with its exact content. With
`exact=True` (the writer exited cleanly, so it logged every operation it made) the directory must hold exactly
the logged state: nothing more, nothing less.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from harness.binaries import REPO
from harness.waiting import wait_until

APPEND_FILES = 3          # a0 (O_APPEND), a1, a2
REPLACE_FILES = 2         # r0, r1
CYCLE = ("append", "append", "replace", "append", "create", "append", "append", "replace")


# ---------------------------------------------------------------------------------------------------------
# Deterministic contents


def _body(seed: int, kind: str, index: int, number: int) -> bytes:
    """The pseudo-random bytes of one record: a size from 1 byte to about 300 KB (rarely a multiple of anything;
    large ones keep data in flight longer, so a kill is likelier to find unsynced writes), then bytes from a PRNG
    seeded by all four arguments."""
    rng = random.Random(f"{seed}/{kind}/{index}/{number}")
    size = rng.choice((rng.randint(1, 64), rng.randint(65, 4095), rng.randint(4096, 13000),
                       rng.randint(13001, 40000), rng.randint(100000, 300000)))
    return rng.randbytes(size)


def append_record(seed: int, file: int, seq: int) -> bytes:
    """Record `seq` of append file `file`: a readable header (so a hexdump of a broken file says which record it
    is), the body, and its digest."""
    body = _body(seed, "a", file, seq)
    return (f"<a{file} #{seq} {len(body)}>".encode() + body +
            f"<{hashlib.sha256(body).hexdigest()[:16]}>\n".encode())


def replace_content(seed: int, file: int, version: int) -> bytes:
    body = _body(seed, "r", file, version)
    return f"r{file} version {version}\n".encode() + body


def create_content(seed: int, k: int) -> bytes:
    return f"n{k}\n".encode() + _body(seed, "n", k, 0)


def replace_version_of(data: bytes, file: int) -> int | None:
    """The version number a replace file's content claims in its first line, or None."""
    first, sep, _ = data.partition(b"\n")
    prefix = f"r{file} version ".encode()
    if not sep or not first.startswith(prefix) or not first[len(prefix):].isdigit():
        return None
    return int(first[len(prefix):])


# ---------------------------------------------------------------------------------------------------------
# The writer process


def _log_line(fd: int, line: str) -> None:
    data = (line + "\n").encode()
    assert os.write(fd, data) == len(data)  # O_APPEND on a local file: one write, never split


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        assert n > 0
        view = view[n:]


def writer_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python3 -m harness.durability writer")
    p.add_argument("--dir", required=True, type=Path, help="directory on the mount (created)")
    p.add_argument("--log", required=True, type=Path, help="log of fsynced operations, outside the mount")
    p.add_argument("--seed", required=True, type=int)
    p.add_argument("--stop", required=True, type=Path, help="the writer exits cleanly once this file exists")
    p.add_argument("--max-ops", type=int, default=100000)
    a = p.parse_args(argv)
    log = os.open(a.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    _log_line(log, f"START pid {os.getpid()} seed {a.seed}")
    try:
        a.dir.mkdir()
        _fsync_dir(a.dir.parent)
        fds = [os.open(a.dir / f"a{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_APPEND if i == 0 else 0),
                       0o644) for i in range(APPEND_FILES)]
        _fsync_dir(a.dir)
        seqs = [0] * APPEND_FILES
        ends = [0] * APPEND_FILES
        versions = [0] * REPLACE_FILES
        created = 0
        for op in range(a.max_ops):
            if a.stop.exists():
                break
            kind = CYCLE[op % len(CYCLE)]
            if kind == "append":
                i = (op // len(CYCLE) + op) % APPEND_FILES
                rec = append_record(a.seed, i, seqs[i])
                _write_all(fds[i], rec)
                os.fsync(fds[i])
                ends[i] += len(rec)
                _log_line(log, f"A {i} {seqs[i]} {ends[i]}")
                seqs[i] += 1
            elif kind == "replace":
                j = (op // len(CYCLE)) % REPLACE_FILES
                tmp = a.dir / f"r{j}.tmp"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    _write_all(fd, replace_content(a.seed, j, versions[j]))
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.rename(tmp, a.dir / f"r{j}")
                _fsync_dir(a.dir)
                _log_line(log, f"R {j} {versions[j]}")
                versions[j] += 1
            else:
                fd = os.open(a.dir / f"n{created}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    _write_all(fd, create_content(a.seed, created))
                    os.fsync(fd)
                finally:
                    os.close(fd)
                _fsync_dir(a.dir)
                _log_line(log, f"N {created}")
                created += 1
        for fd in fds:
            os.close(fd)
    except OSError as e:
        _log_line(log, f"ERR {e!r}")
        return 1
    _log_line(log, "EXIT clean")
    return 0


# ---------------------------------------------------------------------------------------------------------
# The log and the checker


@dataclasses.dataclass
class Logged:
    """What a writer's log says it made durable."""
    appends: list[int]                 # per append file: records fsynced (seq 0 .. n-1)
    versions: list[int | None]         # per replace file: last version whose rename and dir fsync returned
    created: int                       # n0 .. n<created-1> exist durably
    started: bool = False
    clean_exit: bool = False
    error: str = ""

    @property
    def records(self) -> int:
        return sum(self.appends) + sum(1 + v for v in self.versions if v is not None) + self.created


def read_log(path: Path) -> Logged:
    logged = Logged([0] * APPEND_FILES, [None] * REPLACE_FILES, 0)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return logged
    for line in text.splitlines():
        w = line.split()
        if not w:
            continue
        if w[0] == "START":
            logged.started = True
        elif w[0] == "A":
            i, seq = int(w[1]), int(w[2])
            assert seq == logged.appends[i], f"{path}: append record out of order: {line!r}"
            logged.appends[i] = seq + 1
        elif w[0] == "R":
            j, v = int(w[1]), int(w[2])
            logged.versions[j] = v
        elif w[0] == "N":
            k = int(w[1])
            assert k == logged.created, f"{path}: created file out of order: {line!r}"
            logged.created = k + 1
        elif w[0] == "EXIT":
            logged.clean_exit = True
        elif w[0] == "ERR":
            logged.error = line
    return logged


@dataclasses.dataclass
class Check:
    records_logged: int = 0
    records_found: int = 0
    bytes_logged: int = 0
    bytes_found: int = 0
    estale_retries: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)

    def ok(self) -> bool:
        return not self.problems and self.records_found == self.records_logged


def _first_difference(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    for k in range(n):
        if a[k] != b[k]:
            return k
    return n


def _read_replaced(path: Path, c: "Check") -> bytes:
    """Reads a file the writer may be replacing by rename at this moment. A read through the mount can then
    fail with ESTALE: the client's open raced with the rename and did not hide the old file (a known client
    race, reproduced with `bftfs mount --local` too; counted in Check.estale_retries). Like an NFS client, retry
    the open; the file's durability is not in question."""
    for _ in range(50):
        try:
            return path.read_bytes()
        except OSError as e:
            if e.errno != errno.ESTALE:
                raise
            c.estale_retries += 1
    return path.read_bytes()


def check_dir(d: Path, logged: Logged, seed: int, exact: bool) -> Check:
    """Reads every file of a writer's directory (through the mount) and compares it with what the log says was
    made durable; see the module docstring for the rules."""
    c = Check()
    c.records_logged = logged.records
    expected_names: set[str] = set()
    for i in range(APPEND_FILES):
        _check_append_file(d, i, logged, seed, exact, c, expected_names)
    for j in range(REPLACE_FILES):
        _check_replace_file(d, j, logged, seed, exact, c, expected_names)
    for k in range(logged.created):
        _check_created_file(d, k, seed, c, expected_names)
    _check_other_names(d, logged, seed, exact, c, expected_names)
    return c


def _check_append_file(d: Path, i: int, logged: Logged, seed: int, exact: bool, c: Check,
                       expected_names: set[str]) -> None:
    """Append file a<i>: the logged records are its first bytes, and what follows continues the stream."""
    name = f"a{i}"
    expected_names.add(name)
    want = b"".join(append_record(seed, i, s) for s in range(logged.appends[i]))
    c.bytes_logged += len(want)
    try:
        got = (d / name).read_bytes()
    except FileNotFoundError:
        if logged.appends[i] or exact:
            c.problems.append(f"{name}: missing")
        return
    if got[:len(want)] != want:
        k = _first_difference(got, want)
        c.problems.append(f"{name}: {len(got)} bytes; the {logged.appends[i]} fsynced records "
                          f"({len(want)} bytes) differ at byte {k}")
        # Count the whole records that are there.
        end = 0
        for s in range(logged.appends[i]):
            end += len(append_record(seed, i, s))
            if end > k:
                break
            c.records_found += 1
            c.bytes_found += len(append_record(seed, i, s))
        return
    c.records_found += logged.appends[i]
    c.bytes_found += len(want)
    # What follows must continue the stream: a suffix of records the writer wrote but did not log.
    tail = got[len(want):]
    s, stream = logged.appends[i], b""
    while len(stream) < len(tail):
        stream += append_record(seed, i, s)
        s += 1
    if tail != stream[:len(tail)]:
        c.problems.append(f"{name}: {len(tail)} bytes after the fsynced records are not what was written next "
                          f"(first difference at byte {len(want) + _first_difference(tail, stream)})")
    elif exact and tail:
        c.problems.append(f"{name}: {len(tail)} bytes after the last logged record although the writer "
                          f"logged every operation it made")


def _check_replace_file(d: Path, j: int, logged: Logged, seed: int, exact: bool, c: Check,
                        expected_names: set[str]) -> None:
    """Replace file r<j>: one whole version, not older than the last logged (exactly it when `exact`)."""
    name, v = f"r{j}", logged.versions[j]
    try:
        got = _read_replaced(d / name, c)
    except FileNotFoundError:
        if v is not None:
            c.problems.append(f"{name}: missing (version {v} was renamed into place and the directory fsynced)")
        return
    expected_names.add(name)
    have = replace_version_of(got, j)
    if have is None or got != replace_content(seed, j, have):
        c.problems.append(f"{name}: {len(got)} bytes that are no whole version (first line {got[:40]!r})")
    elif v is not None and have < v:
        c.problems.append(f"{name}: version {have}, older than the durable version {v}")
    elif exact and v is not None and have != v:
        c.problems.append(f"{name}: version {have}, but the last one written was {v}")
    elif v is not None:
        # Every logged version was durable in turn; the last one (or a newer one) is here.
        c.records_found += 1 + v
        c.bytes_found += len(replace_content(seed, j, v))
    if v is not None:
        c.bytes_logged += len(replace_content(seed, j, v))


def _check_created_file(d: Path, k: int, seed: int, c: Check, expected_names: set[str]) -> None:
    """Created file n<k> (logged): it exists with its exact content."""
    name = f"n{k}"
    expected_names.add(name)
    want = create_content(seed, k)
    c.bytes_logged += len(want)
    try:
        got = (d / name).read_bytes()
    except FileNotFoundError:
        c.problems.append(f"{name}: missing (created, fsynced, directory fsynced)")
        return
    if got != want:
        c.problems.append(f"{name}: {len(got)} bytes, expected {len(want)}, differ at byte "
                          f"{_first_difference(got, want)}")
        return
    c.records_found += 1
    c.bytes_found += len(got)


def _check_other_names(d: Path, logged: Logged, seed: int, exact: bool, c: Check,
                       expected_names: set[str]) -> None:
    """Names nobody logged: none when `exact`; otherwise only what a running or killed writer may have made
    after the log was read (n<k> for k at or beyond the logged count, holding a prefix of their content, and a
    replace file's temporary)."""
    extra = set(os.listdir(d)) - expected_names
    if exact:
        if extra:
            c.problems.append(f"names nobody logged: {sorted(extra)}")
        return
    for name in sorted(extra):
        if name in {f"r{j}.tmp" for j in range(REPLACE_FILES)}:
            continue
        k = int(name[1:]) if name[:1] == "n" and name[1:].isdigit() else -1
        if k < logged.created:
            c.problems.append(f"{name}: a name nobody wrote")
            continue
        with contextlib.suppress(FileNotFoundError):
            got = (d / name).read_bytes()
            if got != create_content(seed, k)[:len(got)]:
                c.problems.append(f"{name} (not logged yet) holds bytes nobody wrote")


# ---------------------------------------------------------------------------------------------------------
# One crash round


@dataclasses.dataclass
class Round:
    index: int
    seed: int
    kill_after_records: int
    records_fsynced_at_kill: int = 0
    records_fsynced: int = 0
    records_found: int = 0
    bytes_fsynced: int = 0
    bytes_found: int = 0
    restart_s: float = 0.0            # restart_replicas() call until it returned (replicas ready)
    recover_s: float = 0.0            # replicas ready until the writer's next fsync returned
    down_s: float = 0.0               # SIGKILL until replicas ready
    estale_retries: int = 0           # reads of a file being replaced that the checker had to retry
    check_after_restart: list[str] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)

    def as_json(self) -> dict:
        return dataclasses.asdict(self)


class Writer:
    """A writer process in its own session, on `directory` (created by the writer), logging to `log`."""

    def __init__(self, directory: Path, log: Path, stop: Path, seed: int) -> None:
        self.directory, self.log, self.stop_file, self.seed = directory, log, stop, seed
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen([sys.executable, "-m", "harness.durability", "writer", "--dir", str(directory),
                                      "--log", str(log), "--seed", str(seed), "--stop", str(stop)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     env=env, start_new_session=True)

    def logged(self) -> Logged:
        return read_log(self.log)

    def stop(self, timeout_s: float) -> int:
        """Asks the writer to finish its operation in progress and exit; returns its exit status."""
        self.stop_file.touch()
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"writer {self.proc.pid} did not exit within {timeout_s} s of being asked; "
                                 f"log tail {self.log.read_text()[-300:]!r}") from None

    def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stderr(self) -> str:
        return self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""


def _poll(predicate: Callable[[], object], timeout_s: float, what: str) -> object:
    return wait_until(predicate, timeout_s, what, interval_s=0.01)


def _kill_moment(writer: Writer, seed: int) -> None:
    """Waits for the moment to kill: after a seeded delay of 0-150 ms (so kills land in different phases of an
    operation), either right away (odd seeds) or right after the writer's log grows (even seeds), spinning
    without sleeping, so that the kill follows within a fraction of a millisecond an fsync that has just
    returned: if the data of that fsync were not yet where fsync promised, this is when they are lost."""
    time.sleep(random.Random(seed).uniform(0.0, 0.15))
    if seed % 2:
        return
    size = writer.log.stat().st_size
    deadline = time.monotonic() + 5.0
    while writer.log.stat().st_size == size and time.monotonic() < deadline and writer.proc.poll() is None:
        pass


def _await_kill_moment(writer: Writer, kill_after_records: int, seed: int, timeout_s: float) -> None:
    """Returns at the moment to kill: once `writer` has logged `kill_after_records` durable operations, plus
    the seeded delay of _kill_moment. A writer that exits before is a failure (AssertionError)."""
    _poll(lambda: writer.logged().records >= kill_after_records or writer.proc.poll() is not None, timeout_s,
          f"writer to log {kill_after_records} durable operations")
    if writer.proc.poll() is not None:
        raise AssertionError(f"writer exited early ({writer.proc.returncode}): {writer.logged().error} "
                             f"{writer.stderr()[-2000:]}")
    _kill_moment(writer, seed)


def run_round(index: int, mnt_dir: Path, work: Path, seed: int, kill_after_records: int,
              kill_replicas: Callable[[], None], restart_replicas: Callable[[], None],
              while_down: Callable[[Writer], None] | None = None, records_after_restart: int = 10,
              timeout_s: float = 60.0) -> Round:
    """One crash round: a writer on mnt_dir/round<index>; once it has logged `kill_after_records` durable
    operations (plus a seeded delay of 0-150 ms, so the kill lands in different phases of an operation), every
    replica is SIGKILLed by `kill_replicas`; `while_down(writer)` runs while they are down; `restart_replicas`
    brings them back on the same data directories and returns once they are ready. The writer must then carry on
    by itself (its blocked operation completes: a hard mount); the files are checked against the log right after
    that, and again, exactly, after `records_after_restart` more operations and a clean exit of the writer."""
    r = Round(index, seed, kill_after_records)
    log = work / f"round{index}.log"
    stop = work / f"round{index}.stop"
    writer = Writer(mnt_dir / f"round{index}", log, stop, seed)
    try:
        _await_kill_moment(writer, kill_after_records, seed, timeout_s)
        t_kill = time.monotonic()
        kill_replicas()
        at_kill = writer.logged()
        r.records_fsynced_at_kill = at_kill.records
        if while_down is not None:
            while_down(writer)
        t0 = time.monotonic()
        restart_replicas()
        t_ready = time.monotonic()
        r.restart_s, r.down_s = t_ready - t0, t_ready - t_kill
        base = writer.logged().records
        _poll(lambda: writer.logged().records > base or writer.proc.poll() is not None, timeout_s,
              "the writer's blocked operation to complete after the restart")
        r.recover_s = time.monotonic() - t_ready
        if writer.proc.poll() is not None:
            raise AssertionError(f"writer exited ({writer.proc.returncode}) after the restart: "
                                 f"{writer.logged().error} {writer.stderr()[-2000:]}")
        # Everything durable before the kill (and since) is there now, with the writer still running.
        early = check_dir(writer.directory, at_kill, seed, exact=False)
        r.estale_retries = early.estale_retries
        r.check_after_restart = early.problems + ([] if early.ok() else
                                                  [f"{early.records_found} of {early.records_logged} found"])
        _poll(lambda: writer.logged().records >= base + records_after_restart or writer.proc.poll() is not None,
              timeout_s, f"{records_after_restart} more durable operations after the restart")
        code = writer.stop(timeout_s)
        final = writer.logged()
        if code != 0 or not final.clean_exit:
            r.problems.append(f"writer exit {code}: {final.error} {writer.stderr()[-2000:]}")
        c = check_dir(writer.directory, final, seed, exact=final.clean_exit)
        r.records_fsynced, r.records_found = c.records_logged, c.records_found
        r.bytes_fsynced, r.bytes_found = c.bytes_logged, c.bytes_found
        r.problems += [f"right after the restart: {p}" for p in r.check_after_restart] + c.problems
        return r
    finally:
        writer.kill()


def run_total_crash_round(index: int, mnt_dir: Path, work: Path, seed: int, kill_after_records: int,
                          kill_everything: Callable[[], None], restart_everything: Callable[[], Path],
                          timeout_s: float = 60.0) -> Round:
    """A crash of everything at once: every replica, the relay and the mount daemon get SIGKILL together (then
    the writer, whose mount is gone), so no process outside the replicas' data directories holds a byte the
    writer wrote; `restart_everything` restarts them and returns the new mount point. Every operation the
    writer logged must then be there: its fsync returned only once the replicas had the data. Nothing else is
    promised for unlogged writes, except that the files hold only bytes the writer wrote, where it wrote them.
    restart_s is the restart until the new mount is up; recover_s the first full read of the files after it."""
    r = Round(index, seed, kill_after_records)
    log = work / f"round{index}.log"
    writer = Writer(mnt_dir / f"round{index}", log, work / f"round{index}.stop", seed)
    try:
        _await_kill_moment(writer, kill_after_records, seed, timeout_s)
        t_kill = time.monotonic()
        kill_everything()
        writer.kill()
        logged = writer.logged()
        r.records_fsynced_at_kill = logged.records
        t0 = time.monotonic()
        new_mnt = restart_everything()
        t_ready = time.monotonic()
        r.restart_s, r.down_s = t_ready - t0, t_ready - t_kill
        c = check_dir(new_mnt / f"round{index}", logged, seed, exact=False)
        r.recover_s = time.monotonic() - t_ready
        r.records_fsynced, r.records_found = c.records_logged, c.records_found
        r.bytes_fsynced, r.bytes_found = c.bytes_logged, c.bytes_found
        r.estale_retries = c.estale_retries
        r.problems += c.problems
        return r
    finally:
        writer.kill()


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "writer":
        sys.exit(writer_main(sys.argv[2:]))
    print("usage: python3 -m harness.durability writer --dir D --log L --seed S --stop FILE", file=sys.stderr)
    sys.exit(2)
