"""POSIX conformance: permissions, ownership, chmod/chown/utimensat rules, setuid/setgid, sticky directories,
as root and as unprivileged users (posix_suite.py says where this runs and how users are switched)."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from harness.users import User, as_user
from posix_suite import (GROUP_C_ONLY, GROUP_SHARED, USER_A, USER_B, USER_C, clock_tick, open_close, raises_errno,
                         read_file, write_file)

pytest_plugins = ["posix_suite"]

UTIME_NOW = (1 << 30) - 1   # the kernel's UTIME_NOW / UTIME_OMIT nsec markers are not exposed by Python
T_PAST = 1_000_000_000_123_456_789   # 2001-09-09, with nanoseconds


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def owned_file(d, name: str, user, perm: int, data: bytes = b"data"):
    p = d / name
    write_file(p, data)
    os.chown(p, user.uid, user.gid)
    os.chmod(p, perm)
    return p


# ---- permission bits ------------------------------------------------------------------------------------


def test_owner_group_other_classes_are_exclusive(shared_dir):
    # Owner bits apply to the owner even when the group bits would allow more (no fall-through).
    p = owned_file(shared_dir, "f", USER_A, 0o070)
    os.chown(p, USER_A.uid, GROUP_SHARED)
    with raises_errno(errno.EACCES):
        as_user(USER_A, read_file, p)
    assert as_user(USER_B, read_file, p) == b"data"       # group member through a supplementary group
    with raises_errno(errno.EACCES):
        as_user(USER_C, read_file, p)                     # other: no bits
    os.chmod(p, 0o007)
    assert as_user(USER_C, read_file, p) == b"data"
    with raises_errno(errno.EACCES):
        as_user(USER_B, read_file, p)                     # group class denies, other would allow


def test_read_write_bits_on_files(shared_dir):
    p = owned_file(shared_dir, "f", USER_A, 0o644)
    assert as_user(USER_B, read_file, p) == b"data"
    with raises_errno(errno.EACCES):
        as_user(USER_B, os.open, p, os.O_WRONLY)
    with raises_errno(errno.EACCES):
        as_user(USER_B, os.truncate, p, 0)
    os.chmod(p, 0o600)
    with raises_errno(errno.EACCES):
        as_user(USER_B, read_file, p)
    as_user(USER_A, write_file, p, b"owner writes")
    assert read_file(p) == b"owner writes"
    os.chmod(p, 0o000)
    assert read_file(p) == b"owner writes", "root reads a mode 000 file"
    write_file(p, b"root writes")
    with raises_errno(errno.EACCES):
        as_user(USER_A, read_file, p)


def test_access_through_any_of_many_supplementary_groups(shared_dir):
    """Linux allows 65536 supplementary groups; access through the 17th or the 30th counts like the first
    (NFS AUTH_SYS stops at 16, a local file system does not)."""
    groups = tuple(range(48000, 48030))
    many = User(USER_A.uid, USER_A.gid, (USER_A.gid, *groups))
    for k in (0, 15, 16, 29):
        f = shared_dir / f"g{k}"
        write_file(f, b"grp")
        os.chown(f, 0, groups[k])
        os.chmod(f, 0o060)
        sub = shared_dir / f"dir{k}"
        os.mkdir(sub)
        os.chown(sub, 0, groups[k])
        os.chmod(sub, 0o070)
        assert as_user(many, read_file, f) == b"grp", k
        as_user(many, write_file, sub / "new", b"made through group %d" % k)
        as_user(many, os.chmod, sub / "new", 0o600)
        as_user(many, os.rename, sub / "new", sub / "renamed")
        as_user(many, os.unlink, sub / "renamed")


def test_access_reports_what_open_allows(shared_dir):
    p = owned_file(shared_dir, "f", USER_A, 0o640)
    os.chown(p, USER_A.uid, GROUP_SHARED)
    assert as_user(USER_A, os.access, p, os.R_OK | os.W_OK)
    assert not as_user(USER_A, os.access, p, os.X_OK)
    assert as_user(USER_B, os.access, p, os.R_OK)
    assert not as_user(USER_B, os.access, p, os.W_OK)
    assert not as_user(USER_C, os.access, p, os.R_OK)
    assert as_user(USER_C, os.access, p, os.F_OK)


def test_directory_search_and_read_bits(shared_dir):
    sub = shared_dir / "sub"
    os.mkdir(sub)
    write_file(sub / "f", b"inside")
    os.chown(sub, USER_A.uid, USER_A.gid)
    os.chmod(sub, 0o700)
    with raises_errno(errno.EACCES):
        as_user(USER_B, os.stat, sub / "f")
    with raises_errno(errno.EACCES):
        as_user(USER_B, os.listdir, sub)
    os.chmod(sub, 0o711)  # search without read: lookups by name work, listing does not
    assert as_user(USER_B, read_file, sub / "f") == b"inside"
    with raises_errno(errno.EACCES):
        as_user(USER_B, os.listdir, sub)
    os.chmod(sub, 0o744)  # read without search: names are listed, but nothing can be looked up
    assert as_user(USER_B, os.listdir, sub) == ["f"]
    with raises_errno(errno.EACCES):
        as_user(USER_B, os.stat, sub / "f")
    with raises_errno(errno.EACCES):
        as_user(USER_B, os.chdir, sub)


def test_creating_and_removing_entries_needs_write_and_search_on_the_directory(shared_dir):
    sub = shared_dir / "sub"
    os.mkdir(sub)
    owned_file(sub, "victim", USER_A, 0o644)   # A's own file: protected_hardlinks does not interfere
    os.chmod(sub, 0o755)
    for call in (lambda: open_close(sub / "new", os.O_CREAT | os.O_WRONLY),
                 lambda: os.mkdir(sub / "newdir"),
                 lambda: os.symlink("x", sub / "newlink"),
                 lambda: os.mkfifo(sub / "newfifo"),
                 lambda: os.unlink(sub / "victim"),
                 lambda: os.rename(sub / "victim", sub / "renamed"),
                 lambda: os.link(sub / "victim", sub / "hard")):
        with raises_errno(errno.EACCES):
            as_user(USER_A, call)
    os.chmod(sub, 0o333)  # write + search without read is enough
    as_user(USER_A, open_close, sub / "new", os.O_CREAT | os.O_WRONLY)
    as_user(USER_A, os.unlink, sub / "victim")
    os.chmod(sub, 0o777)
    assert sorted(os.listdir(sub)) == ["new"]


def test_moving_a_directory_to_another_parent_needs_write_on_it(shared_dir):
    os.mkdir(shared_dir / "a")
    os.mkdir(shared_dir / "b")
    os.mkdir(shared_dir / "a" / "moved")
    os.chmod(shared_dir / "a", 0o777)
    os.chmod(shared_dir / "b", 0o777)
    os.chmod(shared_dir / "a" / "moved", 0o555)  # its '..' must change, which needs w on it
    with raises_errno(errno.EACCES):
        as_user(USER_A, os.rename, shared_dir / "a" / "moved", shared_dir / "b" / "moved")
    # within the same parent '..' does not change: allowed
    as_user(USER_A, os.rename, shared_dir / "a" / "moved", shared_dir / "a" / "renamed")
    os.chmod(shared_dir / "a" / "renamed", 0o777)
    as_user(USER_A, os.rename, shared_dir / "a" / "renamed", shared_dir / "b" / "moved")
    assert os.listdir(shared_dir / "b") == ["moved"]


# ---- chmod -----------------------------------------------------------------------------------------------


def test_chmod_by_owner_and_root_only(shared_dir):
    p = owned_file(shared_dir, "f", USER_A, 0o644)
    as_user(USER_A, os.chmod, p, 0o600)
    assert mode(p) == 0o600
    with raises_errno(errno.EPERM):
        as_user(USER_B, os.chmod, p, 0o666)
    assert mode(p) == 0o600
    os.chmod(p, 0o7777)
    assert mode(p) == 0o7777


def test_chmod_changes_ctime_not_mtime(d):
    p = d / "f"
    write_file(p, b"x")
    os.utime(p, ns=(T_PAST, T_PAST))
    before = os.stat(p)
    clock_tick()
    os.chmod(p, 0o600)
    after = os.stat(p)
    assert after.st_mtime_ns == T_PAST
    assert after.st_ctime_ns > before.st_ctime_ns


def test_chmod_of_setgid_by_a_non_member_owner_is_silently_dropped(shared_dir):
    p = owned_file(shared_dir, "f", USER_A, 0o644)
    os.chown(p, USER_A.uid, GROUP_C_ONLY)         # owner A is not in the file's group
    as_user(USER_A, os.chmod, p, 0o2755)
    assert mode(p) == 0o755
    os.chown(p, USER_A.uid, GROUP_SHARED)         # now A is a member
    as_user(USER_A, os.chmod, p, 0o2755)
    assert mode(p) == 0o2755


def test_chmod_follows_symlinks_and_fchmod_works(d):
    write_file(d / "f")
    os.symlink("f", d / "l")
    os.chmod(d / "l", 0o604)
    assert mode(d / "f") == 0o604
    assert stat.S_IMODE(os.lstat(d / "l").st_mode) == 0o777
    fd = os.open(d / "f", os.O_RDONLY)
    os.fchmod(fd, 0o640)
    os.close(fd)
    assert mode(d / "f") == 0o640


# ---- chown -----------------------------------------------------------------------------------------------


def test_chown_by_root(d):
    p = d / "f"
    write_file(p)
    before = os.stat(p)
    clock_tick()
    os.chown(p, 12345, 54321)
    st = os.stat(p)
    assert (st.st_uid, st.st_gid) == (12345, 54321)
    assert st.st_ctime_ns > before.st_ctime_ns
    os.chown(p, -1, 777)
    st = os.stat(p)
    assert (st.st_uid, st.st_gid) == (12345, 777)
    os.mkdir(d / "sub")
    os.chown(d / "sub", USER_A.uid, USER_A.gid)
    assert os.stat(d / "sub").st_uid == USER_A.uid


def test_unprivileged_chown_rules(shared_dir):
    p = owned_file(shared_dir, "f", USER_A, 0o644)
    with raises_errno(errno.EPERM):
        as_user(USER_A, os.chown, p, USER_B.uid, -1)   # giving a file away
    with raises_errno(errno.EPERM):
        as_user(USER_A, os.chown, p, -1, GROUP_C_ONLY)   # a group A is not in
    with raises_errno(errno.EPERM):
        as_user(USER_B, os.chown, p, -1, GROUP_SHARED)   # not the owner, even to a shared group
    as_user(USER_A, os.chown, p, USER_A.uid, -1)          # to itself: allowed
    as_user(USER_A, os.chown, p, -1, GROUP_SHARED)       # to a supplementary group: allowed
    assert (os.stat(p).st_uid, os.stat(p).st_gid) == (USER_A.uid, GROUP_SHARED)


def test_chown_clears_setuid_and_setgid_of_a_group_executable_file(shared_dir):
    p = owned_file(shared_dir, "f", USER_A, 0o6755)
    as_user(USER_A, os.chown, p, -1, GROUP_SHARED)
    assert mode(p) == 0o755
    q = owned_file(shared_dir, "g", USER_A, 0o6745)   # setgid without group exec marks mandatory locking
    as_user(USER_A, os.chown, q, -1, GROUP_SHARED)
    assert mode(q) == 0o2745
    r = owned_file(shared_dir, "h", USER_A, 0o6755)   # root's chown clears them on Linux too
    os.chown(r, USER_B.uid, USER_B.gid)
    assert mode(r) == 0o755


def test_chown_keeps_setgid_on_directories(shared_dir):
    sub = shared_dir / "sub"
    os.mkdir(sub)
    os.chmod(sub, 0o2775)
    os.chown(sub, USER_A.uid, GROUP_SHARED)
    assert mode(sub) == 0o2775


def test_lchown_changes_the_symlink_not_its_target(d):
    write_file(d / "f")
    os.symlink("f", d / "l")
    os.lchown(d / "l", USER_A.uid, USER_A.gid)
    assert os.lstat(d / "l").st_uid == USER_A.uid
    assert os.stat(d / "f").st_uid == 0
    os.chown(d / "l", USER_B.uid, USER_B.gid)      # follows
    assert os.stat(d / "f").st_uid == USER_B.uid
    assert os.lstat(d / "l").st_uid == USER_A.uid


# ---- writes and truncation by others clear setuid/setgid -------------------------------------------------


def _write_some(path) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, b"w")
    finally:
        os.close(fd)


def test_unprivileged_write_clears_setuid_and_setgid(shared_dir):
    p = owned_file(shared_dir, "f", USER_A, 0o6777)
    as_user(USER_B, _write_some, p)
    assert mode(p) == 0o777
    # setgid without group exec: kept when the writer is in the file's group, else cleared (Linux >= 6.2,
    # setattr_should_drop_sgid)
    q = owned_file(shared_dir, "g", USER_A, 0o6767)
    os.chown(q, USER_A.uid, GROUP_SHARED)
    os.chmod(q, 0o6767)
    as_user(USER_B, _write_some, q)
    assert mode(q) == 0o2767
    as_user(USER_C, _write_some, q)
    assert mode(q) == 0o767
    r = owned_file(shared_dir, "h", USER_A, 0o4777)
    as_user(USER_B, os.truncate, r, 1)
    assert mode(r) == 0o777


def test_root_write_keeps_setuid(shared_dir):
    p = owned_file(shared_dir, "f", USER_A, 0o6755)
    _write_some(p)
    os.truncate(p, 0)
    assert mode(p) == 0o6755


# ---- sticky directories ----------------------------------------------------------------------------------


@pytest.fixture
def sticky(shared_dir):
    os.chmod(shared_dir, 0o1777)
    return shared_dir


def test_sticky_directory_protects_others_entries(sticky):
    f = owned_file(sticky, "a_file", USER_A, 0o666)
    os.mkdir(sticky / "a_dir")
    os.chown(sticky / "a_dir", USER_A.uid, USER_A.gid)
    as_user(USER_B, write_file, sticky / "b_file", b"b")
    with raises_errno(errno.EPERM):
        as_user(USER_B, os.unlink, f)
    with raises_errno(errno.EPERM):
        as_user(USER_B, os.rename, f, sticky / "stolen")
    with raises_errno(errno.EPERM):
        as_user(USER_B, os.rename, sticky / "b_file", f)   # replacing A's file
    with raises_errno(errno.EPERM):
        as_user(USER_B, os.rmdir, sticky / "a_dir")
    assert as_user(USER_B, read_file, f) == b"data"         # writing into it is a matter of its mode
    as_user(USER_A, os.rename, f, sticky / "a_renamed")      # the owner may
    as_user(USER_A, os.rmdir, sticky / "a_dir")
    as_user(USER_B, os.unlink, sticky / "b_file")
    os.unlink(sticky / "a_renamed")                          # root may
    assert os.listdir(sticky) == []


def test_sticky_directory_owner_may_remove_anything(sticky):
    os.chown(sticky, USER_C.uid, USER_C.gid)
    f = owned_file(sticky, "a_file", USER_A, 0o600)
    as_user(USER_C, os.unlink, f)
    assert not os.path.exists(f)


# ---- setgid directories ----------------------------------------------------------------------------------


def test_setgid_directory_passes_its_group_down(shared_dir):
    sub = shared_dir / "sgid"
    os.mkdir(sub)
    os.chown(sub, 0, GROUP_SHARED)
    os.chmod(sub, 0o2777)

    def make():
        os.umask(0o022)
        write_file(sub / "file", b"", 0o644)
        os.mkdir(sub / "dir", 0o755)
        os.symlink("file", sub / "link")
        os.mkfifo(sub / "fifo", 0o644)

    as_user(USER_A, make)
    for name in ("file", "dir", "fifo"):
        st = os.stat(sub / name)
        assert (st.st_uid, st.st_gid) == (USER_A.uid, GROUP_SHARED), name
    assert os.lstat(sub / "link").st_gid == GROUP_SHARED
    assert mode(sub / "dir") == 0o2755, "a new directory inherits S_ISGID"
    assert mode(sub / "file") == 0o644
    # without S_ISGID: the creator's primary group
    os.chmod(sub, 0o777)
    as_user(USER_A, write_file, sub / "plain")
    assert os.stat(sub / "plain").st_gid == USER_A.gid


def test_mkdir_ignores_setuid_and_setgid_in_its_mode(d):
    old = os.umask(0)
    try:
        os.mkdir(d / "x", 0o6777)
        os.mkdir(d / "y", 0o1777)
    finally:
        os.umask(old)
    assert mode(d / "x") == 0o777
    assert mode(d / "y") == 0o1777


# ---- utimensat -------------------------------------------------------------------------------------------


def test_explicit_times_with_nanoseconds_by_owner_and_root(shared_dir):
    p = owned_file(shared_dir, "f", USER_A, 0o644)
    os.utime(p, ns=(T_PAST, T_PAST + 1))
    st = os.stat(p)
    assert (st.st_atime_ns, st.st_mtime_ns) == (T_PAST, T_PAST + 1)
    as_user(USER_A, os.utime, p, ns=(T_PAST + 5, T_PAST + 7))
    st = os.stat(p)
    assert (st.st_atime_ns, st.st_mtime_ns) == (T_PAST + 5, T_PAST + 7)


def test_utime_now_and_explicit_rules_for_non_owners(shared_dir):
    p = owned_file(shared_dir, "f", USER_A, 0o646)   # B may write (other w)
    os.utime(p, ns=(T_PAST, T_PAST))
    as_user(USER_B, os.utime, p, None)              # "now" needs write permission only
    assert os.stat(p).st_mtime_ns > T_PAST
    with raises_errno(errno.EPERM):
        as_user(USER_B, os.utime, p, ns=(T_PAST, T_PAST))   # explicit times need ownership
    os.chmod(p, 0o644)
    with raises_errno(errno.EACCES):
        as_user(USER_B, os.utime, p, None)


def test_utime_omit_and_now_per_field(d):
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)

    class Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

    UTIME_OMIT = (1 << 30) - 2
    p = d / "f"
    write_file(p)
    os.utime(p, ns=(T_PAST, T_PAST))
    times = (Timespec * 2)(Timespec(0, UTIME_OMIT), Timespec(0, UTIME_NOW))
    assert libc.utimensat(-100, os.fsencode(p), times, 0) == 0, os.strerror(ctypes.get_errno())
    st = os.stat(p)
    assert st.st_atime_ns == T_PAST
    assert st.st_mtime_ns > T_PAST
    times = (Timespec * 2)(Timespec(1_500_000_000, 42), Timespec(0, UTIME_OMIT))
    assert libc.utimensat(-100, os.fsencode(p), times, 0) == 0, os.strerror(ctypes.get_errno())
    st2 = os.stat(p)
    assert st2.st_atime_ns == 1_500_000_000_000_000_042
    assert st2.st_mtime_ns == st.st_mtime_ns


def test_times_before_1970_and_far_future(d):
    p = d / "f"
    write_file(p)
    old = -315_619_200 * 10**9 + 5     # 1960-01-01 plus 5 ns
    os.utime(p, ns=(old, old))
    st = os.stat(p)
    assert (st.st_atime_ns, st.st_mtime_ns) == (old, old)
    future = 4_102_444_800 * 10**9      # 2100-01-01
    os.utime(p, ns=(future, future))
    assert os.stat(p).st_mtime_ns == future


# The smallest upper limit this suite accepts for stored times: 2262-04-11, the end of signed 64-bit
# nanoseconds (bftfs; ext4 ends in 2446, tmpfs later); and the largest lower limit: 1901-12-13, the start of
# a signed 32-bit time_t (ext4; bftfs starts in 1677).
T_LIMIT_MAX_S = 9_223_372_036
T_LIMIT_MIN_S = -2_147_483_648


def test_times_beyond_the_range_are_clamped_never_wrapped(d):
    """2600 and 1600 are past what some file systems store (ext4: 2446, bftfs: 1677..2262): a time may be
    clamped to the file system's largest or smallest time, but must never come back as a time on the other
    side of 1970 or in the middle of the range (a wrapped counter)."""
    p = d / "f"
    write_file(p)
    y2600 = 19_880_899_200 * 10**9
    os.utime(p, ns=(y2600, y2600))
    got = os.stat(p).st_mtime_ns
    assert got == y2600 or got >= T_LIMIT_MAX_S * 10**9, f"2600-01-01 came back as {got // 10**9} s"
    y1600 = -11_676_096_000 * 10**9
    os.utime(p, ns=(y1600, y1600))
    got = os.stat(p).st_mtime_ns
    assert got == y1600 or got <= T_LIMIT_MIN_S * 10**9, f"1600-01-01 came back as {got // 10**9} s"


def test_utime_changes_ctime(d):
    p = d / "f"
    write_file(p)
    before = os.stat(p)
    clock_tick()
    os.utime(p, ns=(T_PAST, T_PAST))
    assert os.stat(p).st_ctime_ns > before.st_ctime_ns


def test_utime_on_symlink_itself(d):
    write_file(d / "f")
    os.symlink("f", d / "l")
    os.utime(d / "f", ns=(T_PAST, T_PAST))
    os.utime(d / "l", ns=(T_PAST + 1000, T_PAST + 1000), follow_symlinks=False)
    assert os.lstat(d / "l").st_mtime_ns == T_PAST + 1000
    assert os.stat(d / "f").st_mtime_ns == T_PAST
