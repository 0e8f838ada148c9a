"""One long-running bftfs process (a replica, NO-REP, the relay, a mount daemon) and its readiness.

Contract used from the daemons (runtime/status_file.h): `bftfs replica`, `bftfs norep` and `bftfs relay` write
<data dir>/status.json -- one JSON object, replaced atomically, refreshed about every 500 ms -- with at least
"pid" and "running". A daemon is ready when its file names its own pid (so a stale file from an earlier
incarnation never counts) and "running" is true; this is the rule `bftfs cluster start` uses too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Sequence

from harness.waiting import POLL_S, wait_until

STATUS_FILE = "status.json"
READY_TIMEOUT_S = float(os.environ.get("BFTFS_READY_TIMEOUT_S", "30"))
STOP_TIMEOUT_S = 5.0

# A log line that reports an error: the daemons' ERROR level, a sanitizer report, an uncaught exception.
ERROR_LINE = re.compile(r"^\S+\s+ERROR\b|^==\d+==ERROR|runtime error:|^terminate called")

# Every daemon started and not yet stopped, so that nothing outlives the process that started it even when a
# caller's own cleanup was skipped (kill_every_daemon).
_LIVE: set["Daemon"] = set()


def kill_every_daemon() -> None:
    """SIGKILL to every daemon started in this process and not stopped since (the last line of defence)."""
    for daemon in list(_LIVE):
        daemon.kill()


class Daemon:
    """One background process in its own process group (so stop() and kill() reach its children too), started
    after `prefix` (e.g. `ip netns exec NS`), its stdout and stderr appended to `log_path`, its readiness read
    from `data_dir`/status.json. Not copyable; one process at a time (start again after stop or kill)."""

    def __init__(self, name: str, argv: Sequence[object], log_path: Path, data_dir: Path | None = None,
                 prefix: Sequence[str] = ()) -> None:
        self.name = name
        self.argv = list(prefix) + [str(a) for a in argv]
        self.log_path = log_path
        self.data_dir = data_dir
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def status_path(self) -> Path | None:
        return self.data_dir / STATUS_FILE if self.data_dir else None

    def start(self) -> "Daemon":
        """Starts the process (not running before). A status.json left by an earlier incarnation is removed
        first: readiness must be the new process's word."""
        assert not self.alive(), f"{self.name} is already running"
        if self.data_dir:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                (self.data_dir / STATUS_FILE).unlink()
        with open(self.log_path, "ab") as log:
            log.write(f"---- start {self.starts}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.starts += 1
        _LIVE.add(self)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> dict | None:
        """The daemon's status.json, or None if absent, unreadable, or written by another pid (stale)."""
        path = self.status_path
        if path is None or self.proc is None:
            return None
        try:
            value = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(value, dict) or value.get("pid") != self.proc.pid:
            return None
        return value

    def is_ready(self) -> bool:
        """Ready: running, and its own status.json says "running": true. Raises if the process died."""
        if not self.alive():
            code = self.proc.returncode if self.proc else None
            raise RuntimeError(f"{self.name} is not running (exit code {code}); log tail:\n{self.log_tail()}")
        status = self.status()
        return status is not None and status.get("running") is True

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Polls until is_ready(); TimeoutError with the log's tail after `timeout_s`."""
        try:
            wait_until(self.is_ready, timeout_s, f"{self.name} to write a ready {self.status_path}")
        except TimeoutError as e:
            raise TimeoutError(f"{e}; log tail:\n{self.log_tail()}") from None

    def signal_group(self, sig: int) -> None:
        """Sends `sig` to the daemon's process group; nothing once the process has been reaped (its group id
        may then belong to an unrelated process)."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def _wait_exit_unreaped(self, timeout_s: float) -> bool:
        """Waits until the leader exits without reaping it (it stays a zombie holding the group id)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM to the group (after SIGCONT, in case it was stopped), SIGKILL after `timeout_s`; then SIGKILL
        to whatever else is left in the group. Returns the exit code (None if never started)."""
        if self.proc is None:
            return None
        if self.proc.returncode is None:  # not reaped yet: the group id is still ours
            self.signal_group(signal.SIGCONT)
            self.signal_group(signal.SIGTERM)
            self._wait_exit_unreaped(timeout_s)
            self.signal_group(signal.SIGKILL)
            self.proc.wait()
        _LIVE.discard(self)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL to the group, as in a crash: the daemon gets no chance to clean up. Reaps it."""
        if self.proc is not None and self.proc.returncode is None:
            self.signal_group(signal.SIGKILL)
            self.proc.wait()
        _LIVE.discard(self)

    def _forget(self) -> None:
        """Drops this daemon from the registry of running ones (for subclasses that reap it themselves)."""
        _LIVE.discard(self)

    def restart(self, wait_ready: bool = True) -> None:
        """stop(), then start() with the same arguments (and wait_ready() unless told not to)."""
        self.stop()
        self.start()
        if wait_ready:
            self.wait_ready()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def error_lines(self) -> list[str]:
        return [line for line in self.log_text().splitlines() if ERROR_LINE.search(line)]


def kill_all(daemons: Sequence[Daemon]) -> None:
    """SIGKILL every daemon's process group first, then reap them all, so the crashes are near-simultaneous."""
    for d in daemons:
        d.signal_group(signal.SIGKILL)
    for d in daemons:
        d.kill()  # reaps (and re-signals harmlessly)
