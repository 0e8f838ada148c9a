"""POSIX conformance: the name space. mkdir/rmdir, rename (every corner), link/unlink and nlink counts,
symlink/readlink, mknod (FIFO, socket, devices), readdir completeness under concurrent changes
(posix_suite.py says where this runs)."""

from __future__ import annotations

import errno
import os
import socket
import stat

from harness.users import as_user
from posix_suite import (RENAME_EXCHANGE, RENAME_NOREPLACE, USER_A, clock_tick, raises_errno, read_file, renameat2,
                         write_file)

pytest_plugins = ["posix_suite"]

T_PAST = 1_000_000_000_000_000_000


# ---- mkdir / rmdir ---------------------------------------------------------------------------------------


def test_mkdir_makes_an_empty_directory_and_counts_links(d):
    parent_links = os.stat(d).st_nlink
    os.mkdir(d / "sub", 0o750)
    st = os.stat(d / "sub")
    assert stat.S_ISDIR(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o750 & ~0o022
    assert st.st_nlink == 2
    assert os.listdir(d / "sub") == []
    assert os.stat(d).st_nlink == parent_links + 1, "the new '..' links the parent"
    assert os.stat(d / "sub" / "..").st_ino == os.stat(d).st_ino
    assert os.stat(f"{d}/sub/.").st_ino == st.st_ino
    os.mkdir(d / "sub" / "a")
    assert os.stat(d / "sub").st_nlink == 3
    os.rmdir(d / "sub" / "a")
    assert os.stat(d / "sub").st_nlink == 2
    os.rmdir(d / "sub")
    assert os.stat(d).st_nlink == parent_links


def test_mkdir_on_existing_names_is_eexist(d):
    write_file(d / "f")
    os.mkdir(d / "dir")
    os.symlink("nowhere", d / "dangling")
    for name in ("f", "dir", "dangling", ".", ".."):
        with raises_errno(errno.EEXIST):
            os.mkdir(f"{d}/{name}")
    with raises_errno(errno.ENOENT):
        os.mkdir(d / "no" / "such")
    with raises_errno(errno.ENOTDIR):
        os.mkdir(d / "f" / "sub")


def test_rmdir_errors(d):
    os.mkdir(d / "full")
    write_file(d / "full" / "x")
    write_file(d / "f")
    with raises_errno(errno.ENOTEMPTY, errno.EEXIST):
        os.rmdir(d / "full")
    with raises_errno(errno.ENOTDIR):
        os.rmdir(d / "f")
    with raises_errno(errno.ENOENT):
        os.rmdir(d / "absent")
    with raises_errno(errno.EINVAL):
        os.rmdir(f"{d}/full/.")   # a string: pathlib would drop the "."
    with raises_errno(errno.ENOTEMPTY, errno.EEXIST):
        os.rmdir(d / "full" / "..")
    os.symlink("full", d / "link")
    with raises_errno(errno.ENOTDIR):
        os.rmdir(d / "link")
    os.unlink(d / "full" / "x")
    os.rmdir(d / "full")
    assert sorted(os.listdir(d)) == ["f", "link"]


def test_a_directory_with_only_a_hidden_or_special_entry_is_not_empty(d):
    for name, make in ((".hidden", lambda p: write_file(p)), ("fifo", os.mkfifo),
                       ("link", lambda p: os.symlink("x", p)), ("subdir", os.mkdir)):
        os.mkdir(d / "x")
        make(d / "x" / name)
        with raises_errno(errno.ENOTEMPTY, errno.EEXIST):
            os.rmdir(d / "x")
        if name == "subdir":
            os.rmdir(d / "x" / name)
        else:
            os.unlink(d / "x" / name)
        os.rmdir(d / "x")


def test_removed_cwd_is_empty_and_refuses_new_entries(d):
    os.mkdir(d / "gone")
    fd = os.open(d / "gone", os.O_RDONLY | os.O_DIRECTORY)
    os.rmdir(d / "gone")
    assert os.fstat(fd).st_nlink == 0
    with raises_errno(errno.ENOENT):
        os.open("x", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd)
    assert os.listdir(fd) == []
    os.close(fd)


# ---- link / unlink ---------------------------------------------------------------------------------------


def test_hard_links_share_the_inode_and_count(d):
    write_file(d / "a", b"shared")
    os.utime(d / "a", ns=(T_PAST, T_PAST))
    before = os.stat(d / "a")
    clock_tick()
    os.link(d / "a", d / "b")
    os.mkdir(d / "sub")
    os.link(d / "a", d / "sub" / "c")
    sa, sb, sc = (os.stat(p) for p in (d / "a", d / "b", d / "sub" / "c"))
    assert sa.st_ino == sb.st_ino == sc.st_ino
    assert sa.st_nlink == 3
    assert sa.st_ctime_ns > before.st_ctime_ns, "link changes the file's ctime"
    assert sa.st_mtime_ns == T_PAST, "link does not change the file's mtime"
    write_file(d / "b", b"changed through b")
    assert read_file(d / "sub" / "c") == b"changed through b"
    os.unlink(d / "a")
    assert os.stat(d / "b").st_nlink == 2
    os.unlink(d / "sub" / "c")
    assert os.stat(d / "b").st_nlink == 1
    assert read_file(d / "b") == b"changed through b"


def test_link_errors(d):
    write_file(d / "f")
    os.mkdir(d / "dir")
    with raises_errno(errno.EEXIST):
        os.link(d / "f", d / "dir")
    write_file(d / "g")
    with raises_errno(errno.EEXIST):
        os.link(d / "f", d / "g")
    with raises_errno(errno.EPERM):
        os.link(d / "dir", d / "dirlink")
    with raises_errno(errno.ENOENT):
        os.link(d / "absent", d / "x")
    with raises_errno(errno.ENOENT):
        os.link(d / "f", d / "nodir" / "x")


def test_link_to_a_symlink_links_the_symlink_itself(d):
    write_file(d / "f")
    os.symlink("f", d / "l")
    os.link(d / "l", d / "l2", follow_symlinks=False)
    assert os.path.islink(d / "l2")
    assert os.lstat(d / "l2").st_ino == os.lstat(d / "l").st_ino
    assert os.lstat(d / "l").st_nlink == 2
    assert os.stat(d / "f").st_nlink == 1


def test_unlink_errors_and_effects(d):
    os.mkdir(d / "dir")
    with raises_errno(errno.EISDIR, errno.EPERM):
        os.unlink(d / "dir")
    with raises_errno(errno.ENOENT):
        os.unlink(d / "absent")
    write_file(d / "f")
    os.utime(d, ns=(T_PAST, T_PAST))
    os.unlink(d / "f")
    assert not os.path.lexists(d / "f")
    assert os.stat(d).st_mtime_ns > T_PAST, "unlink changes the directory's mtime"
    os.symlink("dir", d / "l")
    os.unlink(d / "l")   # removes the link, not the directory
    assert os.path.isdir(d / "dir")


def test_many_links_and_dotdot_counts_across_subdirectories(d):
    write_file(d / "f")
    for i in range(50):
        os.link(d / "f", d / f"l{i}")
    assert os.stat(d / "f").st_nlink == 51
    for i in range(0, 50, 2):
        os.unlink(d / f"l{i}")
    assert os.stat(d / "f").st_nlink == 26
    for i in range(20):
        os.mkdir(d / f"s{i}")
    assert os.stat(d).st_nlink == 22


# ---- symlink / readlink ----------------------------------------------------------------------------------


def test_symlink_stores_its_target_verbatim(d):
    for name, target in (("rel", "f"), ("abs", "/etc/passwd"), ("dangling", "no/such/thing"),
                         ("dots", "../.././x"), ("spaces", " a b "), ("long", "x/" * 2000 + "y"),
                         ("max", "z" * 4095), ("bytes", "\udcff\x01")):
        os.symlink(target, d / name)
        assert os.readlink(d / name) == target
        st = os.lstat(d / name)
        assert stat.S_ISLNK(st.st_mode)
        assert st.st_size == len(os.fsencode(target))


def test_symlink_limits_and_errors(d):
    with raises_errno(errno.ENAMETOOLONG):
        os.symlink("z" * 4096, d / "toolong")
    with raises_errno(errno.ENOENT):
        os.symlink("", d / "empty")
    write_file(d / "f")
    with raises_errno(errno.EEXIST):
        os.symlink("x", d / "f")
    with raises_errno(errno.EINVAL):
        os.readlink(d / "f")
    os.mkdir(d / "dir")
    with raises_errno(errno.EINVAL):
        os.readlink(d / "dir")
    with raises_errno(errno.ENOENT):
        os.readlink(d / "absent")


def test_symlinks_resolve_to_files_and_directories(d):
    os.mkdir(d / "dir")
    write_file(d / "dir" / "f", b"through the link")
    os.symlink("dir", d / "dl")
    os.symlink("dl/f", d / "fl")
    assert read_file(d / "fl") == b"through the link"
    assert os.listdir(d / "dl") == ["f"]
    assert os.stat(d / "fl").st_ino == os.stat(d / "dir" / "f").st_ino
    assert stat.S_IMODE(os.lstat(d / "fl").st_mode) == 0o777


# ---- rename ----------------------------------------------------------------------------------------------


def test_rename_a_file_over_a_file(d):
    write_file(d / "a", b"A")
    write_file(d / "b", b"B")
    ino = os.stat(d / "a").st_ino
    os.rename(d / "a", d / "b")
    assert not os.path.lexists(d / "a")
    assert read_file(d / "b") == b"A"
    assert os.stat(d / "b").st_ino == ino
    assert os.listdir(d) == ["b"]


def test_rename_over_a_file_with_other_links_drops_one_link(d):
    write_file(d / "a", b"A")
    write_file(d / "b", b"B")
    os.link(d / "b", d / "b2")
    os.rename(d / "a", d / "b")
    assert read_file(d / "b2") == b"B"
    assert os.stat(d / "b2").st_nlink == 1


def test_rename_over_a_symlink_replaces_the_link_not_its_target(d):
    write_file(d / "target", b"T")
    os.symlink("target", d / "l")
    write_file(d / "a", b"A")
    os.rename(d / "a", d / "l")
    assert not os.path.islink(d / "l")
    assert read_file(d / "l") == b"A"
    assert read_file(d / "target") == b"T"


def test_rename_a_symlink_keeps_its_target(d):
    os.symlink("../somewhere", d / "l")
    os.mkdir(d / "sub")
    os.rename(d / "l", d / "sub" / "l2")
    assert os.readlink(d / "sub" / "l2") == "../somewhere"


def test_rename_directory_rules(d):
    for name in ("src", "empty", "full", "other"):
        os.mkdir(d / name)
    write_file(d / "full" / "x")
    write_file(d / "file")
    ino = os.stat(d / "src").st_ino
    with raises_errno(errno.ENOTEMPTY, errno.EEXIST):
        os.rename(d / "src", d / "full")
    with raises_errno(errno.ENOTDIR):
        os.rename(d / "src", d / "file")
    with raises_errno(errno.EISDIR):
        os.rename(d / "file", d / "empty")
    links = os.stat(d).st_nlink
    os.rename(d / "src", d / "empty")   # over an empty directory
    assert os.stat(d / "empty").st_ino == ino
    assert not os.path.lexists(d / "src")
    assert os.stat(d).st_nlink == links - 1, "the replaced directory's '..' is gone"


def test_rename_a_directory_into_its_own_subtree_is_einval(d):
    os.makedirs(d / "a" / "b" / "c")
    with raises_errno(errno.EINVAL):
        os.rename(d / "a", d / "a" / "b" / "c" / "a")
    with raises_errno(errno.EINVAL):
        os.rename(d / "a", d / "a" / "x")
    with raises_errno(errno.EINVAL, errno.ENOTEMPTY, errno.EEXIST):
        os.rename(d / "a" / "b", d / "a" / "b" / "c")   # over its own (non-empty ancestor path) child
    os.rename(d / "a" / "b" / "c", d / "c")             # moving up is fine
    assert os.path.isdir(d / "c")


def test_rename_dot_and_dotdot_is_refused(d):
    os.mkdir(d / "a")
    os.mkdir(d / "b")
    # strings: pathlib would drop the "."
    for src, dst in ((f"{d}/a/.", f"{d}/b/x"), (f"{d}/a/..", f"{d}/b/x"), (f"{d}/a", f"{d}/b/."),
                     (f"{d}/a", f"{d}/b/..")):
        with raises_errno(errno.EINVAL, errno.EBUSY, errno.ENOTEMPTY, errno.EEXIST):
            os.rename(src, dst)
    assert sorted(os.listdir(d)) == ["a", "b"]


def test_rename_a_directory_to_another_parent_fixes_dotdot_and_link_counts(d):
    os.makedirs(d / "p1" / "moved" / "child")
    os.mkdir(d / "p2")
    n1, n2 = os.stat(d / "p1").st_nlink, os.stat(d / "p2").st_nlink
    os.rename(d / "p1" / "moved", d / "p2" / "moved")
    assert os.stat(d / "p1").st_nlink == n1 - 1
    assert os.stat(d / "p2").st_nlink == n2 + 1
    assert os.stat(d / "p2" / "moved" / "..").st_ino == os.stat(d / "p2").st_ino
    assert os.stat(d / "p2" / "moved").st_nlink == 3
    assert os.listdir(d / "p2" / "moved") == ["child"]
    os.rmdir(d / "p2" / "moved" / "child")
    os.rmdir(d / "p2" / "moved")
    os.rmdir(d / "p1")   # nothing left behind in the old parent


def test_rename_between_hard_links_of_one_inode_is_a_no_op(d):
    write_file(d / "a", b"A")
    os.link(d / "a", d / "b")
    os.rename(d / "a", d / "b")
    assert sorted(os.listdir(d)) == ["a", "b"], "POSIX: both names remain"
    assert os.stat(d / "a").st_nlink == 2
    os.rename(d / "a", d / "a")
    os.mkdir(d / "dir")
    os.rename(d / "dir", d / "dir")
    assert sorted(os.listdir(d)) == ["a", "b", "dir"]


def test_rename_errors(d):
    with raises_errno(errno.ENOENT):
        os.rename(d / "absent", d / "x")
    write_file(d / "f")
    with raises_errno(errno.ENOENT):
        os.rename(d / "f", d / "nodir" / "x")
    with raises_errno(errno.ENOTDIR):
        os.rename(d / "f", d / "f" / "x")
    with raises_errno(errno.ENAMETOOLONG):
        os.rename(d / "f", d / ("n" * 256))


def test_rename_updates_times(d):
    os.mkdir(d / "p1")
    os.mkdir(d / "p2")
    write_file(d / "p1" / "f")
    for p in (d / "p1", d / "p2", d / "p1" / "f"):
        os.utime(p, ns=(T_PAST, T_PAST))
    ctime = os.stat(d / "p1" / "f").st_ctime_ns
    clock_tick()
    os.rename(d / "p1" / "f", d / "p2" / "g")
    assert os.stat(d / "p1").st_mtime_ns > T_PAST
    assert os.stat(d / "p2").st_mtime_ns > T_PAST
    st = os.stat(d / "p2" / "g")
    assert st.st_mtime_ns == T_PAST, "rename does not change the file's mtime"
    assert st.st_ctime_ns >= ctime


def test_rename_noreplace(d):
    write_file(d / "a", b"A")
    write_file(d / "b", b"B")
    with raises_errno(errno.EEXIST):
        renameat2(d / "a", d / "b", RENAME_NOREPLACE)
    assert read_file(d / "b") == b"B"
    renameat2(d / "a", d / "c", RENAME_NOREPLACE)
    assert sorted(os.listdir(d)) == ["b", "c"]
    os.mkdir(d / "e")
    with raises_errno(errno.EEXIST):
        renameat2(d / "b", d / "e", RENAME_NOREPLACE)


def test_rename_exchange_swaps_or_is_refused_cleanly(d):
    write_file(d / "a", b"A")
    os.mkdir(d / "b")
    try:
        renameat2(d / "a", d / "b", RENAME_EXCHANGE)
    except OSError as e:
        assert e.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS), e
        assert read_file(d / "a") == b"A" and os.path.isdir(d / "b"), "a refused exchange changes nothing"
        return
    assert os.path.isdir(d / "a")
    assert read_file(d / "b") == b"A"
    with raises_errno(errno.ENOENT):
        renameat2(d / "a", d / "absent", RENAME_EXCHANGE)


