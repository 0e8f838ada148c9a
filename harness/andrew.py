"""The modified Andrew benchmark's workload (BFT paper, TOCS 2002 / OSDI 2000, "Andrew100") over a real C tree,
and the source trees it copies: what `make bench-fs` times and the fault test copies (no timing here).

The tree is Lua 5.4 from Debian's source package, cached by `make deps` (scripts/fetch-lua-source.sh) in
$BFTFS_SRC_CACHE (default /opt/bftfs/src)/lua5.4. Over n copies: phase 1 creates the directories, 2 copies
the files (sources preloaded into memory, so only the writes touch the file system), 3 lstat()s every file and
directory, 4 reads every byte, 5 compiles each copy with Lua's own makefile (`make -j2 linux`, gcc -O2; two
jobs for this machine's two cores) one copy after another.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from harness.procs import HarnessError, kill_group

PHASES = ("mkdir", "copy", "stat", "read", "compile")
PHASE_TITLES = {"mkdir": "1 create directories", "copy": "2 copy the tree", "stat": "3 stat every file",
                "read": "4 read every byte", "compile": "5 compile"}
COMPILE_JOBS = 2
COMPILE_TARGET = "linux"
READ_CHUNK = 65536
STEP_TIMEOUT_S = 1800.0  # one command (grep, one copy's make) that runs longer than this has hung


@dataclass
class SourceTree:
    """A directory tree held in memory: directories (relative, parents first) and files with mode and bytes."""
    root: Path
    dirs: list[str] = field(default_factory=list)
    files: list[tuple[str, int, bytes]] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(len(data) for _, _, data in self.files)


def load_tree(root: Path, rel_paths: Sequence[Path] | None = None) -> SourceTree:
    """Reads `root` (or only `rel_paths` under it) into memory. Symlinks and special files are refused: the
    benchmark trees hold regular files and directories only."""
    tree = SourceTree(root)
    if rel_paths is None:
        rel_paths = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            base = Path(dirpath).relative_to(root)
            rel_paths.extend(base / name for name in sorted(filenames))
            tree.dirs.extend(str(base / d) for d in dirnames)
    else:
        seen: set[str] = set()
        for rel in rel_paths:
            for parent in reversed(rel.parents[:-1]):
                if str(parent) not in seen:
                    seen.add(str(parent))
                    tree.dirs.append(str(parent))
    for rel in rel_paths:
        path = root / rel
        st = path.lstat()
        if not (st.st_mode & 0o170000 == 0o100000):
            raise HarnessError(f"{path}: not a regular file")
        tree.files.append((str(rel), st.st_mode & 0o777, path.read_bytes()))
    return tree


def lua_source() -> tuple[SourceTree, dict]:
    """The Lua tree cached by `make deps` (scripts/fetch-lua-source.sh) and its SOURCE record; SystemExit
    saying how to fetch it when it is missing."""
    cache = Path(os.environ.get("BFTFS_SRC_CACHE", "/opt/bftfs/src")) / "lua5.4"
    record = cache / "SOURCE"
    if not record.is_file() or not (cache / "lua" / "Makefile").is_file():
        raise SystemExit(f"{cache}/lua is missing: run `make deps` (or bash scripts/fetch-lua-source.sh)")
    info = dict(line.split(" ", 1) for line in record.read_text().splitlines() if " " in line)
    return load_tree(cache / "lua"), info


def build_env() -> dict:
    """The environment for the compile phase: no make jobserver or flags inherited from a calling make, the C
    locale, and no ccache (the compile must do its work every time)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "GNUMAKEFLAGS", "CCACHE_DIR")}
    env["LC_ALL"] = "C"
    env["CCACHE_DISABLE"] = "1"
    return env


def write_tree(tree: SourceTree, dest: Path) -> None:
    """Creates `tree` under `dest` (which exists): directories, then files created with their mode."""
    for d in tree.dirs:
        os.mkdir(dest / d)
    for rel, mode, data in tree.files:
        write_file(dest / rel, data, mode)


def write_file(path: Path, data: bytes, mode: int = 0o644, chunk: int = 1 << 20, fsync: bool = False) -> None:
    """Creates `path` (O_EXCL) with `data`, in write() calls of `chunk` bytes, fsynced if asked."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        off = 0
        while off < len(view):
            off += os.write(fd, view[off:off + chunk])
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_all(path: Path) -> int:
    """Reads `path` to its end in READ_CHUNK reads; returns the bytes read."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    total = 0
    try:
        while True:
            n = len(os.read(fd, READ_CHUNK))
            if n == 0:
                return total
            total += n
    finally:
        os.close(fd)


