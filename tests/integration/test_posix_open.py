"""POSIX conformance: open(2)/creat flags, names, O_APPEND (posix_suite.py says where this runs)."""

from __future__ import annotations

import errno
import os
import stat

from harness.users import as_user
from posix_suite import (USER_A, pread_all, raises_errno, read_file, write_file)

pytest_plugins = ["posix_suite"]


def test_creat_makes_an_empty_regular_file_with_mode_minus_umask(d):
    p = d / "f"
    old = os.umask(0o027)
    try:
        fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o777)
    finally:
        os.umask(old)
    os.close(fd)
    st = os.stat(p)
    assert stat.S_ISREG(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o750
    assert st.st_size == 0
    assert st.st_nlink == 1
    assert st.st_uid == 0


def test_o_excl_fails_on_every_existing_kind(d):
    write_file(d / "file")
    os.mkdir(d / "dir")
    os.symlink("file", d / "link")
    os.symlink("nowhere", d / "dangling")
    os.mkfifo(d / "fifo")
    for name in ("file", "dir", "link", "dangling", "fifo"):
        with raises_errno(errno.EEXIST):
            os.open(d / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    assert not os.path.lexists(d / "nowhere"), "O_EXCL must not follow a dangling symlink"


def test_o_excl_creates_when_absent_and_only_one_of_two_wins(d):
    p = d / "f"
    fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.close(fd)
    with raises_errno(errno.EEXIST):
        os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)


def test_o_creat_through_a_dangling_symlink_creates_its_target(d):
    os.symlink("target", d / "link")
    fd = os.open(d / "link", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"via link")
    os.close(fd)
    assert read_file(d / "target") == b"via link"
    assert os.path.islink(d / "link")


def test_o_creat_on_an_existing_file_keeps_its_data_and_mode(d):
    p = d / "f"
    write_file(p, b"keep me", 0o600)
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o777)
    assert os.read(fd, 100) == b"keep me"
    os.close(fd)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600


def test_o_trunc_empties_an_existing_file(d):
    p = d / "f"
    write_file(p, b"x" * 200_000)
    fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
    assert os.fstat(fd).st_size == 0
    os.write(fd, b"new")
    os.close(fd)
    assert read_file(p) == b"new"
    assert os.stat(p).st_size == 3


def test_o_trunc_on_a_fresh_creat_and_on_reopen(d):
    p = d / "f"
    write_file(p, b"abcdef")
    write_file(p, b"xy")  # O_CREAT | O_TRUNC of an existing file
    assert read_file(p) == b"xy"


def test_open_a_directory_for_writing_is_eisdir(d):
    os.mkdir(d / "sub")
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_CREAT, os.O_RDWR | os.O_TRUNC):
        with raises_errno(errno.EISDIR):
            os.open(d / "sub", flags, 0o644)
    os.close(os.open(d / "sub", os.O_RDONLY | os.O_DIRECTORY))


def test_o_directory_on_a_file_is_enotdir(d):
    write_file(d / "f")
    with raises_errno(errno.ENOTDIR):
        os.open(d / "f", os.O_RDONLY | os.O_DIRECTORY)


def test_o_nofollow_on_a_symlink_is_eloop(d):
    write_file(d / "f", b"data")
    os.symlink("f", d / "l")
    with raises_errno(errno.ELOOP):
        os.open(d / "l", os.O_RDONLY | os.O_NOFOLLOW)
    fd = os.open(d / "l", os.O_RDONLY | os.O_NOFOLLOW | os.O_PATH)  # O_PATH opens the link itself
    assert stat.S_ISLNK(os.fstat(fd).st_mode)
    os.close(fd)


def test_missing_and_non_directory_path_components(d):
    write_file(d / "f")
    with raises_errno(errno.ENOENT):
        os.open(d / "nodir" / "x", os.O_CREAT | os.O_WRONLY, 0o644)
    with raises_errno(errno.ENOENT):
        os.open(d / "absent", os.O_RDONLY)
    with raises_errno(errno.ENOTDIR):
        os.open(d / "f" / "x", os.O_CREAT | os.O_WRONLY, 0o644)
    with raises_errno(errno.ENOTDIR):
        os.stat(d / "f" / "x")
    with raises_errno(errno.ENOTDIR):
        os.stat(str(d / "f") + "/")


def test_symlink_loop_is_eloop(d):
    os.symlink("b", d / "a")
    os.symlink("a", d / "b")
    with raises_errno(errno.ELOOP):
        os.open(d / "a", os.O_RDONLY)
    with raises_errno(errno.ELOOP):
        os.stat(d / "a")