def test_rename_over_an_open_file_keeps_the_old_data_readable(d):
    write_file(d / "old", b"old contents " * 1000)
    fd = os.open(d / "old", os.O_RDONLY)
    write_file(d / "new", b"new")
    os.rename(d / "new", d / "old")
    assert os.fstat(fd).st_nlink == 0
    assert os.pread(fd, 13, 0) == b"old contents "
    assert os.pread(fd, 20000, 0) == b"old contents " * 1000
    os.close(fd)
    assert read_file(d / "old") == b"new"
    assert os.listdir(d) == ["old"]


def test_unprivileged_rename_in_own_directory(shared_dir):
    def work():
        os.mkdir(shared_dir / "mine")
        with open(shared_dir / "mine" / "f", "wb") as f:
            f.write(b"m")
        os.rename(shared_dir / "mine" / "f", shared_dir / "g")
        os.rename(shared_dir / "mine", shared_dir / "ours")
        return sorted(os.listdir(shared_dir))

    assert as_user(USER_A, work) == ["g", "ours"]


# ---- mknod -----------------------------------------------------------------------------------------------


def test_fifo_is_created_and_carries_data(d):
    os.mkfifo(d / "fifo", 0o640)
    st = os.lstat(d / "fifo")
    assert stat.S_ISFIFO(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o640
    r = os.open(d / "fifo", os.O_RDONLY | os.O_NONBLOCK)
    w = os.open(d / "fifo", os.O_WRONLY | os.O_NONBLOCK)
    os.write(w, b"through the fifo")
    assert os.read(r, 100) == b"through the fifo"
    os.close(w)
    os.close(r)
    assert os.stat(d / "fifo").st_size == 0
    with raises_errno(errno.EEXIST):
        os.mkfifo(d / "fifo")


def test_mknod_regular_and_devices(d):
    os.mknod(d / "reg", 0o600 | stat.S_IFREG)
    assert stat.S_ISREG(os.stat(d / "reg").st_mode)
    dev = os.makedev(1, 3)
    os.mknod(d / "null", 0o666 | stat.S_IFCHR, dev)
    st = os.lstat(d / "null")
    assert stat.S_ISCHR(st.st_mode)
    assert st.st_rdev == dev
    os.mknod(d / "blk", 0o600 | stat.S_IFBLK, os.makedev(7, 200))
    assert os.lstat(d / "blk").st_rdev == os.makedev(7, 200)
    os.unlink(d / "null")
    os.unlink(d / "blk")


def test_unprivileged_mknod_of_a_device_is_eperm_but_fifo_works(shared_dir):
    with raises_errno(errno.EPERM):
        as_user(USER_A, os.mknod, shared_dir / "dev", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    as_user(USER_A, os.mkfifo, shared_dir / "fifo")
    assert os.stat(shared_dir / "fifo").st_uid == USER_A.uid


def test_unix_socket_node_binds_and_connects(d):
    path = d / "s"
    if len(os.fsencode(path)) >= 108:
        path_str = os.path.relpath(path)
    else:
        path_str = str(path)
    if len(os.fsencode(path_str)) >= 108:
        import pytest
        pytest.skip("socket path too long for sun_path")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(path_str)
        srv.listen(1)
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        cli = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        cli.connect(path_str)
        conn, _ = srv.accept()
        cli.sendall(b"ping")
        assert conn.recv(4) == b"ping"
        conn.close()
        cli.close()
    finally:
        srv.close()
    os.unlink(path)


# ---- readdir ---------------------------------------------------------------------------------------------


def test_readdir_lists_every_kind_with_its_type(d):
    write_file(d / "f")
    os.mkdir(d / "dir")
    os.symlink("f", d / "link")
    os.mkfifo(d / "fifo")
    kinds = {}
    with os.scandir(d) as it:
        for e in it:
            kinds[e.name] = (e.is_file(follow_symlinks=False), e.is_dir(follow_symlinks=False),
                             e.is_symlink(), e.inode() == os.lstat(e.path).st_ino)
    assert kinds == {"f": (True, False, False, True), "dir": (False, True, False, True),
                     "link": (False, False, True, True), "fifo": (False, False, False, True)}
    assert os.stat(d / "dir").st_nlink == 2


def test_readdir_of_a_large_directory_is_complete(d):
    names = {f"entry-{i:05d}-" + "x" * (i % 97) for i in range(1500)}
    for n in names:
        os.close(os.open(d / n, os.O_CREAT | os.O_WRONLY, 0o644))
    listed = os.listdir(d)
    assert len(listed) == len(set(listed)), "duplicates"
    assert set(listed) == names


def test_readdir_while_entries_are_added_and_removed(d):
    """POSIX: an entry neither added nor removed during the scan is returned exactly once; one added or
    removed meanwhile may or may not be; none is ever returned twice."""
    stable = [f"stable-{i:05d}-" + "y" * 100 for i in range(800)]
    doomed = [f"doomed-{i:05d}-" + "z" * 100 for i in range(400)]
    for n in stable + doomed:
        os.close(os.open(d / n, os.O_CREAT | os.O_WRONLY, 0o644))
    added = []
    seen = []
    with os.scandir(d) as it:
        for k, e in enumerate(it):
            seen.append(e.name)
            if k == 50:
                for i in range(400):
                    name = f"added-{i:05d}-" + "w" * 100
                    os.close(os.open(d / name, os.O_CREAT | os.O_WRONLY, 0o644))
                    added.append(name)
                for n in doomed:
                    os.unlink(d / n)
    assert len(seen) == len(set(seen)), "an entry was returned twice"
    unexpected = set(seen) - set(stable) - set(doomed) - set(added)
    assert not unexpected, f"names never created: {sorted(unexpected)[:5]}"
    missing = set(stable) - set(seen)
    assert not missing, f"{len(missing)} untouched entries were skipped, e.g. {sorted(missing)[:3]}"
    assert set(os.listdir(d)) == set(stable) | set(added)


def test_readdir_of_a_fresh_directory_after_removing_everything(d):
    for i in range(100):
        write_file(d / f"f{i}")
    for i in range(100):
        os.unlink(d / f"f{i}")
    assert os.listdir(d) == []
    os.rmdir(d)
    os.mkdir(d)