def hash_tree(root: Path) -> dict[str, str]:
    """Every entry under `root` by relative path: its type and permission bits, and for a file the SHA-256 of
    its bytes (a symlink: its target). Times are left out: they differ between any two runs."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            perm = f"{st.st_mode & 0o7777:04o}"
            if os.path.islink(path):
                out[rel] = f"link {perm} {os.readlink(path)}"
            elif os.path.isdir(path):
                out[rel] = f"dir {perm}"
            else:
                h = hashlib.sha256()
                with open(path, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
                out[rel] = f"file {perm} {st.st_size} {h.hexdigest()}"
    return out


def tree_digest(hashes: dict[str, str]) -> str:
    """One SHA-256 over hash_tree's result, in path order."""
    h = hashlib.sha256()
    for rel in sorted(hashes):
        h.update(f"{rel}\0{hashes[rel]}\n".encode())
    return h.hexdigest()


class Andrew:
    """The Andrew workload over `copies` copies of `tree` under `root`/andrew, one phase per method (PHASES:
    phase_mkdir, phase_copy, phase_stat, phase_read, phase_compile), each checking what it did; `name` labels
    errors and the compile logs (in `log_dir`). HarnessError on a wrong result or a failed compile.

    `hook(phase, fraction)` is called after each file in phases 2-4 and after each copy in phase 5; whoever runs
    the phases calls it at the start (fraction 0) and end (fraction 1) of each: a fault plan hangs its faults
    on it."""

    def __init__(self, name: str, root: Path, tree: SourceTree, copies: int, log_dir: Path,
                 hook: Callable[[str, float], None] | None = None) -> None:
        self.name = name
        self.base = root / "andrew"
        self.tree = tree
        self.copies = copies
        self.log_dir = log_dir
        self.hook = hook or (lambda phase, fraction: None)
        self.copy_dirs = [self.base / f"c{k:03d}" for k in range(copies)]

    def phase(self, phase: str) -> Callable[[], None]:
        """The method that runs `phase` (one of PHASES)."""
        return getattr(self, f"phase_{phase}")

    def phase_mkdir(self) -> None:
        os.mkdir(self.base)
        for copy in self.copy_dirs:
            os.mkdir(copy)
            for d in self.tree.dirs:
                os.mkdir(copy / d)

    def phase_copy(self) -> None:
        total = len(self.copy_dirs) * len(self.tree.files)
        done = 0
        for copy in self.copy_dirs:
            for rel, mode, data in self.tree.files:
                write_file(copy / rel, data, mode)
                done += 1
                self.hook("copy", done / total)

    def _walk(self):
        """Every path under the copies (directories and files), by readdir, without the data."""
        for copy in self.copy_dirs:
            for dirpath, dirnames, filenames in os.walk(copy):
                yield dirpath
                for name in filenames:
                    yield os.path.join(dirpath, name)

    def phase_stat(self) -> None:
        expected = len(self.copy_dirs) * (1 + len(self.tree.dirs) + len(self.tree.files))
        n = 0
        for path in self._walk():
            os.lstat(path)
            n += 1
            self.hook("stat", n / expected)
        if n != expected:
            raise HarnessError(f"{self.name}: stat phase saw {n} entries, {expected} expected")

    def phase_read(self) -> None:
        total = len(self.copy_dirs) * len(self.tree.files)
        done = 0
        for copy in self.copy_dirs:
            for rel, _mode, data in self.tree.files:
                got = read_all(copy / rel)
                if got != len(data):
                    raise HarnessError(f"{self.name}: {copy / rel} has {got} bytes, {len(data)} written")
                done += 1
                self.hook("read", done / total)

    def phase_compile(self) -> None:
        for k, copy in enumerate(self.copy_dirs):
            log = self.log_dir / f"{self.name}-compile-c{k:03d}.log"
            argv = ["make", "-C", str(copy), f"-j{COMPILE_JOBS}", COMPILE_TARGET]
            with open(log, "ab") as out:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        env=build_env(), start_new_session=True)
                try:
                    rc = proc.wait(timeout=STEP_TIMEOUT_S)
                except BaseException:
                    kill_group(proc)
                    raise
            if rc != 0:
                tail = log.read_text(errors="replace")[-1500:]
                raise HarnessError(f"{self.name}: `{shlex.join(argv)}` exited {rc}:\n{tail}")
            self.hook("compile", (k + 1) / len(self.copy_dirs))

    def check_tree(self) -> None:
        """Every copied file reads back with the bytes written (untimed; read it cold to mean anything)."""
        for copy in self.copy_dirs:
            for rel, _mode, data in self.tree.files:
                if (copy / rel).read_bytes() != data:
                    raise HarnessError(f"{self.name}: {copy / rel} reads back different from the source")

    def check_build(self) -> None:
        """The first copy's freshly built interpreter runs a script (untimed; exec from the file system)."""
        lua = self.copy_dirs[0] / "src" / "lua"
        done = subprocess.run([str(lua), "-e", "print(6 * 7)"], capture_output=True, text=True, timeout=60)
        if done.returncode != 0 or done.stdout.strip() != "42":
            raise HarnessError(f"{self.name}: the built {lua} does not run: rc {done.returncode} "
                               f"{done.stdout.strip()!r} {done.stderr.strip()[-300:]!r}")
