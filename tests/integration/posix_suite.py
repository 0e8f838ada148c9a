"""The POSIX conformance suite's fixtures and helpers (tests/integration/test_posix_*.py load this module with
`pytest_plugins = ["posix_suite"]`); the processes are the harness's (harness/).

The suite checks that a bftfs mount behaves like a local POSIX file system, broadly and not only on the paths
the benchmarks take (conformance suites and file-system exercisers will be run against it by others). Every
expectation is first validated against native Linux file systems (ext4 and tmpfs) with

    BFTFS_POSIX_DIR=/var/tmp/posix python3 -m pytest -q tests/integration -k posix
    BFTFS_POSIX_DIR=/dev/shm/posix python3 -m pytest -q tests/integration -k posix

an expectation that native Linux does not meet is a wrong test, not a finding.

Where the suite runs (the session fixture `posix_root`):
  BFTFS_POSIX_DIR=DIR   a fresh subdirectory of DIR (any file system), removed at the end
  (default)             `bftfs mount --local DATA MNT` (the file service in-process, no network) in a fresh
                        temporary directory, unmounted at the end; BFTFS_MOUNT_ARGS adds options. The tests are
                        SKIPPED with the reason when `bftfs` is not built or has no `mount --local` yet.
  BFTFS_POSIX_MOUNT=pbft   the replicated file system instead: `bftfs cluster start --service fs` (4 replicas
                        with the shim, and the relay), then `bftfs mount --relay`; stopped at the end.
  BFTFS_POSIX_MOUNT=norep  the same through one unreplicated NO-REP server (`cluster start --norep`).
  BFTFS_POSIX_KEEP=1    keep the work directory (the mount's and the replicas' logs) at the end.

Each test gets `d`, a fresh empty directory (mode 0755, owned by root) under the session root, so tests never
see each other's files. Unprivileged callers are real processes: `as_user(USER_A, fn, ...)` (harness.users)
forks, drops to the user's uid, gid and groups (setgroups/setresgid/setresuid), runs fn and returns its value or
re-raises its OSError with the same errno, so a permission test reads
`with raises_errno(EACCES): as_user(USER_B, open_rw, p)`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import shutil
import signal
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from harness.binaries import build_dir
from harness.cli_cluster import CliCluster
from harness.mount import Mount, is_mountpoint, mount_supported
from harness.users import User

# ---------------------------------------------------------------------------------------------------------
# Users. Numbers chosen to collide with nothing on a test machine; they need no /etc/passwd entries because the
# suite sets credentials directly.


ROOT = User(0, 0, (0,))
GROUP_SHARED = 47200          # a group USER_A and USER_B are both in (as a supplementary group)
GROUP_C_ONLY = 47203          # a group only USER_C is in
USER_A = User(47101, 47101, (47101, GROUP_SHARED))
USER_B = User(47102, 47102, (47102, GROUP_SHARED))
USER_C = User(47103, 47103, (47103, GROUP_C_ONLY))


@contextlib.contextmanager
def raises_errno(*codes: int) -> Iterator[None]:
    """Asserts that the block raises OSError with one of `codes` (errno values)."""
    names = "/".join(errno.errorcode.get(c, str(c)) for c in codes)
    try:
        yield
    except OSError as e:
        assert e.errno in codes, f"expected {names}, got {errno.errorcode.get(e.errno, e.errno)}: {e}"
    else:
        raise AssertionError(f"expected {names}, but the call succeeded")


# ---------------------------------------------------------------------------------------------------------
# Small file helpers (module-level so that as_user can run them in a child)


def write_file(path, data: bytes = b"", mode: int = 0o644) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def read_file(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def open_close(path, flags: int, mode: int = 0o644) -> None:
    os.close(os.open(path, flags, mode))


def pread_all(fd: int, size: int, offset: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        chunk = os.pread(fd, size - len(out), offset + len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def clock_tick() -> None:
    """Lets the file system's clock move on before an operation whose timestamps a test compares with earlier
    ones: kernels stamp times with a coarse clock (one jiffy, up to 10 ms), and a replicated service stamps
    them with the primary's clock. This is not a timing assertion: only the order of the stamps is checked."""
    time.sleep(0.03)


