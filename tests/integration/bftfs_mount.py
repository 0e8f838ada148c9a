"""Helpers for tests that use a bftfs FUSE mount (`bftfs mount`): start and stop a mount, run code as
another user. Any test file may use them (the conformance suites too).

  Mount(bftfs, mountpoint, log, backend_args)   a `bftfs mount ... -f` in its own process group; start()
                                                polls until the mount point is mounted; stop() unmounts and
                                                waits for the daemon to exit (kills it and detaches the mount
                                                if it does not), and always leaves nothing behind
  as_user(uid, gid, fn, groups=())              runs fn() in a forked child with those credentials; returns
                                                fn's value, or the OSError's errno as ("errno", n)
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Sequence

from conftest import wait_until

MOUNT_TIMEOUT_S = 20.0
EXIT_TIMEOUT_S = 20.0


class Mount:
    def __init__(self, bftfs: Path, mountpoint: Path, log: Path, backend_args: Sequence[str],
                 extra_args: Sequence[str] = ()) -> None:
        self.bftfs = bftfs
        self.mountpoint = Path(mountpoint)
        self.log = Path(log)
        self.argv = [str(bftfs), "mount", *backend_args, str(self.mountpoint), "-f", "--log", str(self.log),
                     *extra_args]
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Mount":
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "ab"), start_new_session=True)

        def mounted() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"bftfs mount exited with {self.proc.returncode}:\n{self.log_text()}")
            return os.path.ismount(self.mountpoint)

        wait_until(mounted, MOUNT_TIMEOUT_S, f"{self.mountpoint} to be mounted")
        return self

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def error_lines(self) -> list[str]:
        return [line for line in self.log_text().splitlines() if " ERROR " in line]

    def stop(self) -> int | None:
        """Unmounts and waits for the daemon; returns its exit status (None if it had to be killed)."""
        if self.proc is None:
            return None
        if os.path.ismount(self.mountpoint):
            r = subprocess.run([str(self.bftfs), "umount", str(self.mountpoint)], capture_output=True)
            if r.returncode != 0:
                subprocess.run([str(self.bftfs), "umount", "--lazy", str(self.mountpoint)], capture_output=True)
        try:
            return self.proc.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            if os.path.ismount(self.mountpoint):
                subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True)
            return None
        finally:
            self.proc = None

    def __enter__(self) -> "Mount":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def as_user(uid: int, gid: int, fn: Callable[[], object], groups: Sequence[int] = ()) -> object:
    """Runs fn() in a forked child as (uid, gid, groups). Returns its value (picklable), or ("errno", n) if it
    raised OSError. Any other exception fails the caller with the child's message."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        try:
            os.setgroups(list(groups))
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            try:
                out = ("ok", fn())
            except OSError as e:
                out = ("ok", ("errno", e.errno))
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                out = ("exc", repr(e))
            data = pickle.dumps(out)
        except BaseException as e:  # noqa: BLE001
            data = pickle.dumps(("exc", repr(e)))
        with os.fdopen(w, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "exc":
        raise AssertionError(f"as_user({uid}) child raised {value}")
    return value


def wait_exit(proc: subprocess.Popen, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        if time.monotonic() > deadline:
            raise TimeoutError("process did not exit")
        time.sleep(0.02)
    return proc.returncode
