"""`bftfs mount --local`: the FUSE client on the in-process file service, through real system calls.

What is checked here is the client's own part of POSIX behaviour (the kernel <-> daemon <-> service path):
caching and close-to-open, write-behind and its errors, open-unlinked files (silly rename), credentials and
permissions as seen by non-root users, rename corner cases through the kernel, interrupts, persistence of the
local backend. The broad conformance suite lives in test_posix_*.py (another file set).
"""

from __future__ import annotations

import ctypes
import errno
import os
import random
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from harness.mount import Mount
from harness.users import User, errno_as_user

pytestmark = pytest.mark.fuse

USER_A = (12001, 12001)
USER_B = (12002, 12002)


def as_user(uid: int, gid: int, fn, groups=()):
    """fn() run as (uid, gid, groups): its value, or ("errno", n) if it raised OSError."""
    return errno_as_user(User(uid, gid, tuple(groups)), fn)


libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


def renameat2(src: Path, dst: Path, flags: int) -> int:
    """0, or the errno of renameat2(2)."""
    rc = libc.renameat2(AT_FDCWD, str(src).encode(), AT_FDCWD, str(dst).encode(), flags)
    return 0 if rc == 0 else ctypes.get_errno()


def errno_of(fn) -> int:
    try:
        fn()
    except OSError as e:
        return e.errno
    return 0


@pytest.fixture
def mount(bftfs_bin, tmp_path):
    # The mount point must be reachable by the non-root test users: pytest's tmp_path is not (mode 0700).
    top = Path(tempfile.mkdtemp(prefix="bftfs-mnt-"))
    os.chmod(top, 0o755)
    m = Mount(bftfs_bin, top / "mnt", tmp_path / "mount.log", ["--local", str(tmp_path / "state")])
    m.start()
    try:
        yield m
    finally:
        rc = m.stop()
        shutil.rmtree(top, ignore_errors=True)
        errors = m.error_lines()
        assert rc == 0, f"bftfs mount exited with {rc}:\n{m.log_text()}"
        assert not errors, "ERROR lines in the mount's log:\n" + "\n".join(errors)


@pytest.fixture
def mnt(mount) -> Path:
    return mount.mountpoint


def shared_dir(mnt: Path, name: str = "shared", mode: int = 0o777) -> Path:
    d = mnt / name
    d.mkdir()
    os.chmod(d, mode)
    return d


# ---------------------------------------------------------------------------------------------------------
# Data path


def test_write_read_stat_and_large_io_across_512k_ops(mnt):
    rng = random.Random(5)
    data = rng.randbytes(5 * 1024 * 1024 + 12345)
    p = mnt / "big"
    p.write_bytes(data)
    assert os.stat(p).st_size == len(data)
    assert p.read_bytes() == data
    # 1 MiB writes at odd offsets (each is two 512 KiB WRITE requests) and reads across op bounds.
    fd = os.open(p, os.O_RDWR)
    try:
        chunk = rng.randbytes(1 << 20)
        os.pwrite(fd, chunk, 333333)
        expect = bytearray(data)
        expect[333333:333333 + len(chunk)] = chunk
        os.lseek(fd, 0, os.SEEK_SET)
        assert os.pread(fd, 3 << 20, 100) == bytes(expect[100:100 + (3 << 20)])
    finally:
        os.close(fd)
    assert p.read_bytes() == bytes(expect)