def ns(st: os.stat_result, which: str) -> int:
    return getattr(st, f"st_{which}_ns")


# ---------------------------------------------------------------------------------------------------------
# renameat2 (Python has no binding)

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
AT_FDCWD = -100
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def renameat2(old, new, flags: int) -> None:
    fn = _libc.renameat2
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(AT_FDCWD, os.fsencode(old), AT_FDCWD, os.fsencode(new), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), str(old), None, str(new))


# ---------------------------------------------------------------------------------------------------------
# Where the suite runs


def _searchable_by_others(path: Path) -> bool:
    """True if every ancestor of `path` has the search bit for others (unprivileged tests need to reach it)."""
    for p in [path, *path.parents]:
        if not os.stat(p).st_mode & stat.S_IXOTH:
            return False
    return True


class LocalMount:
    """`bftfs mount --local DATA MNT` for the session (or, with `cluster` = "pbft" or "norep", a cluster
    started by `bftfs cluster start --service fs` and `bftfs mount --relay`). Readiness is MNT becoming a
    mount point. close() always unmounts and stops every process it started."""

    def __init__(self, bftfs: Path, root: Path, cluster: str | None = None) -> None:
        self.root = root
        self.data = root / "data"
        self.mnt = root / "mnt"
        self.data.mkdir()
        self.mnt.mkdir()
        self.cluster = (CliCluster(bftfs, root / "cluster", service="fs", norep=cluster == "norep", ports=6)
                        if cluster else None)
        extra = os.environ.get("BFTFS_MOUNT_ARGS", "").split()
        backend = ["--relay", self.cluster.relay_sock] if self.cluster else ["--local", self.data]
        self.mount = Mount(bftfs, self.mnt, root / "mount.log", backend, extra)

    def start(self) -> None:
        try:
            if self.cluster:
                self.cluster.start()
            self.mount.start()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        # Mount.stop: `bftfs umount` waits for the daemon to make its writes final; a daemon whose backend is
        # stuck (a finding) would keep it waiting: then the mount is detached and the daemon stopped (SIGTERM
        # gives its writes 10 s, then it exits and says what it lost).
        self.mount.stop()
        if self.cluster is not None:
            self.cluster.stop()


@pytest.fixture(scope="session")
def posix_root() -> Iterator[Path]:
    """The directory every POSIX test works under (see the module docstring)."""
    old_umask = os.umask(0o022)
    base = os.environ.get("BFTFS_POSIX_DIR")
    try:
        if base:
            Path(base).mkdir(parents=True, exist_ok=True)
            root = Path(tempfile.mkdtemp(prefix="posix-", dir=base))
            os.chmod(root, 0o755)
            try:
                yield root
            finally:
                shutil.rmtree(root, ignore_errors=True)
            return
        bftfs = build_dir() / "cli" / "bftfs"
        if not os.access(bftfs, os.X_OK):
            pytest.skip(f"{bftfs} is not built (run `make`), and BFTFS_POSIX_DIR is not set")
        ok, why = mount_supported(bftfs)
        if not ok:
            pytest.skip(why)
        if not os.path.exists("/dev/fuse"):
            pytest.skip("/dev/fuse does not exist (FUSE is not available on this machine)")
        # Not under pytest's tmp_path: that is mode 0700, and unprivileged tests must reach the mount.
        work = Path(tempfile.mkdtemp(prefix="bftfs-posix-", dir="/var/tmp"))
        os.chmod(work, 0o755)
        cluster = os.environ.get("BFTFS_POSIX_MOUNT") or None
        if cluster not in (None, "local", "pbft", "norep"):
            raise ValueError(f"BFTFS_POSIX_MOUNT={cluster}: expected local, pbft or norep")
        mount = LocalMount(bftfs, work, None if cluster == "local" else cluster)
        try:
            mount.start()
            root = mount.mnt / "posix"
            root.mkdir()
            os.chmod(root, 0o755)
            yield root
        finally:
            mount.close()
            if os.environ.get("BFTFS_POSIX_KEEP"):
                print(f"\nposix suite: kept {work} (BFTFS_POSIX_KEEP): mount.log, cluster/*.log")
            elif not is_mountpoint(mount.mnt):
                shutil.rmtree(work, ignore_errors=True)
    finally:
        os.umask(old_umask)


