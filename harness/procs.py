"""Commands run in their own process group, and what /proc says about running processes.

Every command the harness runs to completion runs in a new session, so that a timeout or an interrupt kills it
with everything it started (make's gcc, a daemon's children); nothing outlives the caller's `finally`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator, Sequence


class HarnessError(RuntimeError):
    """A step failed (a command exited non-zero or hung, a result was wrong): the message says which and why."""


def exit_cleanly_on_sigterm() -> None:
    """Turns SIGTERM and SIGHUP into KeyboardInterrupt, so `with` blocks and `finally` clauses still stop every
    process a script started when make or a CI runner stops it."""
    def handler(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


def run_in_group(argv: Sequence[object], timeout_s: float) -> subprocess.CompletedProcess:
    """Runs `argv` to completion in a new process group, output captured as text. On a timeout or an interrupt
    the whole group is killed; a timeout returns exit status -9 with a note on stderr, an interrupt propagates."""
    done, _ = _run_in_group([str(a) for a in argv], timeout_s)
    return done


def run_checked(argv: Sequence[object], timeout_s: float, what: str) -> str:
    """Runs a short command like run_in_group and returns its stdout; HarnessError with the tail of its output
    if it fails or does not finish within `timeout_s`."""
    argv = [str(a) for a in argv]
    done, timed_out = _run_in_group(argv, timeout_s)
    if timed_out:
        raise HarnessError(f"{what}: `{shlex.join(argv)}` did not finish within {timeout_s:.0f} s")
    if done.returncode != 0:
        raise HarnessError(f"{what}: `{shlex.join(argv)}` exited {done.returncode}:\n"
                           f"{(done.stdout + done.stderr).strip()[-2000:]}")
    return done.stdout


def _run_in_group(argv: list[str], timeout_s: float) -> tuple[subprocess.CompletedProcess, bool]:
    """run_in_group's work; the flag says whether the command was killed for its timeout."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException as exc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        return subprocess.CompletedProcess(argv, -9, out, err + "\n[killed: timeout]"), True
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), False


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to `proc`'s process group (it was started with start_new_session), reap it, and wait until the
    rest of the group (gcc under make) is gone too: until then they may hold files open."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    """The argv `pid` runs with (from /proc; OSError if it is gone)."""
    return [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]


def bftfs_processes() -> Iterator[tuple[int, list[str]]]:
    """(pid, argv) of every running bftfs process."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == "bftfs":
            yield int(entry.name), argv


def mount_daemon_pids(mnt: Path) -> list[int]:
    """The `bftfs mount ... MNT` processes serving `mnt` (found by their command line: a bftfs executable, the
    word mount, and exactly this mount point among its arguments), also when they detached themselves."""
    return [pid for pid, argv in bftfs_processes() if "mount" in argv[1:2] and str(mnt) in argv]


def bftfs_pids(marks: Sequence[str]) -> list[int]:
    """bftfs processes with one of `marks` (a cluster directory, a mount point) in an argument."""
    return [pid for pid, argv in bftfs_processes() if any(m in a for a in argv[1:] for m in marks)]


def process_cpu_s(pid: int) -> float:
    """utime + stime of `pid` (all its threads) in seconds; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