def test_fsx_like_random_operations_match_a_model(mnt):
    """A seeded exerciser: random writes, truncates and reads through two descriptors, checked against a model
    after every read and at the end, also after closing and reopening (which revalidates the cache)."""
    rng = random.Random(1234)
    p = mnt / "fsx"
    model = bytearray()
    fds = [os.open(p, os.O_RDWR | os.O_CREAT, 0o644), os.open(p, os.O_RDWR)]
    try:
        for step in range(400):
            fd = rng.choice(fds)
            op = rng.random()
            if op < 0.45:
                off = rng.randrange(0, 3 << 20)
                buf = rng.randbytes(rng.randrange(1, 300000))
                assert os.pwrite(fd, buf, off) == len(buf)
                if off > len(model):
                    model.extend(b"\0" * (off - len(model)))
                model[off:off + len(buf)] = buf
            elif op < 0.6:
                size = rng.randrange(0, 3 << 20)
                os.ftruncate(fd, size)
                if size < len(model):
                    del model[size:]
                else:
                    model.extend(b"\0" * (size - len(model)))
            else:
                off = rng.randrange(0, max(1, len(model) + 1000))
                n = rng.randrange(1, 400000)
                got = os.pread(fd, n, off)
                assert got == bytes(model[off:off + n]), f"step {step}: read {n} at {off}"
            assert os.fstat(fd).st_size == len(model), f"step {step}"
    finally:
        for fd in fds:
            os.close(fd)
    assert p.read_bytes() == bytes(model)


def test_sparse_file_holes_read_as_zeros_and_use_no_blocks(mnt):
    p = mnt / "sparse"
    with open(p, "wb") as f:
        f.seek(100 << 20)
        f.write(b"tail")
    st = os.stat(p)
    assert st.st_size == (100 << 20) + 4
    assert st.st_blocks * 512 < (1 << 20)
    with open(p, "rb") as f:
        f.seek(50 << 20)
        assert f.read(4096) == b"\0" * 4096
        f.seek(100 << 20)
        assert f.read() == b"tail"


def test_truncate_down_then_up_zero_fills(mnt):
    p = mnt / "t"
    p.write_bytes(b"x" * 200000)
    os.truncate(p, 10)
    os.truncate(p, 70000)
    assert p.read_bytes() == b"x" * 10 + b"\0" * (70000 - 10)
    with open(p, "r+b") as f:
        f.truncate(0)
    assert os.stat(p).st_size == 0


def test_append_descriptors_never_overwrite_each_other(mnt):
    p = mnt / "log"
    a = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    b = os.open(p, os.O_WRONLY | os.O_APPEND)
    try:
        for i in range(50):
            os.write(a, b"a%03d\n" % i)
            os.write(b, b"b%03d\n" % i)
    finally:
        os.close(a)
        os.close(b)
    lines = p.read_bytes().splitlines()
    assert sorted(lines) == sorted([b"a%03d" % i for i in range(50)] + [b"b%03d" % i for i in range(50)])


