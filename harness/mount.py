"""A bftfs FUSE mount (`bftfs mount ... -f`): mounted by start(), and always unmounted and stopped by stop(),
also after a failed start or a daemon that no longer answers."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

from harness.daemon import Daemon
from harness.waiting import wait_until

MOUNT_TIMEOUT_S = float(os.environ.get("BFTFS_MOUNT_TIMEOUT_S", "20"))
EXIT_TIMEOUT_S = 20.0     # after the unmount: the daemon finishes its writes in flight, then exits
UMOUNT_TIMEOUT_S = 30.0   # `bftfs umount` waits for the daemon; a daemon whose backend is stuck would keep it


def is_mountpoint(path: Path) -> bool:
    """True if `path` is a mount point, from /proc/self/mountinfo: unlike os.path.ismount this never touches
    the file system, so it neither hangs on a stuck mount nor mistakes a dead one (ENOTCONN) for no mount."""
    target = os.fsencode(path)
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4 and fields[4].replace(b"\\040", b" ") == target:
                return True
    return False


def mount_supported(bftfs: Path) -> tuple[bool, str]:
    """(True, "") if this build's `bftfs` has `mount --local`, else (False, why)."""
    try:
        out = subprocess.run([str(bftfs), "mount", "--help"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"`bftfs mount --help` failed: {e}"
    text = out.stdout + out.stderr
    if out.returncode != 0 or "--local" not in text:
        return False, "`bftfs mount --local` does not exist yet (the FUSE client is not merged into this build)"
    return True, ""


class Mount(Daemon):
    """`bftfs mount BACKEND_ARGS MOUNTPOINT -f --log LOG EXTRA_ARGS` in the foreground, so this object owns the
    daemon: BACKEND_ARGS is ["--local", DIR] or ["--relay", SOCKET]. start() returns once MOUNTPOINT is mounted;
    stop() unmounts and waits for the daemon to exit (killing it and detaching the mount if it does not), and
    leaves nothing behind. Usable as a context manager. With `counters_file` the daemon writes its client
    counters there (`bftfs mount --status`: refreshed while it runs, final at its exit)."""

    def __init__(self, bftfs: Path, mountpoint: Path, log: Path, backend_args: Sequence[object],
                 extra_args: Sequence[object] = (), counters_file: Path | None = None) -> None:
        self.bftfs = bftfs
        self.mountpoint = Path(mountpoint)
        self.log = Path(log)
        self.counters_file = counters_file
        self.fuse_conn: str | None = None
        counters = ["--status", counters_file] if counters_file is not None else []
        super().__init__("mount", [bftfs, "mount", *backend_args, self.mountpoint, "-f", "--log", self.log,
                                   *counters, *extra_args], self.log)

    def start(self, timeout_s: float = MOUNT_TIMEOUT_S) -> "Mount":
        """Starts the daemon and polls until the mount point is mounted. On failure (the daemon exited, or the
        deadline passed) everything is stopped and RuntimeError or TimeoutError says why, with the log."""
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        super().start()

        def mounted() -> bool:
            if is_mountpoint(self.mountpoint):
                return True
            if not self.alive():
                raise RuntimeError(f"bftfs mount exited with {self.proc.returncode}:\n{self.log_tail()}")
            return False

        try:
            wait_until(mounted, timeout_s, f"{self.mountpoint} to be mounted")
        except TimeoutError as e:
            self.stop()
            raise TimeoutError(f"{e}; log tail:\n{self.log_tail()}") from None
        except BaseException:
            self.stop()
            raise
        # The FUSE connection's control directory (/sys/fs/fuse/connections) is named after the device minor.
        self.fuse_conn = str(os.minor(os.stat(self.mountpoint).st_dev))
        return self

    def __enter__(self) -> "Mount":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def restart(self, wait_ready: bool = True) -> None:
        """stop(), then start() again on the same mount point (a remount: the kernel's and the client's caches
        are gone)."""
        self.stop()
        self.start()

    def counters(self) -> dict | None:
        """The client counters in `counters_file` (without "pid"), or None if there are none (yet)."""
        if self.counters_file is None:
            return None
        try:
            value = json.loads(self.counters_file.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(value, dict):
            return None
        value.pop("pid", None)
        return value

    def mounted(self) -> bool:
        return is_mountpoint(self.mountpoint)

    def abort(self) -> None:
        """Aborts the FUSE connection: every blocked and later operation on the mount fails (ENOTCONN). For a
        watchdog that must end a hung file system; stop() still has to follow."""
        if self.fuse_conn is not None:
            with contextlib.suppress(OSError):
                Path(f"/sys/fs/fuse/connections/{self.fuse_conn}/abort").write_text("1")

    def unmount(self) -> None:
        """`bftfs umount`, which waits for the daemon to make its writes final; if the mount is still there
        (busy, or the daemon stuck), `bftfs umount --lazy` detaches it."""
        for lazy in ([], ["--lazy"]):
            if not is_mountpoint(self.mountpoint):
                return
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run([str(self.bftfs), "umount", *lazy, str(self.mountpoint)], capture_output=True,
                               timeout=UMOUNT_TIMEOUT_S)

    def stop(self, timeout_s: float = EXIT_TIMEOUT_S) -> int | None:
        """Unmounts, then waits up to `timeout_s` for the daemon to exit and returns its exit status; a daemon
        that does not exit is stopped (SIGTERM, then SIGKILL) and None is returned. Safe to call again."""
        if self.proc is None:
            return None
        try:
            self.unmount()
            try:
                return self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                super().stop()
                if is_mountpoint(self.mountpoint):
                    subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True, timeout=30)
                return None
        finally:
            self.proc = None
            self.fuse_conn = None
            self._forget()


@contextlib.contextmanager
def relay_mounts(bftfs: Path, relay_sock: Path, log_dir: Path, names: Sequence[str] = ("a", "b"),
                 counters: bool = False, extra_args: Sequence[object] = ()) -> Iterator[list[Mount]]:
    """Mounts of the relay on `relay_sock`, one per name, under a fresh short directory in /tmp (FUSE mount
    points and their sockets must stay short), with logs `log_dir`/NAME.log (and client counters in
    NAME.status.json when `counters`). On exit every mount is stopped and the directory removed; then each
    mount must have exited 0 and logged no ERROR line (AssertionError otherwise, with its log)."""
    top = Path(tempfile.mkdtemp(prefix="bftfs-mnt-"))
    mounts = [Mount(bftfs, top / name, Path(log_dir) / f"{name}.log", ["--relay", str(relay_sock)], extra_args,
                    counters_file=Path(log_dir) / f"{name}.status.json" if counters else None)
              for name in names]
    try:
        for m in mounts:
            m.start()
        yield mounts
    finally:
        codes = [m.stop() for m in mounts]
        shutil.rmtree(top, ignore_errors=True)
    assert codes == [0] * len(mounts), "\n".join(m.log_text() for m in mounts)
    for m in mounts:
        assert not m.error_lines(), m.log_text()