def test_name_of_255_bytes_works_and_256_is_enametoolong(d):
    ok = "n" * 255
    long = "n" * 256
    write_file(d / ok, b"255")
    assert read_file(d / ok) == b"255"
    assert ok in os.listdir(d)
    os.rename(d / ok, d / ("m" * 255))
    os.unlink(d / ("m" * 255))
    os.mkdir(d / ok)
    os.rmdir(d / ok)
    cases = [
        lambda: os.open(d / long, os.O_CREAT | os.O_WRONLY, 0o644),
        lambda: os.stat(d / long),
        lambda: os.mkdir(d / long),
        lambda: os.symlink("x", d / long),
        lambda: os.mkfifo(d / long),
        lambda: os.unlink(d / long),
        lambda: os.rmdir(d / long),
    ]
    for call in cases:
        with raises_errno(errno.ENAMETOOLONG):
            call()
    write_file(d / "f")
    with raises_errno(errno.ENAMETOOLONG):
        os.link(d / "f", d / long)
    with raises_errno(errno.ENAMETOOLONG):
        os.rename(d / "f", d / long)
    assert os.listdir(d) == ["f"]


def test_multibyte_and_odd_names(d):
    names = ["é" * 127, "space name", "-dash", "\t\n", "a" * 200 + "\u00ff", ".hidden", "..." , "\x01\x7f",
             "\udcff"]  # a lone 0xff byte through surrogateescape
    for name in names:
        write_file(d / name, name.encode("utf-8", "surrogateescape"))
    assert sorted(os.listdir(d)) == sorted(names)
    for name in names:
        assert read_file(d / name) == name.encode("utf-8", "surrogateescape")


def test_o_append_writes_at_the_end_after_a_seek(d):
    p = d / "f"
    write_file(p, b"0123456789")
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, b"AB")
    assert os.lseek(fd, 0, os.SEEK_CUR) == 12
    os.close(fd)
    assert read_file(p) == b"0123456789AB"


def test_o_append_with_another_writer_growing_the_file(d):
    p = d / "f"
    write_file(p, b"")
    app = os.open(p, os.O_WRONLY | os.O_APPEND)
    other = os.open(p, os.O_WRONLY)
    os.write(app, b"a1")
    os.pwrite(other, b"XXXX", 10)   # another fd grows the file to 14 with a hole
    os.write(app, b"a2")            # must land at 14, not at 2
    os.close(app)
    os.close(other)
    assert read_file(p) == b"a1" + b"\0" * 8 + b"XXXX" + b"a2"


def _append_records(path: str, writer: int, count: int, size: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        for i in range(count):
            rec = f"w{writer}:{i:06d}:".encode().ljust(size - 1, b"." if writer % 2 else b"-") + b"\n"
            assert os.write(fd, rec) == size
    finally:
        os.close(fd)


def test_o_append_is_atomic_with_several_writer_processes(d):
    p = d / "log"
    write_file(p)
    writers, count, size = 4, 150, 97
    pids = []
    for w in range(writers):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _append_records(str(p), w, count, size)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    data = read_file(p)
    assert len(data) == writers * count * size, "lost or extra bytes"
    seen = {w: [] for w in range(writers)}
    for k in range(0, len(data), size):
        rec = data[k:k + size]
        head, seq, rest = rec.split(b":", 2)
        w = int(head[1:])
        assert rec == f"w{w}:{int(seq):06d}:".encode().ljust(size - 1, b"." if w % 2 else b"-") + b"\n", \
            f"record at {k} torn: {rec!r}"
        seen[w].append(int(seq))
    for w in range(writers):
        assert seen[w] == list(range(count)), f"writer {w}'s records out of order or missing"


def test_pwrite_on_an_o_append_fd_appends_on_linux(d):
    p = d / "f"
    write_file(p, b"abc")
    fd = os.open(p, os.O_RDWR | os.O_APPEND)
    os.pwrite(fd, b"Z", 0)  # Linux: O_APPEND wins over the offset (documented in pwrite(2) BUGS)
    assert pread_all(fd, 10, 0) == b"abcZ"
    os.close(fd)


def test_unprivileged_creat_with_read_only_mode_returns_a_writable_fd(shared_dir):
    p = shared_dir / "ro"

    def create_and_write():
        fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o444)
        try:
            os.write(fd, b"written through the creating fd")
            os.ftruncate(fd, 7)
            return pread_all(fd, 100, 0)
        finally:
            os.close(fd)

    assert as_user(USER_A, create_and_write) == b"written"
    st = os.stat(p)
    assert stat.S_IMODE(st.st_mode) == 0o444
    assert (st.st_uid, st.st_gid) == (USER_A.uid, USER_A.gid)
    with raises_errno(errno.EACCES):
        as_user(USER_A, os.open, p, os.O_RDWR)


def test_read_and_write_flags_are_enforced_on_the_fd(d):
    p = d / "f"
    write_file(p, b"data")
    ro = os.open(p, os.O_RDONLY)
    with raises_errno(errno.EBADF):
        os.write(ro, b"x")
    os.close(ro)
    wo = os.open(p, os.O_WRONLY)
    with raises_errno(errno.EBADF):
        os.read(wo, 1)
    os.close(wo)


def test_write_then_read_back_on_one_fd_and_across_fds(d):
    p = d / "f"
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    other = os.open(p, os.O_RDONLY)
    payload = bytes(range(256)) * 1000
    os.write(fd, payload)
    assert pread_all(fd, len(payload), 0) == payload
    assert pread_all(other, len(payload), 0) == payload, "a second fd of the same file sees the write"
    os.close(fd)
    os.close(other)
    assert read_file(p) == payload