def test_write_beyond_the_file_size_limit_fails_at_write(mnt):
    """EFBIG from write() itself (beyond the service's 1 TiB limit), not later from close: write-behind must
    not turn a certain failure into a close() error that programs ignore."""
    p = mnt / "huge"
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        assert errno_of(lambda: os.pwrite(fd, b"late", 1 << 41)) == errno.EFBIG
        os.pwrite(fd, b"ok", 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    assert p.read_bytes() == b"ok"


def test_stat_after_close_shows_the_last_writes_mtime(mnt):
    p = mnt / "m"
    p.write_bytes(b"y" * 123)
    for _ in range(20):
        fd = os.open(p, os.O_RDWR)
        before = os.fstat(fd).st_mtime_ns
        os.pwrite(fd, b"Z", 122)
        during = os.fstat(fd).st_mtime_ns
        os.close(fd)
        assert os.stat(p).st_mtime_ns == during
        assert during >= before


def test_non_owner_write_and_truncate_clear_setuid_and_setgid(mnt):
    d = shared_dir(mnt)
    p = d / "suid"
    p.write_bytes(b"abc")
    os.chmod(p, 0o6777)

    def write():
        fd = os.open(p, os.O_WRONLY)
        try:
            os.pwrite(fd, b"x", 0)
        finally:
            os.close(fd)
        os.truncate(p, 2)
        return stat.S_IMODE(os.stat(p).st_mode)

    assert as_user(*USER_A, write) == 0o777
    assert p.read_bytes() == b"xb"


# ---------------------------------------------------------------------------------------------------------
# Names


def test_long_names_and_symlink_targets(mnt):
    ok = "n" * 255
    (mnt / ok).write_bytes(b"1")
    assert ok in os.listdir(mnt)
    assert errno_of(lambda: (mnt / ("n" * 256)).write_bytes(b"1")) == errno.ENAMETOOLONG
    target = "t" * 4000
    os.symlink(target, mnt / "sl")
    assert os.readlink(mnt / "sl") == target
    assert stat.S_ISLNK(os.lstat(mnt / "sl").st_mode)


def test_readdir_lists_every_entry_once_across_many_calls(mnt):
    d = mnt / "many"
    d.mkdir()
    names = {f"file-{i:05d}-{'x' * (i % 40)}" for i in range(1500)}
    for n in names:
        (d / n).touch()
    listed = os.listdir(d)
    assert len(listed) == len(names)
    assert set(listed) == names
    # Removing while listing: each surviving entry still appears exactly once.
    with os.scandir(d) as it:
        seen = []
        for i, e in enumerate(it):
            seen.append(e.name)
            if i == 100:
                for n in sorted(names)[:700]:
                    os.unlink(d / n)
    assert len(seen) == len(set(seen))
    assert set(sorted(names)[700:]) <= set(seen)


def test_removed_directory_still_open_reads_empty_and_refuses_entries(mnt):
    d = mnt / "gone"
    d.mkdir()
    fd = os.open(d, os.O_RDONLY)
    cwd = os.getcwd()
    try:
        os.chdir(d)
        os.rmdir(d)
        assert os.fstat(fd).st_nlink == 0
        assert os.listdir(".") == []
        assert errno_of(lambda: open("new", "wb")) == errno.ENOENT
        assert errno_of(lambda: os.mkdir("sub")) == errno.ENOENT
    finally:
        os.chdir(cwd)
        os.close(fd)


def test_hard_links_count_and_share_data(mnt):
    a = mnt / "a"
    a.write_bytes(b"one")
    os.link(a, mnt / "b")
    (mnt / "d").mkdir()
    os.link(a, mnt / "d" / "c")
    assert os.stat(a).st_nlink == 3
    assert os.stat(mnt / "d" / "c").st_ino == os.stat(a).st_ino
    with open(mnt / "b", "ab") as f:
        f.write(b"two")
    assert a.read_bytes() == b"onetwo"
    os.unlink(a)
    assert os.stat(mnt / "b").st_nlink == 2
    assert errno_of(lambda: os.link(mnt / "d", mnt / "dlink")) == errno.EPERM


def test_rename_corner_cases(mnt):
    (mnt / "f").write_bytes(b"f")
    (mnt / "g").write_bytes(b"g")
    (mnt / "d").mkdir()
    (mnt / "e").mkdir()
    (mnt / "full").mkdir()
    (mnt / "full" / "x").touch()
    os.rename(mnt / "f", mnt / "g")  # over an existing file
    assert (mnt / "g").read_bytes() == b"f" and not (mnt / "f").exists()
    assert errno_of(lambda: os.rename(mnt / "d", mnt / "g")) == errno.ENOTDIR
    assert errno_of(lambda: os.rename(mnt / "g", mnt / "d")) == errno.EISDIR
    assert errno_of(lambda: os.rename(mnt / "e", mnt / "full")) == errno.ENOTEMPTY
    os.rename(mnt / "e", mnt / "d")  # over an empty directory
    assert not (mnt / "e").exists()
    assert errno_of(lambda: os.rename(mnt / "d", mnt / "d" / "sub")) == errno.EINVAL
    # Two links of one file: rename is a no-op, both names stay.
    os.link(mnt / "g", mnt / "g2")
    os.rename(mnt / "g", mnt / "g2")
    assert (mnt / "g").exists() and (mnt / "g2").exists()
    # A directory moved to another parent: its '..' and both parents' link counts follow.
    os.rename(mnt / "d", mnt / "full" / "d")
    assert os.stat(mnt / "full").st_nlink == 3
    assert os.stat(mnt / "full" / "d" / "..").st_ino == os.stat(mnt / "full").st_ino


def test_renameat2_noreplace_and_exchange(mnt):
    (mnt / "a").write_bytes(b"a")
    (mnt / "b").write_bytes(b"b")
    assert renameat2(mnt / "a", mnt / "b", RENAME_NOREPLACE) == errno.EEXIST
    assert (mnt / "a").read_bytes() == b"a" and (mnt / "b").read_bytes() == b"b"
    assert renameat2(mnt / "a", mnt / "c", RENAME_NOREPLACE) == 0
    assert (mnt / "c").read_bytes() == b"a"
    assert renameat2(mnt / "c", mnt / "b", RENAME_EXCHANGE) == errno.EINVAL


# ---------------------------------------------------------------------------------------------------------
# Open-unlinked files (silly rename)


def test_open_unlinked_file_stays_readable_and_writable_until_closed(mnt):
    d = mnt / "d"
    d.mkdir()
    p = d / "f"
    p.write_bytes(b"before")
    fd = os.open(p, os.O_RDWR)
    try:
        os.unlink(p)
        assert not p.exists()
        assert os.listdir(d) == []  # no hidden name shows anywhere a user looks
        assert os.fstat(fd).st_nlink == 0
        os.pwrite(fd, b"after!", 6)
        assert os.pread(fd, 100, 0) == b"beforeafter!"
        os.rmdir(d)  # the directory is empty although the file is still open
        assert ".bftfs-orphans" not in os.listdir(mnt)
        assert os.pread(fd, 100, 0) == b"beforeafter!"
    finally:
        os.close(fd)


def test_remove_until_empty_terminates_with_open_files(mnt):
    """A remover that lists and unlinks until the directory reads empty (remove_dir_all, rm -r) ends even
    when files inside are open."""
    d = mnt / "tree"
    (d / "sub").mkdir(parents=True)
    fds = []
    for name in ("a", "b", "sub/c"):
        (d / name).write_bytes(b"x")
        fds.append(os.open(d / name, os.O_RDONLY))
    try:
        shutil.rmtree(d)
        assert not d.exists()
        assert all(os.pread(fd, 1, 0) == b"x" for fd in fds)
    finally:
        for fd in fds:
            os.close(fd)


def test_open_racing_with_unlink_never_loses_an_opened_files_writes(mnt):
    """An open either finds the file, and then write and close succeed even if the name goes meanwhile (the
    file is hidden, not removed), or fails. (open itself may still answer ESTALE when the kernel's one retry
    with a fresh lookup races with the next create/unlink too: docs/CLIENT.md.)"""
    p = mnt / "race"
    pid = os.fork()
    if pid == 0:
        try:
            for _ in range(300):
                os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
                os.unlink(p)
        finally:
            os._exit(0)
    bad = {}
    try:
        for _ in range(300):
            stage = "open"
            try:
                fd = os.open(p, os.O_WRONLY | os.O_APPEND)
                stage = "write"
                os.write(fd, b"x")
                stage = "close"
                os.close(fd)
            except OSError as e:
                if not (e.errno == errno.ENOENT or (stage == "open" and e.errno == errno.ESTALE)):
                    bad[(stage, errno.errorcode[e.errno])] = bad.get((stage, errno.errorcode[e.errno]), 0) + 1
    finally:
        os.waitpid(pid, 0)
    assert bad == {}


def test_rename_over_an_open_file_keeps_the_old_data_for_its_reader(mnt):
    (mnt / "new").write_bytes(b"new contents")
    (mnt / "old").write_bytes(b"old contents")
    with open(mnt / "old", "rb") as f:
        os.rename(mnt / "new", mnt / "old")
        assert (mnt / "old").read_bytes() == b"new contents"
        assert f.read() == b"old contents"
    assert sorted(os.listdir(mnt)) == ["old"]


def test_unlinked_open_file_with_other_links_is_not_hidden(mnt):
    (mnt / "a").write_bytes(b"x")
    os.link(mnt / "a", mnt / "b")
    with open(mnt / "a", "rb") as f:
        os.unlink(mnt / "a")
        assert sorted(os.listdir(mnt)) == ["b"]
        assert f.read() == b"x"


# ---------------------------------------------------------------------------------------------------------
# Credentials and permissions (non-root users through setresuid)


def test_permissions_follow_the_callers_credentials(mnt):
    d = shared_dir(mnt)
    root_only = mnt / "root_only"
    root_only.mkdir()
    os.chmod(root_only, 0o755)
    assert as_user(*USER_A, lambda: (root_only / "x").touch()) == ("errno", errno.EACCES)

    def make():
        p = d / "a_file"
        p.write_bytes(b"secret")
        os.chmod(p, 0o600)
        return os.stat(p).st_uid, os.stat(p).st_gid

    assert as_user(*USER_A, make) == USER_A
    assert as_user(*USER_B, lambda: (d / "a_file").read_bytes()) == ("errno", errno.EACCES)
    assert as_user(*USER_A, lambda: (d / "a_file").read_bytes()) == b"secret"
    assert as_user(*USER_B, lambda: os.chmod(d / "a_file", 0o666)) == ("errno", errno.EPERM)
    assert as_user(*USER_A, lambda: os.chown(d / "a_file", USER_B[0], -1)) == ("errno", errno.EPERM)
    os.chown(d / "a_file", USER_B[0], USER_B[1])  # root may
    assert as_user(*USER_B, lambda: (d / "a_file").read_bytes()) == b"secret"
    # Search permission on a directory is needed to reach what is inside.
    os.chmod(root_only, 0o744)
    (root_only / "inner").write_bytes(b"i")
    assert as_user(*USER_A, lambda: (root_only / "inner").read_bytes()) == ("errno", errno.EACCES)


def test_supplementary_groups_grant_group_access(mnt):
    d = shared_dir(mnt)
    p = d / "grp"
    p.write_bytes(b"g")
    os.chown(p, 0, 4242)
    os.chmod(p, 0o640)
    assert as_user(*USER_A, lambda: p.read_bytes()) == ("errno", errno.EACCES)
    assert as_user(*USER_A, lambda: p.read_bytes(), groups=[4242]) == b"g"


def test_sticky_directory_protects_other_users_entries(mnt):
    d = shared_dir(mnt, "tmp", 0o1777)
    as_user(*USER_A, lambda: (d / "mine").write_bytes(b"a"))
    assert as_user(*USER_B, lambda: os.unlink(d / "mine")) == ("errno", errno.EPERM)
    assert as_user(*USER_B, lambda: os.rename(d / "mine", d / "stolen")) == ("errno", errno.EPERM)
    as_user(*USER_A, lambda: os.unlink(d / "mine"))
    assert os.listdir(d) == []


def test_file_created_read_only_is_writable_through_its_descriptor(mnt):
    """open(O_CREAT, 0444) then write (git objects, tar): permission is checked at open, not per write."""
    d = shared_dir(mnt)

    def create_ro():
        fd = os.open(d / "ro", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        try:
            os.write(fd, b"data")
            os.fsync(fd)
        finally:
            os.close(fd)
        return (d / "ro").read_bytes(), stat.S_IMODE(os.stat(d / "ro").st_mode)

    assert as_user(*USER_A, create_ro) == (b"data", 0o444)
    assert as_user(*USER_A, lambda: os.open(d / "ro", os.O_WRONLY)) == ("errno", errno.EACCES)


def test_setgid_directory_and_write_clears_setuid(mnt):
    d = shared_dir(mnt)
    os.chown(d, 0, 4343)
    os.chmod(d, 0o2777)
    as_user(*USER_A, lambda: (d / "sub").mkdir())
    as_user(*USER_A, lambda: (d / "f").write_bytes(b"x"))
    assert os.stat(d / "f").st_gid == 4343
    assert os.stat(d / "sub").st_gid == 4343 and os.stat(d / "sub").st_mode & stat.S_ISGID
    as_user(*USER_A, lambda: os.chmod(d / "f", 0o4755))
    assert os.stat(d / "f").st_mode & stat.S_ISUID
    as_user(*USER_A, lambda: open(d / "f", "ab").write(b"more"))
    assert not os.stat(d / "f").st_mode & stat.S_ISUID


def test_chmod_chown_utimens_and_special_files(mnt):
    p = mnt / "f"
    p.touch()
    os.chmod(p, 0o640)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o640
    os.chown(p, 777, 888)
    assert (os.stat(p).st_uid, os.stat(p).st_gid) == (777, 888)
    os.utime(p, ns=(1_000_000_123, 2_000_000_456))
    st = os.stat(p)
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_123, 2_000_000_456)
    os.mkfifo(mnt / "fifo")
    assert stat.S_ISFIFO(os.stat(mnt / "fifo").st_mode)
    os.mknod(mnt / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    assert os.stat(mnt / "null").st_rdev == os.makedev(1, 3)
    d = shared_dir(mnt)
    assert as_user(*USER_A, lambda: os.mknod(d / "dev", 0o666 | stat.S_IFCHR, os.makedev(1, 3))) == \
        ("errno", errno.EPERM)
    sv = os.statvfs(mnt)
    assert sv.f_namemax == 255 and sv.f_blocks > 0


# ---------------------------------------------------------------------------------------------------------
# Lifecycle


def test_state_survives_unmount_and_remount(bftfs_bin, tmp_path):
    args = ["--local", str(tmp_path / "state")]
    with Mount(bftfs_bin, tmp_path / "m", tmp_path / "log1", args) as m:
        (m.mountpoint / "keep").write_bytes(b"persisted")
        (m.mountpoint / "dir").mkdir()
    with Mount(bftfs_bin, tmp_path / "m", tmp_path / "log2", args) as m:
        assert (m.mountpoint / "keep").read_bytes() == b"persisted"
        assert (m.mountpoint / "dir").is_dir()
        # A second daemon on the same state directory is refused while the first runs.
        (tmp_path / "m2").mkdir()
        r = subprocess.run([str(bftfs_bin), "mount", *args, str(tmp_path / "m2"), "-f"], capture_output=True,
                           text=True, timeout=20)
        assert r.returncode == 1 and "--local" in r.stderr, r.stderr
        assert not os.path.ismount(tmp_path / "m2")


def test_daemon_mode_detaches_and_exits_at_umount(bftfs_bin, tmp_path):
    mnt = tmp_path / "m"
    mnt.mkdir()
    r = subprocess.run([str(bftfs_bin), "mount", "--local", str(tmp_path / "s"), str(mnt), "--log",
                        str(tmp_path / "log")], capture_output=True, timeout=20)
    assert r.returncode == 0, r.stderr
    try:
        assert os.path.ismount(mnt)
        (mnt / "x").write_bytes(b"1")
    finally:
        r = subprocess.run([str(bftfs_bin), "umount", str(mnt)], capture_output=True, timeout=20)
    assert r.returncode == 0, r.stderr
    assert not os.path.ismount(mnt)


def test_usage_errors_are_reported(bftfs_bin, tmp_path):
    r = subprocess.run([str(bftfs_bin), "mount", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "backend" in r.stderr
    r = subprocess.run([str(bftfs_bin), "mount", "--local", str(tmp_path / "s"), str(tmp_path / "nope")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "not a directory" in r.stderr
    r = subprocess.run([str(bftfs_bin), "mount", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--local" in r.stdout