TEST_TIMEOUT_S = float(os.environ.get("BFTFS_POSIX_TEST_TIMEOUT_S", "120"))


class PosixTestHung(Exception):
    """A POSIX test ran longer than TEST_TIMEOUT_S (a system call that never returns)."""


@pytest.fixture(autouse=True)
def _hang_guard(request):
    """Every POSIX test gets TEST_TIMEOUT_S (SIGALRM interrupts a system call blocked in the mount; the bftfs
    client answers FUSE interrupts with EINTR). Afterwards a statfs of the session root must answer within the
    same time: a mount whose backend died retries forever, like an NFS hard mount, and would hang every later
    test, so the session stops instead, naming the test after which the mount stopped answering."""
    if "posix_root" not in request.fixturenames:
        yield
        return

    def on_alarm(signum, frame):
        raise PosixTestHung(f"{request.node.nodeid} still running after {TEST_TIMEOUT_S:.0f}s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    root = request.getfixturevalue("posix_root")
    done = threading.Event()

    def probe():
        with contextlib.suppress(OSError):
            os.statvfs(root)
        done.set()

    threading.Thread(target=probe, daemon=True).start()
    if not done.wait(TEST_TIMEOUT_S):
        pytest.exit(f"{root} stopped answering (statfs hung for {TEST_TIMEOUT_S:.0f}s) after "
                    f"{request.node.nodeid}; the rest of the POSIX suite cannot run", returncode=3)


_counter = iter(range(1 << 30))


@pytest.fixture
def d(posix_root: Path, request) -> Path:
    """A fresh empty directory for one test (mode 0755, owned by root)."""
    name = f"{next(_counter):04d}-{request.node.name}"[:200]
    for ch in "[]/ ":
        name = name.replace(ch, "_")
    path = posix_root / name
    path.mkdir()
    os.chmod(path, 0o755)
    return path


@pytest.fixture
def shared_dir(d: Path) -> Path:
    """`d` opened to everyone (mode 0777), for tests where unprivileged users create entries."""
    if not _searchable_by_others(d):
        pytest.skip(f"{d} is not reachable by unprivileged users (an ancestor lacks o+x)")
    os.chmod(d, 0o777)
    return d


def bftfs_bug(finding: str, strict: bool = True):
    """Marks a test that fails on bftfs because of a known bug (tests/integration/POSIX_FINDINGS.md, entry
    `finding`): xfail, strict so that a fixed bug turns the run red until the mark is removed. On a native
    directory (BFTFS_POSIX_DIR) the test runs unmarked. strict=False only for tests that hit a race, where the
    bug shows in most runs but not all."""
    return pytest.mark.xfail(condition=not os.environ.get("BFTFS_POSIX_DIR"), strict=strict,
                             reason=f"bftfs bug: POSIX_FINDINGS.md #{finding}")


def breaks_relay_mount(finding: str):
    """Skips a test on relay mounts (BFTFS_POSIX_MOUNT=pbft|norep) while a known bug makes it take the relay
    down: the mount would then hang every later test (POSIX_FINDINGS.md entry `finding`)."""
    return pytest.mark.skipif(os.environ.get("BFTFS_POSIX_MOUNT") in ("pbft", "norep"),
                              reason=f"kills the relay (POSIX_FINDINGS.md #{finding}); run it on the local mount")


def is_bftfs(path: Path) -> bool:
    """True when the suite runs on a bftfs mount (not BFTFS_POSIX_DIR): for the few checks that concern only
    bftfs (e.g. its exact statfs name limit)."""
    return not os.environ.get("BFTFS_POSIX_DIR")
