"""Concurrent name-space stress: several processes create, link, rename, unlink, mkdir, rmdir and write in a
small shared tree at once (bounded op counts, fixed seeds), then the tree must be consistent: every name
resolves, every file's st_nlink equals the number of names that reach it, every directory's st_nlink is 2 plus
its subdirectories, '..' points at the parent, and no operation ever failed with an errno that a local file
system never gives for it (ESTALE, EIO, ...). (posix_suite.py says where this runs.)"""

from __future__ import annotations

import errno
import os
import random
import stat
from collections import Counter

import pytest

pytest_plugins = ["posix_suite"]

# What these operations may legitimately fail with while other processes change the same names.
# EPERM: link() of a directory; ELOOP: a symlink that names itself (or a cycle of them).
EXPECTED = {errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR, errno.EINVAL,
            errno.EBUSY, errno.EMLINK, errno.EPERM, errno.ELOOP}
NAMES = [f"n{i}" for i in range(8)]
DIRS = ["", "d0", "d1", "d0/d2"]


def worker(root: str, seed: int, ops: int) -> dict:
    rng = random.Random(seed)
    bad = []
    counts = Counter()

    def path():
        return os.path.join(root, rng.choice(DIRS), rng.choice(NAMES))

    for _ in range(ops):
        kind = rng.choice(["create", "write", "link", "rename", "unlink", "mkdir", "rmdir", "stat", "list",
                           "renamedir", "symlink"])
        try:
            if kind == "create":
                fd = os.open(path(), os.O_CREAT | os.O_WRONLY, 0o644)
                os.close(fd)
            elif kind == "write":
                fd = os.open(path(), os.O_WRONLY | os.O_APPEND)
                try:
                    os.write(fd, b"w" * rng.randrange(1, 5000))
                finally:
                    os.close(fd)
            elif kind == "link":
                os.link(path(), path())
            elif kind in ("rename", "renamedir"):
                os.rename(path(), path())
            elif kind == "unlink":
                os.unlink(path())
            elif kind == "mkdir":
                os.mkdir(path())
            elif kind == "rmdir":
                os.rmdir(path())
            elif kind == "symlink":
                os.symlink(rng.choice(NAMES), path())
            elif kind == "stat":
                os.lstat(path())
            else:
                d = os.path.join(root, rng.choice(DIRS))
                for n in os.listdir(d):
                    try:
                        os.lstat(os.path.join(d, n))
                    except OSError as e:
                        if e.errno != errno.ENOENT:
                            raise
            counts[kind] += 1
        except OSError as e:
            if e.errno not in EXPECTED:
                bad.append(f"{kind}: {errno.errorcode.get(e.errno, e.errno)} {e}")
    return {"bad": bad, "counts": dict(counts)}


def run_workers(root, seeds, ops):
    import pickle
    procs = []
    for s in seeds:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(r)
                out = pickle.dumps(worker(str(root), s, ops))
                with os.fdopen(w, "wb") as f:
                    f.write(out)
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        procs.append((pid, r))
    results = []
    for pid, r in procs:
        with os.fdopen(r, "rb") as f:
            data = f.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "a worker crashed"
        results.append(pickle.loads(data))
    return results


def check_tree(root) -> None:
    """Walks the tree and checks link counts and '..' against what the walk saw."""
    names_per_inode = Counter()
    file_nlink = {}
    for dirpath, dirnames, filenames in os.walk(root):
        links = [n for n in dirnames if os.path.islink(os.path.join(dirpath, n))]   # symlinks to directories
        subdirs = [n for n in dirnames if n not in links]
        filenames = filenames + links
        st = os.lstat(dirpath)
        assert st.st_nlink == 2 + len(subdirs), f"{dirpath}: nlink {st.st_nlink}, {len(subdirs)} subdirs"
        if dirpath != str(root):
            assert os.stat(os.path.join(dirpath, "..")).st_ino == os.stat(os.path.dirname(dirpath)).st_ino, dirpath
        for n in filenames:
            p = os.path.join(dirpath, n)
            s = os.lstat(p)
            assert stat.S_ISREG(s.st_mode) or stat.S_ISLNK(s.st_mode), p
            if stat.S_ISREG(s.st_mode):
                names_per_inode[s.st_ino] += 1
                file_nlink[s.st_ino] = (s.st_nlink, p)
                with open(p, "rb") as f:
                    data = f.read()
                assert len(data) == s.st_size and data == b"w" * len(data), f"{p}: contents"
    for ino, count in names_per_inode.items():
        nlink, p = file_nlink[ino]
        assert nlink == count, f"{p}: st_nlink {nlink} but {count} names in the tree"


@pytest.mark.parametrize("seed", [1, 2])
def test_concurrent_namespace_changes_leave_a_consistent_tree(d, seed):
    for sub in DIRS[1:]:
        os.makedirs(d / sub, exist_ok=True)
    results = run_workers(d, [seed * 100 + k for k in range(4)], 500)
    bad = [b for r in results for b in r["bad"]]
    assert not bad, f"{len(bad)} unexpected errors, e.g. {bad[:5]}"
    check_tree(d)


def _churn(p: str, q: str, mode: str, rounds: int) -> None:
    """Another process: makes and removes the name `p` again and again (unlink, or rename of `q` over it)."""
    for _ in range(rounds):
        try:
            target = q if mode == "rename" else p
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
            if mode == "rename":
                os.rename(q, p)
            else:
                os.unlink(p)
        except OSError as e:
            if e.errno not in (errno.ENOENT,):
                raise


@pytest.mark.parametrize("mode", ["unlink", "rename"])
def test_open_write_close_racing_with_unlink_or_rename_over(d, mode):
    """A local file system gives an opener either the file (then write and close succeed, even if the name is
    removed or replaced meanwhile) or ENOENT; never ESTALE, and never an error from close()."""
    p, q = str(d / "p"), str(d / "q")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _churn(p, q, mode, 1500)
            code = 0
        finally:
            os._exit(code)
    errors = Counter()
    opened = 0
    try:
        for _ in range(1500):
            stage = "open"
            try:
                fd = os.open(p, os.O_WRONLY | os.O_APPEND)
                opened += 1
                try:
                    stage = "write"
                    os.write(fd, b"x" * 100)
                finally:
                    stage = "close"
                    os.close(fd)
            except OSError as e:
                if not (stage == "open" and e.errno == errno.ENOENT):
                    errors[(stage, errno.errorcode.get(e.errno, e.errno))] += 1
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the churning process failed"
    assert not errors, f"{sum(errors.values())} failures in {opened} opens: {dict(errors)}"
