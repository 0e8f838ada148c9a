"""POSIX conformance where a client that buffers writes (write-behind, made final by close and fsync) can go
wrong: metadata changes, truncation, renames and removals while writes are still buffered, errors that must
surface at write() rather than at close(), and processes that exit without closing
(posix_suite.py says where this runs). Each behaviour here is plain local-file-system semantics."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import stat

from harness.users import as_user
from posix_suite import (USER_A, pread_all, raises_errno, read_file, write_file)

pytest_plugins = ["posix_suite"]

T_PAST = 1_000_000_000_000_000_000


def test_futimens_before_close_keeps_the_given_mtime(d):
    """cp -p, tar and rsync write the data, set the times through the fd, then close."""
    p = d / "f"
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"x" * 200_000)
    os.utime(fd, ns=(T_PAST, T_PAST + 1))
    os.close(fd)
    st = os.stat(p)
    assert (st.st_atime_ns, st.st_mtime_ns) == (T_PAST, T_PAST + 1)
    assert st.st_size == 200_000


def test_write_after_futimens_moves_mtime_again(d):
    p = d / "f"
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    os.utime(fd, ns=(T_PAST, T_PAST))
    os.write(fd, b"w")
    assert os.stat(p).st_mtime_ns > T_PAST, "visible before close"
    os.close(fd)
    assert os.stat(p).st_mtime_ns > T_PAST


def test_truncate_by_path_while_writes_are_buffered(d):
    p = d / "f"
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"y" * 150_000)
    os.truncate(p, 10)
    os.close(fd)
    assert read_file(p) == b"y" * 10


def test_o_trunc_open_while_another_fd_has_buffered_writes(d):
    p = d / "f"
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"o" * 150_000)
    os.close(os.open(p, os.O_WRONLY | os.O_TRUNC))
    os.close(fd)
    assert os.stat(p).st_size == 0


def test_unprivileged_writer_keeps_writing_after_fchmod_0444(shared_dir):
    """Permission is checked at open: an fd opened for writing stays writable after the mode drops w."""
    p = shared_dir / "f"

    def work():
        fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, b"a" * 70_000)
        os.fchmod(fd, 0o444)
        os.write(fd, b"b" * 70_000)
        os.fsync(fd)
        os.write(fd, b"c")
        os.close(fd)

    as_user(USER_A, work)
    assert read_file(p) == b"a" * 70_000 + b"b" * 70_000 + b"c"
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o444


def test_fchown_and_fchmod_with_buffered_writes(d):
    p = d / "f"
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"c" * 70_000)
    os.fchown(fd, USER_A.uid, USER_A.gid)
    os.fchmod(fd, 0o6755)
    os.write(fd, b"d" * 10)
    os.close(fd)
    st = os.stat(p)
    assert stat.S_IMODE(st.st_mode) == 0o6755, "root's writes keep setuid and setgid"
    assert (st.st_uid, st.st_size) == (USER_A.uid, 70_010)


def test_data_written_by_a_process_that_exits_without_close(d):
    p = d / "f"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
            os.write(fd, b"z" * 123_457)
            code = 0
        finally:
            os._exit(code)   # no close: the kernel releases the fd
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert read_file(p) == b"z" * 123_457


def test_rename_of_the_parent_while_writes_are_buffered(d):
    os.mkdir(d / "a")
    fd = os.open(d / "a" / "f", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"r" * 100_000)
    os.rename(d / "a", d / "b")
    os.write(fd, b"R")
    os.close(fd)
    assert read_file(d / "b" / "f") == b"r" * 100_000 + b"R"


def test_unlink_while_writes_are_buffered_then_close_is_quiet(d):
    fd = os.open(d / "f", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"u" * 100_000)
    os.unlink(d / "f")
    os.write(fd, b"U")
    os.close(fd)
    assert os.listdir(d) == []


def test_other_processes_see_buffered_writes(d):
    p = d / "f"
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"s" * 77_777)
    pid = os.fork()
    if pid == 0:
        ok = os.stat(p).st_size == 77_777 and read_file(p) == b"s" * 77_777
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_write_past_the_size_limit_fails_at_write_not_at_close(d):
    """Errors of buffered writes that only close() reports are lost by most programs. Whatever a file system's
    largest file is, a write() that returned success must leave the data there, and close() must succeed."""
    for k, offset in enumerate((1 << 40, (1 << 44) + 7, (1 << 62) + 3)):
        p = d / f"big{k}"
        fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            n = os.pwrite(fd, b"q", offset)
        except OSError as e:
            assert e.errno in (errno.EFBIG, errno.EINVAL), e
            os.close(fd)
            assert os.stat(p).st_size == 0
            continue
        assert n == 1
        os.fsync(fd)
        os.close(fd)
        assert os.stat(p).st_size == offset + 1
        fd = os.open(p, os.O_RDONLY)
        assert os.pread(fd, 1, offset) == b"q"
        os.close(fd)
        os.unlink(p)


def test_single_write_calls_of_several_mebibytes(d):
    """One write() of 1 MiB, 1 MiB + 1 and 4 MiB (dd bs=1M, cp of large files): the kernel may hand all of it
    to the file system in one request."""
    p = d / "f"
    for size in (1 << 20, (1 << 20) + 1, 4 << 20):
        data = bytes((i * 7 + size) & 0xFF for i in range(256)) * (size // 256) + b"x" * (size % 256)
        fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        assert os.write(fd, data) == size
        os.close(fd)
        assert read_file(p) == data


def test_fsync_reports_success_only_for_stored_data(d):
    p = d / "f"
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    for i in range(20):
        os.write(fd, bytes([i]) * 10_000)
        if i % 5 == 4:
            os.fsync(fd)
    os.close(fd)
    data = read_file(p)
    assert data == b"".join(bytes([i]) * 10_000 for i in range(20))


def test_mmap_of_a_file_opened_with_o_append(d):
    p = d / "log"
    write_file(p, bytes(8192))
    fd = os.open(p, os.O_RDWR | os.O_APPEND)
    m = mmap.mmap(fd, 8192)
    m[0:2] = b"hi"
    m.flush()
    m.close()
    os.write(fd, b"tail")
    os.close(fd)
    data = read_file(p)
    assert data[:2] == b"hi"
    assert data[-4:] == b"tail"
    assert len(data) == 8196


def test_o_sync_and_fdatasync_writes(d):
    p = d / "f"
    fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_SYNC, 0o644)
    os.write(fd, b"s" * 5000)
    os.close(fd)
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_DSYNC)
    os.write(fd, b"t")
    os.fdatasync(fd)
    os.close(fd)
    assert read_file(p) == b"s" * 5000 + b"t"


def test_many_files_open_at_once(d):
    fds = [os.open(d / f"m{i}", os.O_CREAT | os.O_RDWR, 0o644) for i in range(400)]
    try:
        for i, fd in enumerate(fds):
            os.write(fd, str(i).encode())
        for i, fd in enumerate(fds):
            assert pread_all(fd, 10, 0) == str(i).encode()
    finally:
        for fd in fds:
            os.close(fd)
    assert len(os.listdir(d)) == 400


def test_advisory_locks_work_within_the_mount(d):
    p = d / "lock"
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    pid = os.fork()
    if pid == 0:
        fd2 = os.open(p, os.O_RDWR)
        try:
            fcntl.lockf(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os._exit(1)   # got a lock another process holds
        except OSError as e:
            os._exit(0 if e.errno in (errno.EAGAIN, errno.EACCES) else 2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    fcntl.lockf(fd, fcntl.LOCK_UN)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.close(fd)


def test_extended_attributes_work_or_are_cleanly_unsupported(d):
    p = d / "f"
    write_file(p)
    try:
        os.setxattr(p, "user.k", b"v")
    except OSError as e:
        assert e.errno == errno.ENOTSUP, e
        with raises_errno(errno.ENOTSUP, errno.ENODATA):
            os.getxattr(p, "user.k")
        return
    assert os.getxattr(p, "user.k") == b"v"
    assert "user.k" in os.listxattr(p)


def test_o_direct_reads_and_writes_are_coherent_with_buffered_ones(d):
    p = d / "f"
    buffered = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    os.write(buffered, b"B" * 100_000)          # possibly still buffered by the file system
    try:
        direct = os.open(p, os.O_RDWR | os.O_DIRECT)
    except OSError as e:
        os.close(buffered)
        assert e.errno == errno.EINVAL, e       # a file system may refuse O_DIRECT
        return
    cached = os.open(p, os.O_RDONLY)
    try:
        page = mmap.mmap(-1, 65536)
        assert os.preadv(direct, [page], 0) == 65536
        assert page[:] == b"B" * 65536, "a direct read sees buffered writes"
        assert os.pread(cached, 4096, 0) == b"B" * 4096   # now in the page cache
        out = mmap.mmap(-1, 4096)
        out.write(b"D" * 4096)
        assert os.pwritev(direct, [out], 0) == 4096
        assert os.pread(cached, 4096, 0) == b"D" * 4096, "a direct write invalidates cached pages"
        with mmap.mmap(buffered, 8192, mmap.MAP_SHARED, mmap.PROT_READ) as m:
            assert m[:4096] == b"D" * 4096
    finally:
        for fd in (buffered, direct, cached):
            os.close(fd)
    assert read_file(p) == b"D" * 4096 + b"B" * (100_000 - 4096)


def test_overlapping_writes_through_several_fds_keep_their_order(d):
    """Writes through different descriptors of one file land in the order they were made, whatever order the
    descriptors are closed or reopened in (a client that buffers per descriptor must not reorder them)."""
    import random

    p = d / "f"
    rng = random.Random(7)
    model = bytearray()
    fds = [os.open(p, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)] + [os.open(p, os.O_RDWR) for _ in range(2)]
    try:
        for i in range(1500):
            k = rng.randrange(3)
            off, n = rng.randrange(0, 600_000), rng.randrange(1, 70_000)
            data = bytes([65 + i % 26]) * n
            assert os.pwrite(fds[k], data, off) == n
            model.extend(bytes(max(0, off + n - len(model))))
            model[off:off + n] = data
            if rng.random() < 0.05:
                os.close(fds[k])
                fds[k] = os.open(p, os.O_RDWR)
            if rng.random() < 0.02:
                assert read_file(p) == bytes(model), f"after {i + 1} writes"
    finally:
        for fd in fds:
            os.close(fd)
    assert read_file(p) == bytes(model)


def _write_stripes(path: str, me: int, writers: int, blocks: int, seed: int) -> None:
    import random

    rng = random.Random(seed)
    mine = [b for b in range(blocks) if b % writers == me]
    rng.shuffle(mine)
    fd = os.open(path, os.O_WRONLY)
    try:
        for b in mine:
            assert os.pwrite(fd, bytes([b % 251]) * 4096, b * 4096) == 4096
    finally:
        os.close(fd)


def test_concurrent_processes_writing_disjoint_blocks_of_one_file(d):
    p = d / "f"
    write_file(p)
    writers, blocks = 4, 1024
    pids = []
    for me in range(writers):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _write_stripes(str(p), me, writers, blocks, me)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    data = read_file(p)
    assert len(data) == blocks * 4096
    for b in range(blocks):
        assert data[b * 4096:(b + 1) * 4096] == bytes([b % 251]) * 4096, f"block {b}"
