#!/usr/bin/env python3
"""File-system benchmarks: the PBFT-CS paper's NFS micro-benchmarks (NSDI 2009, section 6.2) and the BFT
paper's modified Andrew benchmark (TOCS 2002 / OSDI 2000, "Andrew100"), on four systems:

  native   a directory on this machine's own disk (ext4 or whatever /tmp is on), no FUSE
  local    `bftfs mount --local`: our FUSE client with the file service in-process (no network, no agreement)
  norep    `bftfs cluster start --norep` + `bftfs mount --relay`: one unreplicated server behind the relay
  pbft     `bftfs cluster start --f 1` + `bftfs mount --relay`: 4 replicas (PBFT, the shim) behind the relay

Workloads (each measured on a fresh service state, in this order):
  grep        `grep -r -c -F struct` over ~9.1 MB of C headers from /usr/include (the Linux UAPI headers first,
              as in the paper), copied onto the file system in untimed setup and read cold (after a remount)
  write       one file of 3.9 MB (3,900,000 bytes) in 8 KiB write() calls; the time covers open, the writes,
              fsync and close (the paper's client blocks at close; fsync makes native pay for its disk too)
  create100   100 files of 4 KB in a new directory: open(O_CREAT|O_EXCL), one 4096-byte write, close
  andrew      the modified Andrew benchmark over n copies of a real C tree (Lua 5.4 from Debian's source package,
              `make deps` caches it in /opt/bftfs/src/lua5.4): phase 1 creates the directories of n copies,
              2 copies the files (sources preloaded into memory, so only the writes touch the file system),
              3 lstat()s every file and directory, 4 reads every byte, 5 compiles each copy with Lua's own
              makefile (`make -j2 linux`, gcc -O2; two jobs for the machine's two cores) one copy after another

Caches. Between the phases of Andrew (before 3, 4 and 5) and before grep the client's caches are emptied: the
FUSE systems are unmounted and mounted again (kernel dentries, attributes and pages, and the client's own
cache, all go); for native the tree is synced and every file's pages are dropped with
posix_fadvise(DONTNEED) (its dentries and inodes stay cached: dropping those needs a machine-wide
drop_caches, which would disturb everyone else on a shared machine). Without this, phases 3 and 4 would
mostly measure the kernel's caches, filled by phase 2. Remount time is not counted. The BFT paper ran the
phases back to back over NFS with attribute and write-back caching: BENCH_REMOUNT=0 does that.

Durability is recorded in meta: PBFT replicas fdatasync their logs; the NO-REP server runs the same file
service on the same disk store and, started with `--norep-durable`, fdatasyncs its log before each reply (the
promise of a PBFT reply); native is the page cache (only the write benchmark fsyncs).

Checks (a benchmark that measures a broken file system is worthless): the grep total must equal grep's on the
original headers; the 3.9 MB file and every Andrew file are read back after a remount and compared; the
compiled `lua` must run a one-line script.

Fault mode (`--faults`, pbft only; bench-results/fs-faults.json): Andrew once fault-free and once with a backup
killed (SIGKILL) in the middle of phase 2, restarted at the start of phase 4, and the primary killed during
phase 5 (once the restarted backup has caught up, since f = 1 tolerates one fault at a time); the run must
complete and the two resulting trees (every file hashed, read back after a remount) must be byte-identical.

Demo mode (`--demo`, used by `make demo`): Andrew at a small scale on pbft and norep, phase times side by side
on stdout; no result file.

Environment: BUILD/BFTFS_BUILD, QUICK=1 (one repeat at n = 1), BENCH_SYSTEMS=native,local,norep,pbft,
ANDREW_N (copies; default 1 quick, 5 full), BENCH_REPEATS (default 1 quick, 3 full: medians reported),
BENCH_REMOUNT=0, BENCH_KEEP=1 (keep the scratch directory), BENCH_MOUNT_ARGS (extra `bftfs mount` arguments,
recorded in meta), BENCH_CLUSTER_ARGS (extra `cluster start`
arguments), BFTFS_SRC_CACHE (default /opt/bftfs/src). Progress on stderr. Every process started and every
mount made is stopped on exit, also on SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from common import progress  # noqa: E402

ALL_SYSTEMS = ("native", "local", "norep", "pbft")
SYSTEM_LABELS = {"native": "native", "local": "FUSE local", "norep": "NO-REP", "pbft": "PBFT (f=1)"}
PHASES = ("mkdir", "copy", "stat", "read", "compile")
PHASE_TITLES = {"mkdir": "1 create directories", "copy": "2 copy the tree", "stat": "3 stat every file",
                "read": "4 read every byte", "compile": "5 compile"}

GREP_TARGET_BYTES = 9_100_000  # "about 9.1 MB" of headers (PBFT-CS section 6.2)
GREP_PATTERN = "struct"
GREP_ROOTS = ("linux", "asm-generic", "x86_64-linux-gnu/asm", ".")  # under /usr/include, in this order
WRITE_BYTES = 3_900_000
WRITE_CHUNK = 8192
CREATE_FILES = 100
CREATE_BYTES = 4096
COMPILE_JOBS = 2
COMPILE_TARGET = "linux"
READ_CHUNK = 65536

DURABILITY = {"native": "page cache; only the write benchmark fsyncs",
              "local": "the service's state is saved to its directory at unmount",
              "norep": "`cluster start --norep --norep-durable`: the file service on the replicas' disk store "
                       "(checkpoint every 128 requests) and every request in an fdatasync'ed write-ahead log "
                       "(group commit) before its reply: what a PBFT reply promises",
              "pbft": "replicas fdatasync their write-ahead logs (group commit) before they vote; the file "
                      "service on the disk store (checkpoint every 128 batches)"}
MOUNT_TIMEOUT_S = 30.0
CLUSTER_TIMEOUT_S = 60.0
STEP_TIMEOUT_S = 1800.0  # one command (grep, one copy's make) that runs longer than this has hung


def run_deadline_s(andrew_n: int) -> float:
    """How long one system's whole run may take before the watchdog declares the file system hung: generous
    (a compile of one copy takes about 20 s on this 2-core machine when it is busy)."""
    return 600.0 + 300.0 * andrew_n
CATCH_UP_TIMEOUT_S = 120.0


class BenchError(RuntimeError):
    """A benchmark step failed (wrong result, a command failed, a hang): the run stops with this message."""


# ---------------------------------------------------------------------------------------------------------
# Inputs: the grep corpus and the Andrew source tree


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
            raise BenchError(f"{path}: not a regular file")
        tree.files.append((str(rel), st.st_mode & 0o777, path.read_bytes()))
    return tree


def grep_corpus() -> SourceTree:
    """~9.1 MB of C headers from /usr/include: the Linux UAPI headers first (the paper grepped the Linux
    headers), then other headers in sorted order, until the target size is reached."""
    base = Path("/usr/include")
    chosen: list[Path] = []
    seen: set[Path] = set()
    total = 0
    for top in GREP_ROOTS:
        start = (base / top).resolve()
        if not start.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames.sort()
            for name in sorted(filenames):
                path = Path(dirpath) / name
                if not name.endswith(".h") or path.is_symlink() or not path.is_file():
                    continue
                rel = path.relative_to(base)
                size = path.stat().st_size
                if rel in seen or total + size > GREP_TARGET_BYTES:  # a big header may not overshoot the target
                    continue
                seen.add(rel)
                chosen.append(rel)
                total += size
                if total >= GREP_TARGET_BYTES * 0.995:
                    return load_tree(base, chosen)
    raise BenchError(f"/usr/include has only {total} bytes of headers; {GREP_TARGET_BYTES} wanted "
                     "(install linux-libc-dev and libc6-dev)")


def grep_count(root: Path) -> int:
    """Runs the benchmark's grep over `root`; returns the total number of matching lines."""
    done = subprocess.run(["grep", "-r", "-c", "-F", "--", GREP_PATTERN, str(root)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"},
                          timeout=STEP_TIMEOUT_S)
    if done.returncode not in (0, 1):
        raise BenchError(f"grep over {root} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return sum(int(line.rsplit(":", 1)[1]) for line in done.stdout.splitlines() if line)


def lua_source() -> tuple[SourceTree, dict]:
    """The Lua tree cached by `make deps` (scripts/fetch-lua-source.sh) and its SOURCE record."""
    cache = Path(os.environ.get("BFTFS_SRC_CACHE", "/opt/bftfs/src")) / "lua5.4"
    record = cache / "SOURCE"
    if not record.is_file() or not (cache / "lua" / "Makefile").is_file():
        raise SystemExit(f"{cache}/lua is missing: run `make deps` (or bash scripts/fetch-lua-source.sh)")
    info = dict(line.split(" ", 1) for line in record.read_text().splitlines() if " " in line)
    return load_tree(cache / "lua"), info


def build_env() -> dict:
    """The environment for the compile phase: no make jobserver or flags inherited from `make bench-fs`, the C
    locale, and no ccache (the compile must do its work every time)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "GNUMAKEFLAGS", "CCACHE_DIR")}
    env["LC_ALL"] = "C"
    env["CCACHE_DISABLE"] = "1"
    return env


# ---------------------------------------------------------------------------------------------------------
# Systems


def run_cmd(argv: Sequence[object], timeout_s: float, what: str) -> str:
    """Runs a short command to completion in its own process group (killed on timeout or interrupt); returns
    stdout; BenchError with the tail of its output if it fails."""
    argv = [str(a) for a in argv]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException as exc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise BenchError(f"{what}: `{shlex.join(argv)}` did not finish within {timeout_s:.0f} s") from None
        raise
    if proc.returncode != 0:
        raise BenchError(f"{what}: `{shlex.join(argv)}` exited {proc.returncode}:\n"
                         f"{(out + err).strip()[-2000:]}")
    return out


class System:
    """One file system under test. `start()` returns the directory the workloads run in; `cold()` empties the
    client-side caches (see the module docstring); `stop()` undoes everything start did, also after a partial
    start, and may be called more than once."""

    name = "?"

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch

    def start(self) -> Path:
        raise NotImplementedError

    def cold(self, tree: Path | None) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        """Called from the watchdog thread when a step hangs: make blocked file operations fail."""

    def service_cpu_s(self) -> float:
        """CPU seconds (user + system) used so far by the processes that implement the file system (replicas,
        NO-REP server, relay, FUSE daemon; none for native, where the kernel does the work). On this 2-core
        machine they compete with the benchmark's own processes (gcc) for the same cores."""
        return 0.0

    def requests(self) -> dict[str, int]:
        """The relay's request counters so far (docs/RELAY.md STATUS keys: sent_read_only, sent_ordered,
        sent_compound, lookups_enoent, ops_<op>); empty for systems without a relay."""
        return {}

    def describe(self) -> dict:
        return {}


def relay_status(sock: Path, timeout_s: float = 10.0) -> dict[str, int]:
    """Asks the relay on `sock` for its STATUS (docs/RELAY.md: HELLO, then STATUS; STATUS_REPLY is one
    `key value` per line) and returns the numeric facts. Exact at the moment of asking, unlike the status file
    the relay rewrites twice a second."""
    import socket
    import struct

    def frame(body: bytes) -> bytes:
        return struct.pack("<I", len(body)) + body

    def read_frame(conn) -> bytes:
        head = b""
        while len(head) < 4:
            chunk = conn.recv(4 - len(head))
            if not chunk:
                raise BenchError(f"the relay on {sock} closed the status connection")
            head += chunk
        (n,) = struct.unpack("<I", head)
        body = b""
        while len(body) < n:
            chunk = conn.recv(n - len(body))
            if not chunk:
                raise BenchError(f"the relay on {sock} closed the status connection")
            body += chunk
        return body

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout_s)
        conn.connect(str(sock))
        conn.sendall(frame(b"\x01" + struct.pack("<H", 1)) + frame(b"\x04"))
        while True:
            body = read_frame(conn)
            if body[:1] == b"\x84":  # STATUS_REPLY: u32 len || text
                (n,) = struct.unpack("<I", body[1:5])
                text = body[5:5 + n].decode()
                break
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.isdigit():
            out[key] = int(value)
    return out


REQUEST_KEYS = ("sent_read_only", "sent_ordered", "sent_compound", "lookups_enoent")


class NativeSystem(System):
    name = "native"

    def start(self) -> Path:
        self.dir = self.scratch / "native"
        self.dir.mkdir(parents=True)
        return self.dir

    def cold(self, tree: Path | None) -> None:
        """sync, then drop the pages of every file under `tree` (whole directory when None)."""
        os.sync()
        for dirpath, _dirnames, filenames in os.walk(tree or self.dir):
            for name in filenames:
                with contextlib.suppress(OSError):
                    fd = os.open(os.path.join(dirpath, name), os.O_RDONLY | os.O_NOFOLLOW)
                    try:
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    finally:
                        os.close(fd)

    def stop(self) -> None:
        pass

    def describe(self) -> dict:
        out = subprocess.run(["df", "--output=fstype", str(self.scratch)], capture_output=True, text=True)
        return {"fstype": out.stdout.split()[-1] if out.returncode == 0 and out.stdout.split() else "unknown"}


class MountedSystem(System):
    """local, norep or pbft: a FUSE mount of our client, with (norep, pbft) a cluster and its relay started by
    `bftfs cluster start` in a directory of its own."""

    def __init__(self, scratch: Path, kind: str, bftfs: Path, mountpoint: Path, cluster_args: Sequence[str] = ()):
        super().__init__(scratch)
        assert kind in ("local", "norep", "pbft")
        self.name = kind
        self.bftfs = bftfs
        self.mnt = mountpoint
        self.cluster_args = list(cluster_args)
        self.cluster_dir: Path | None = None
        self.local_dir: Path | None = None
        self.fuse_conn: str | None = None
        self.daemon_pids: list[int] = []
        self.mounted = False
        self.client_counters: list[dict] = []  # per mount session, from `bftfs mount --status` at exit

    # ---- cluster ----
    def start_cluster(self) -> None:
        self.cluster_dir = self.scratch / f"cluster-{self.name}"
        self.cluster_dir.mkdir(parents=True)
        base = common.free_port_range(8)
        argv = [self.bftfs, "cluster", "start", "--dir", self.cluster_dir, "--base-port", base, "--service", "fs",
                "--log-level", "warn"]
        # NO-REP durable: the same promise as a PBFT reply (the request is in an fdatasync'ed log before the reply;
        # the file service on the same disk store, norep/norep_server.h).
        argv += ["--norep", "--norep-durable"] if self.name == "norep" else ["--f", "1"]
        progress(f"{self.name}: bftfs cluster start: keys for a new cluster, "
                 f"{'one NO-REP server' if self.name == 'norep' else '4 replicas (f=1)'} and the relay, ports {base}..")
        run_cmd(argv + self.cluster_args, CLUSTER_TIMEOUT_S, f"{self.name}: cluster start")
        sock = self.cluster_dir / "relay.sock"
        common.wait_until(sock.exists, MOUNT_TIMEOUT_S, f"the relay socket {sock}")

    def stop_cluster(self) -> None:
        if self.cluster_dir is not None and (self.cluster_dir / "cluster.conf").exists():
            try:
                run_cmd([self.bftfs, "cluster", "stop", "--dir", self.cluster_dir], 60, f"{self.name}: cluster stop")
            except BenchError as exc:
                progress(f"WARNING: {exc}")

    # ---- mount ----
    def mount(self) -> None:
        assert not self.mounted
        self.mnt.mkdir(parents=True, exist_ok=True)
        if self.name == "local":
            if self.local_dir is None:
                self.local_dir = self.scratch / "local-service"
                self.local_dir.mkdir(parents=True)
            argv = [self.bftfs, "mount", "--local", self.local_dir, self.mnt]
        else:
            assert self.cluster_dir is not None
            argv = [self.bftfs, "mount", "--relay", self.cluster_dir / "relay.sock", self.mnt]
        self.mount_count = getattr(self, "mount_count", 0) + 1
        self.status_file = self.scratch / f"mount-{self.name}-{self.mount_count}.status.json"
        argv += ["--log", self.scratch / f"mount-{self.name}.log", "--status", self.status_file]
        argv += shlex.split(os.environ.get("BENCH_MOUNT_ARGS", ""))  # e.g. "--entry-timeout 3" (experiments)
        self.mounted = True  # from here on stop() tries to unmount, even if the command below fails half-way
        run_cmd(argv, MOUNT_TIMEOUT_S, f"{self.name}: mount")
        common.wait_until(lambda: os.path.ismount(self.mnt), MOUNT_TIMEOUT_S, f"{self.mnt} to be mounted")
        # The FUSE connection's control directory is named after the mount's device minor number.
        self.fuse_conn = str(os.minor(os.stat(self.mnt).st_dev))
        self.daemon_pids = mount_daemon_pids(self.mnt)

    def umount(self) -> None:
        if not self.mounted:
            return
        try:
            run_cmd([self.bftfs, "umount", self.mnt], MOUNT_TIMEOUT_S, f"{self.name}: umount")
            common.wait_until(lambda: not os.path.ismount(self.mnt), MOUNT_TIMEOUT_S, f"{self.mnt} to be unmounted")
            # `bftfs umount` returns once the kernel let go; the daemon then finishes (pending writes, the local
            # backend's state file). The next mount must not start before that.
            common.wait_until(lambda: not any(pid_alive(p) for p in self.daemon_pids), MOUNT_TIMEOUT_S,
                              f"the mount daemon of {self.mnt} (pids {self.daemon_pids}) to exit")
        except (BenchError, TimeoutError) as exc:
            progress(f"WARNING: {exc}; detaching {self.mnt} with fusermount3 -u -z")
            self.abort()
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], capture_output=True, timeout=30)
        self.mounted = False
        self.fuse_conn = None
        # The daemon wrote its final counters at exit (bftfs mount --status): one entry per mount session.
        with contextlib.suppress(OSError, ValueError):
            counters = json.loads(self.status_file.read_text())
            counters.pop("pid", None)
            self.client_counters.append(counters)
            progress(f"{self.name}: mount session {len(self.client_counters)}: "
                     + ", ".join(f"{k} {v}" for k, v in counters.items() if v))

    def requests(self) -> dict[str, int]:
        if self.cluster_dir is None:
            return {}
        return relay_status(self.cluster_dir / "relay.sock")

    def service_cpu_s(self) -> float:
        marks = [str(self.mnt)] + ([str(self.cluster_dir)] if self.cluster_dir is not None else [])
        return sum(process_cpu_s(pid) for pid in bftfs_pids(marks))

    def abort(self) -> None:
        if self.fuse_conn is not None:
            with contextlib.suppress(OSError):
                Path(f"/sys/fs/fuse/connections/{self.fuse_conn}/abort").write_text("1")

    # ---- System ----
    def start(self) -> Path:
        if self.name != "local":
            self.start_cluster()
        self.mount()
        return self.mnt

    def cold(self, tree: Path | None) -> None:
        self.umount()
        self.mount()

    def stop(self) -> None:
        try:
            self.umount()
        finally:
            self.stop_cluster()

    def describe(self) -> dict:
        """What the servers report at the end of the run (status.json): requests executed, and for PBFT
        batches, read-only requests and view changes, so CPU per request can be worked out."""
        out: dict = {"cluster_args": self.cluster_args} if self.cluster_args else {}
        if self.client_counters:
            out["client_counters_per_mount"] = list(self.client_counters)
        if self.cluster_dir is None:
            return out
        dirs = [self.cluster_dir / "norep"] if self.name == "norep" else sorted(self.cluster_dir.glob("r[0-9]*/"))
        keys = ("requests_executed", "read_only_executed", "batches_committed", "view_changes_started",
                "state_transfers")
        for d in dirs:
            with contextlib.suppress(OSError, ValueError):
                st = json.loads((d / "status.json").read_text())
                stats = st.get("stats", st) if isinstance(st.get("stats"), dict) else st
                out[f"{d.name}_status"] = {k: stats[k] for k in keys if k in stats}
                for k in ("requests_executed", "last_executed"):
                    if k in st and k not in out[f"{d.name}_status"]:
                        out[f"{d.name}_status"][k] = st[k]
        return out


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to `proc`'s process group (it was started with start_new_session), reap it, and wait until the
    rest of the group (gcc under make) is gone too: until then they may hold files on the mount open."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _bftfs_processes():
    """(pid, argv) of every running bftfs process."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == "bftfs":
            yield int(entry.name), argv


def mount_daemon_pids(mnt: Path) -> list[int]:
    """The `bftfs mount ... MNT` processes serving `mnt` (the daemon detaches, so its pid is found by its
    command line: a bftfs executable, the word mount, and exactly this mount point among its arguments)."""
    return [pid for pid, argv in _bftfs_processes() if "mount" in argv[1:2] and str(mnt) in argv]


def bftfs_pids(marks: Sequence[str]) -> list[int]:
    """bftfs processes with one of `marks` (a cluster directory, a mount point) in an argument."""
    return [pid for pid, argv in _bftfs_processes() if any(m in a for a in argv[1:] for m in marks)]


def process_cpu_s(pid: int) -> float:
    """utime + stime of `pid` (all its threads) in seconds; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def check_binary_supports(bftfs: Path, systems: Sequence[str]) -> None:
    """Fails early, before anything is measured, if this build has no `mount` (or `cluster start --norep`)."""
    needs = []
    if any(s != "native" for s in systems):
        needs.append(["mount", "--help"])
        needs.append(["umount", "--help"])
    for args in needs:
        done = subprocess.run([str(bftfs), *args], capture_output=True, text=True, timeout=10)
        if done.returncode != 0:
            raise SystemExit(f"{bftfs} {' '.join(args)} failed ({done.returncode}): this build has no "
                             f"`bftfs {args[0]}` yet; run with BENCH_SYSTEMS=native")
    if "norep" in systems:
        done = subprocess.run([str(bftfs), "cluster", "start", "--help"], capture_output=True, text=True, timeout=10)
        if "--norep" not in done.stdout + done.stderr:
            raise SystemExit(f"{bftfs} cluster start has no --norep yet; leave norep out of BENCH_SYSTEMS")


def make_system(kind: str, scratch: Path, bftfs: Path | None, cluster_args: Sequence[str]) -> System:
    if kind == "native":
        return NativeSystem(scratch)
    assert bftfs is not None
    return MountedSystem(scratch, kind, bftfs, scratch / "mnt", cluster_args)


class Watchdog:
    """Aborts the system (FUSE connection) when one step runs longer than `timeout_s`, so that a hung file
    system turns into failed operations and a clean exit rather than a benchmark that never ends."""

    def __init__(self, system: System, timeout_s: float) -> None:
        self.system = system
        self.timeout_s = timeout_s
        self.fired = False
        self._timer: threading.Timer | None = None

    def __enter__(self) -> "Watchdog":
        self._timer = threading.Timer(self.timeout_s, self._fire)
        self._timer.daemon = True
        self._timer.start()
        return self

    def _fire(self) -> None:
        self.fired = True
        progress(f"WATCHDOG: the run on {self.system.name} took longer than {self.timeout_s:.0f} s; aborting its "
                 "file system so that blocked operations fail")
        self.system.abort()

    def __exit__(self, *exc) -> None:
        assert self._timer is not None
        self._timer.cancel()


# ---------------------------------------------------------------------------------------------------------
# Workloads


def write_tree(tree: SourceTree, dest: Path) -> None:
    """Creates `tree` under `dest` (which exists): directories, then files created with their mode."""
    for d in tree.dirs:
        os.mkdir(dest / d)
    for rel, mode, data in tree.files:
        write_file(dest / rel, data, mode)


def write_file(path: Path, data: bytes, mode: int = 0o644, chunk: int = 1 << 20, fsync: bool = False) -> None:
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


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def micro_grep(system: System, root: Path, corpus: SourceTree, expected: int) -> float:
    dest = root / "grep"
    os.mkdir(dest)
    progress(f"{system.name}: grep setup: copying {len(corpus.files)} headers ({corpus.bytes / 1e6:.1f} MB), untimed")
    write_tree(corpus, dest)
    system.cold(dest)
    seconds, count = timed(lambda: grep_count(dest))
    if count != expected:
        raise BenchError(f"{system.name}: grep counted {count} lines with {GREP_PATTERN!r}, the original headers "
                         f"have {expected}")
    progress(f"{system.name}: grep {seconds:.3f} s ({count} matching lines, as in the originals)")
    return seconds


def micro_write(system: System, root: Path) -> float:
    data = random.Random(3900).randbytes(WRITE_BYTES)
    dest = root / "write"
    os.mkdir(dest)
    path = dest / "big"
    seconds, _ = timed(lambda: write_file(path, data, chunk=WRITE_CHUNK, fsync=True))
    system.cold(dest)
    if hashlib.sha256(path.read_bytes()).digest() != hashlib.sha256(data).digest():
        raise BenchError(f"{system.name}: the 3.9 MB file reads back different after a remount")
    progress(f"{system.name}: write 3.9 MB {seconds:.3f} s (read back identical)")
    return seconds


def micro_create(system: System, root: Path) -> float:
    data = random.Random(100).randbytes(CREATE_BYTES)
    dest = root / "create"
    os.mkdir(dest)

    def run() -> None:
        for i in range(CREATE_FILES):
            write_file(dest / f"f{i:03d}", data, chunk=CREATE_BYTES)

    seconds, _ = timed(run)
    names = sorted(os.listdir(dest))
    if names != [f"f{i:03d}" for i in range(CREATE_FILES)] or any(
            (dest / n).stat().st_size != CREATE_BYTES for n in names):
        raise BenchError(f"{system.name}: create100 left {len(names)} entries or wrong sizes")
    progress(f"{system.name}: create 100 x 4 KB {seconds:.3f} s")
    return seconds


@dataclass
class AndrewResult:
    phases_s: dict
    tree: Path
    service_cpu_s: dict = field(default_factory=dict)  # CPU seconds of the file system's processes per phase
    requests: dict = field(default_factory=dict)  # per phase: the relay's request counters (REQUEST_KEYS, ops_*)


class Andrew:
    """The modified Andrew benchmark over `copies` copies of `tree` under `root`/andrew.

    `hook(phase, fraction)` is called at the start of every phase (fraction 0), after each file in phases 2-4
    and after each copy in phase 5, and at the end of every phase (fraction 1): the fault mode hangs its
    faults on it."""

    def __init__(self, system: System, root: Path, tree: SourceTree, copies: int, remount: bool, log_dir: Path,
                 hook: Callable[[str, float], None] | None = None) -> None:
        self.system = system
        self.base = root / "andrew"
        self.tree = tree
        self.copies = copies
        self.remount = remount
        self.log_dir = log_dir
        self.hook = hook or (lambda phase, fraction: None)
        self.copy_dirs = [self.base / f"c{k:03d}" for k in range(copies)]

    def run(self) -> AndrewResult:
        phases: dict[str, float] = {}
        service_cpu: dict[str, float] = {}
        requests: dict[str, dict] = {}
        for phase in PHASES:
            if self.remount and phase in ("stat", "read", "compile"):
                self.system.cold(self.base)
            self.hook(phase, 0.0)
            req0 = self.system.requests()
            cpu0 = self.system.service_cpu_s()
            seconds, _ = timed(getattr(self, f"phase_{phase}"))
            service_cpu[phase] = self.system.service_cpu_s() - cpu0
            req1 = self.system.requests()
            if req1:
                delta = {k: req1[k] - req0.get(k, 0) for k in req1
                         if (k in REQUEST_KEYS or k.startswith("ops_")) and req1[k] - req0.get(k, 0)}
                requests[phase] = delta
                progress(f"{self.system.name}: {phase}: {delta.get('sent_read_only', 0)} read-only + "
                         f"{delta.get('sent_ordered', 0)} ordered requests; ops "
                         + ", ".join(f"{k[4:]} {v}" for k, v in sorted(delta.items()) if k.startswith("ops_")))
            self.hook(phase, 1.0)
            phases[phase] = seconds
            progress(f"{self.system.name}: Andrew{self.copies} {PHASE_TITLES[phase]}: {seconds:.3f} s"
                     + (f" (file system processes used {service_cpu[phase]:.2f} CPU-s)" if service_cpu[phase] else ""))
        return AndrewResult(phases, self.base, service_cpu_s=service_cpu, requests=requests)

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
            raise BenchError(f"{self.system.name}: stat phase saw {n} entries, {expected} expected")

    def phase_read(self) -> None:
        total = len(self.copy_dirs) * len(self.tree.files)
        done = 0
        for copy in self.copy_dirs:
            for rel, _mode, data in self.tree.files:
                got = read_all(copy / rel)
                if got != len(data):
                    raise BenchError(f"{self.system.name}: {copy / rel} has {got} bytes, {len(data)} written")
                done += 1
                self.hook("read", done / total)

    def phase_compile(self) -> None:
        for k, copy in enumerate(self.copy_dirs):
            log = self.log_dir / f"{self.system.name}-compile-c{k:03d}.log"
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
                raise BenchError(f"{self.system.name}: `{shlex.join(argv)}` exited {rc}:\n{tail}")
            self.hook("compile", (k + 1) / len(self.copy_dirs))

    def check_build(self) -> None:
        """The first copy's freshly built interpreter runs a script (untimed; exec from the mount)."""
        lua = self.copy_dirs[0] / "src" / "lua"
        done = subprocess.run([str(lua), "-e", "print(6 * 7)"], capture_output=True, text=True, timeout=60)
        if done.returncode != 0 or done.stdout.strip() != "42":
            raise BenchError(f"{self.system.name}: the built {lua} does not run: rc {done.returncode} "
                             f"{done.stdout.strip()!r} {done.stderr.strip()[-300:]!r}")


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
    h = hashlib.sha256()
    for rel in sorted(hashes):
        h.update(f"{rel}\0{hashes[rel]}\n".encode())
    return h.hexdigest()


def check_andrew_tree(system: System, andrew: Andrew) -> None:
    """After a remount: every copied file reads back with the bytes written (untimed)."""
    system.cold(andrew.base)
    for copy in andrew.copy_dirs:
        for rel, _mode, data in andrew.tree.files:
            if (copy / rel).read_bytes() != data:
                raise BenchError(f"{system.name}: {copy / rel} reads back different from the source")
    andrew.check_build()


# ---------------------------------------------------------------------------------------------------------
# The measurement plan


def plan() -> dict:
    quick = common.quick_mode()
    systems = [s.strip() for s in os.environ.get("BENCH_SYSTEMS", ",".join(ALL_SYSTEMS)).split(",") if s.strip()]
    for s in systems:
        if s not in ALL_SYSTEMS:
            raise SystemExit(f"BENCH_SYSTEMS: unknown system {s!r} (known: {', '.join(ALL_SYSTEMS)})")
    return {
        "systems": systems,
        "andrew_n": int(os.environ.get("ANDREW_N", "1" if quick else "5")),  # Andrew100: ANDREW_N=100
        "repeats": int(os.environ.get("BENCH_REPEATS", "1" if quick else "3")),
        "remount": os.environ.get("BENCH_REMOUNT", "1") != "0",
        "cluster_args": shlex.split(os.environ.get("BENCH_CLUSTER_ARGS", "")),
    }


def one_run(kind: str, run_dir: Path, bftfs: Path | None, p: dict, corpus: SourceTree, grep_expected: int,
            lua: SourceTree) -> dict:
    """All workloads once on a fresh instance of system `kind`; returns the seconds of each."""
    run_dir.mkdir(parents=True)
    system = make_system(kind, run_dir, bftfs, p["cluster_args"])
    result: dict = {}
    try:
        with Watchdog(system, run_deadline_s(p["andrew_n"])) as dog:
            root = system.start()
            result["grep_s"] = micro_grep(system, root, corpus, grep_expected)
            result["write_s"] = micro_write(system, root)
            result["create100_s"] = micro_create(system, root)
            andrew = Andrew(system, root, lua, p["andrew_n"], p["remount"], run_dir)
            a = andrew.run()
            check_andrew_tree(system, andrew)
            progress(f"{kind}: Andrew{p['andrew_n']} tree reads back identical; the built lua runs")
            if dog.fired:
                raise BenchError(f"{kind}: the watchdog fired")
        for phase in PHASES:
            result[f"andrew_{phase}_s"] = a.phases_s[phase]
        result["andrew_total_s"] = sum(a.phases_s.values())
        result["andrew_service_cpu_s"] = {k: round(v, 3) for k, v in a.service_cpu_s.items()}
        if a.requests:
            result["andrew_requests"] = a.requests
        result["system"] = system.describe()
    finally:
        system.stop()
    return result


NUMERIC_KEYS = ("grep_s", "write_s", "create100_s", *(f"andrew_{p}_s" for p in PHASES), "andrew_total_s")


def summarize(runs: list[dict]) -> dict:
    out: dict = {k: round(statistics.median(r[k] for r in runs), 4) for k in NUMERIC_KEYS}
    if len(runs) > 1:
        out["spread"] = {k: [round(min(r[k] for r in runs), 4), round(max(r[k] for r in runs), 4)]
                         for k in NUMERIC_KEYS}
    out["andrew_service_cpu_s"] = {p: round(statistics.median(r["andrew_service_cpu_s"][p] for r in runs), 3)
                                   for p in PHASES}
    if all("andrew_requests" in r for r in runs):
        # Requests per phase (the relay's counters): median over repeats of each key.
        out["andrew_requests"] = {
            p: {k: int(statistics.median(r["andrew_requests"].get(p, {}).get(k, 0) for r in runs))
                for k in sorted({k for r in runs for k in r["andrew_requests"].get(p, {})})}
            for p in PHASES}
    out["runs"] = [{**{k: round(r[k], 4) for k in NUMERIC_KEYS}, "andrew_service_cpu_s": r["andrew_service_cpu_s"],
                    **({"andrew_requests": r["andrew_requests"]} if "andrew_requests" in r else {})}
                   for r in runs]
    if runs and runs[0].get("system"):
        out["system"] = runs[0]["system"]
    return out


def ratios(systems: dict) -> dict:
    out = {}
    for a, b in (("pbft", "norep"), ("norep", "local"), ("local", "native"), ("pbft", "native")):
        if a in systems and b in systems:
            out[f"{a}_over_{b}"] = {k: round(systems[a][k] / systems[b][k], 3) if systems[b][k] else None
                                    for k in NUMERIC_KEYS}
    return out


def plot(path: Path, systems: dict, title: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        progress("matplotlib missing: no plot (make deps installs it)")
        return
    names = list(systems)
    labels = [SYSTEM_LABELS[n] for n in names]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    micro = ("grep_s", "write_s", "create100_s")
    width = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        xs = [j + i * width for j in range(len(micro))]
        ax1.bar(xs, [systems[n][k] for k in micro], width, label=labels[i])
    ax1.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(micro))])
    ax1.set_xticklabels(["grep 9.1 MB", "write 3.9 MB", "create 100 x 4 KB"])
    ax1.set_yscale("log")  # native and PBFT differ by orders of magnitude here
    ax1.set_ylabel("seconds (median, log scale)")
    ax1.set_title("PBFT-CS section 6.2 micro-benchmarks")
    ax1.legend(fontsize=8)
    bottoms = [0.0] * len(names)
    for phase in PHASES:
        vals = [systems[n][f"andrew_{phase}_s"] for n in names]
        ax2.bar(labels, vals, 0.6, bottom=bottoms, label=PHASE_TITLES[phase])
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    for x, total in enumerate(bottoms):
        ax2.text(x, total, f"{total:.1f} s", ha="center", va="bottom", fontsize=8)
    ax2.set_ylabel("seconds (median)")
    ax2.set_title(title)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bench(args) -> None:
    p = plan()
    if args.andrew_n:
        p["andrew_n"] = args.andrew_n
    bftfs = common.bftfs_binary() if any(s != "native" for s in p["systems"]) else None
    if bftfs is not None:
        check_binary_supports(bftfs, p["systems"])
    lua, lua_info = lua_source()
    corpus = grep_corpus()
    grep_expected = expected_grep(corpus)
    busy = common.machine_busy_before()
    progress(f"systems {', '.join(p['systems'])}; Andrew{p['andrew_n']} on Lua {lua_info.get('version')} "
             f"({len(lua.files)} files, {lua.bytes / 1e6:.2f} MB per copy); {p['repeats']} repeat(s); "
             f"grep corpus {len(corpus.files)} files {corpus.bytes / 1e6:.2f} MB")
    scratch = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix="bftfs-fs-bench-"))
    ok = False
    try:
        runs: dict[str, list[dict]] = {s: [] for s in p["systems"]}
        # Repeats interleave the systems, so a slow minute on the shared machine hits all of them alike.
        for rep in range(p["repeats"]):
            for kind in p["systems"]:
                progress(f"== {kind}, repeat {rep + 1}/{p['repeats']}")
                runs[kind].append(one_run(kind, scratch / f"{kind}-{rep}", bftfs, p, corpus, grep_expected, lua))
        systems = {k: summarize(v) for k, v in runs.items()}
        result = {
            "meta": common.run_metadata(
                benchmark="bench_fs", machine_before=busy, systems=p["systems"], andrew_n=p["andrew_n"],
                repeats=p["repeats"], statistic="median over repeats (runs lists each)",
                cache_policy=("remount (FUSE) / sync + fadvise DONTNEED (native) before grep and before "
                              "Andrew phases 3, 4, 5; not timed") if p["remount"] else "warm: phases back to back",
                grep={"pattern": GREP_PATTERN, "command": "grep -r -c -F", "files": len(corpus.files),
                      "bytes": corpus.bytes, "source": "/usr/include (" + ", ".join(GREP_ROOTS) + ")",
                      "matching_lines": grep_expected},
                write={"bytes": WRITE_BYTES, "write_call_bytes": WRITE_CHUNK, "timed": "open+write+fsync+close"},
                create100={"files": CREATE_FILES, "bytes_each": CREATE_BYTES, "timed": "open+write+close each"},
                andrew={"source": lua_info, "files_per_copy": len(lua.files), "dirs_per_copy": len(lua.dirs),
                        "bytes_per_copy": lua.bytes,
                        "compile": f"make -j{COMPILE_JOBS} {COMPILE_TARGET} per copy, one copy after another "
                                   "(Lua's own makefile: gcc -std=gnu99 -O2)"},
                durability=DURABILITY,
                requests=("andrew_requests per phase: the relay's STATUS counters before and after each phase "
                          "(docs/RELAY.md): sent_read_only, sent_ordered, sent_compound, lookups_enoent, ops_<op>; "
                          "system.client_counters_per_mount: `bftfs mount --status` at each unmount"),
                mount_args=shlex.split(os.environ.get("BENCH_MOUNT_ARGS", "")),
                cluster_args=p["cluster_args"]),
            "systems": systems,
            "ratios": ratios(systems),
        }
        if "pbft" in systems and "norep" in systems:
            r = systems["pbft"]["andrew_total_s"] / systems["norep"]["andrew_total_s"]
            result["andrew_pbft_over_norep"] = round(r, 3)
            result["andrew_pbft_within_1_3x_norep"] = r <= 1.3
        out = common.RESULTS_DIR / (args.output or "fs.json")
        common.write_json(out, result)
        plot(out.with_suffix(".png"), systems, f"Andrew{p['andrew_n']} (Lua 5.4) phases")
        progress(f"wrote {out} and {out.with_suffix('.png')}")
        print_table(systems, f"Andrew{p['andrew_n']}")
        ok = True
    finally:
        if ok and not common.keep_scratch() and not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            progress(f"kept {scratch} (logs and data)")


def expected_grep(corpus: SourceTree) -> int:
    """Matching lines in the original headers (the files grep reads on the system under test are copies)."""
    pattern = GREP_PATTERN.encode()
    return sum(1 for _, _, data in corpus.files for line in data.split(b"\n") if pattern in line)


def print_table(systems: dict, andrew_name: str) -> None:
    names = list(systems)
    rows = [("grep 9.1 MB", "grep_s"), ("write 3.9 MB", "write_s"), ("create 100 x 4 KB", "create100_s")]
    rows += [(f"{andrew_name} {PHASE_TITLES[p]}", f"andrew_{p}_s") for p in PHASES]
    rows += [(f"{andrew_name} total", "andrew_total_s")]
    head = ["seconds"] + [SYSTEM_LABELS[n] for n in names]
    body = [[label] + [f"{systems[n][k]:.3f}" for n in names] for label, k in rows]
    widths = [max(len(r[c]) for r in body + [head]) for c in range(len(head))]
    print()
    print("  ".join(h.ljust(widths[0]) if c == 0 else h.rjust(widths[c]) for c, h in enumerate(head)))
    print("  ".join("-" * w for w in widths))
    for r in body:
        print("  ".join(v.ljust(widths[0]) if c == 0 else v.rjust(widths[c]) for c, v in enumerate(r)))


# ---------------------------------------------------------------------------------------------------------
# Fault mode: a backup killed, later the primary, in the middle of Andrew on PBFT


class ClusterReplicas:
    """Kills and restarts single replicas of a `bftfs cluster start` directory (layout: r<i>.pid, r<i>/ with
    status.json, r<i>.log). A replica is restarted with exactly the argv it ran with (read from /proc before the
    kill), and its new pid goes into r<i>.pid so that `bftfs cluster stop` stops it like the others."""

    def __init__(self, cluster_dir: Path, n: int = 4) -> None:
        self.dir = cluster_dir
        self.n = n
        self.restarted: dict[int, subprocess.Popen] = {}

    def pid(self, i: int) -> int:
        text = (self.dir / f"r{i}.pid").read_text().strip()
        return int(text)

    def status(self, i: int) -> dict | None:
        try:
            value = json.loads((self.dir / f"r{i}" / "status.json").read_text())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def alive(self, i: int) -> bool:
        try:
            return pid_alive(self.pid(i))
        except (OSError, ValueError):
            return False

    def agreed_view(self) -> int | None:
        """The view that a quorum (2f+1) of live replicas report while not in a view change (status.json,
        refreshed about every 500 ms), or None. Not the highest view any replica reports: a replica that was
        just restarted may sit alone in a higher view whose new-view never comes."""
        f = (self.n - 1) // 3
        views = collections.Counter(
            int(st["view"]) for i in range(self.n)
            if self.alive(i) and (st := self.status(i)) and "view" in st and not st.get("in_view_change"))
        if not views:
            return None
        view, count = views.most_common(1)[0]
        return view if count >= 2 * f + 1 else None

    def view(self) -> int:
        view = self.agreed_view()
        if view is None:
            raise BenchError("no quorum of live replicas agrees on a view")
        return view

    def primary(self, timeout_s: float = 60.0) -> int:
        """The primary of the view a quorum agrees on, waiting up to `timeout_s` for one (after a view change
        the status files catch up within a second)."""
        view = common.wait_until(lambda: (v := self.agreed_view()) is not None and (v,), timeout_s,
                                 "a quorum of replicas to agree on a view")[0]
        return view % self.n

    def transfer_stats(self, i: int) -> dict:
        st = self.status(i) or {}
        stats = st.get("stats", {}) if isinstance(st.get("stats"), dict) else {}
        return {k: stats.get(k) for k in ("state_transfers", "state_transfer_bytes")}

    def last_executed(self, i: int) -> int:
        st = self.status(i)
        return int(st.get("last_executed", -1)) if st else -1

    def kill(self, i: int) -> list[str]:
        """SIGKILL replica i (a crash); returns the argv it ran with."""
        pid = self.pid(i)
        argv = [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0") if a]
        if "replica" not in argv:
            raise BenchError(f"pid {pid} in {self.dir}/r{i}.pid is not a replica: {argv}")
        os.kill(pid, signal.SIGKILL)
        if i in self.restarted:
            self.restarted.pop(i).wait()
        common.wait_until(lambda: not self.alive(i), 10, f"replica {i} (pid {pid}) to die")
        return argv

    def restart(self, i: int, argv: Sequence[str]) -> int:
        """Starts replica i again with `argv` in the background (its own session, output appended to its log);
        returns its pid. Readiness is polled by the caller (wait_ready)."""
        with contextlib.suppress(FileNotFoundError):
            (self.dir / f"r{i}" / "status.json").unlink()  # readiness must come from the new incarnation
        with open(self.dir / f"r{i}.log", "ab") as log:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.restarted[i] = proc
        (self.dir / f"r{i}.pid").write_text(f"{proc.pid}\n")
        return proc.pid

    def wait_ready(self, i: int, timeout_s: float) -> None:
        pid = self.pid(i)

        def ready() -> bool:
            if not self.alive(i):
                raise BenchError(f"restarted replica {i} exited; see {self.dir}/r{i}.log")
            st = self.status(i)
            return bool(st and st.get("pid") == pid and st.get("running") is True)

        common.wait_until(ready, timeout_s, f"restarted replica {i} to be ready")

    def close(self) -> None:
        """Kills what this object started and `cluster stop` did not (called after cluster stop)."""
        for proc in self.restarted.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


FAULT_PLAN = ("a backup (the replica before the primary, so not the next primary) gets SIGKILL when half of "
              "phase 2's files are copied; it is restarted with the same argv and data directory at the start of "
              "phase 4; during phase 5, once it has executed everything the others had when phase 5 began "
              "(f = 1 tolerates one fault at a time), the primary gets SIGKILL, 30% of the reference run's "
              "compile time after phase 5 began, and stays down")


class FaultPlan:
    """The Andrew hook of the fault run. In the workload's thread: at half of phase 2 (copy) a backup is killed;
    at the start of phase 4 it is restarted. A helper thread started at the start of phase 5 (compile) waits
    until the restarted backup has executed everything the others had executed then (f = 1: only one replica
    may be down at a time), and `primary_delay_s` after the start of phase 5 kills the primary. Every event is
    recorded with its time since the start of Andrew and the phase it hit."""

    def __init__(self, replicas: ClusterReplicas, primary_delay_s: float) -> None:
        self.replicas = replicas
        self.primary_delay_s = primary_delay_s
        self.events: list[dict] = []
        self.t0 = time.monotonic()
        self.phase = "mkdir"
        self.backup: int | None = None
        self.backup_argv: list[str] | None = None
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def record(self, event: str, **detail) -> None:
        if "view" not in detail:
            with contextlib.suppress(BenchError):
                detail["view"] = self.replicas.view()
        with self.lock:
            entry = {"t_s": round(time.monotonic() - self.t0, 3), "phase": self.phase, "event": event, **detail}
            self.events.append(entry)
        progress(f"FAULT {event} {detail} at {entry['t_s']:.2f} s of Andrew (phase {self.phase})")

    def __call__(self, phase: str, fraction: float) -> None:
        if self.error is not None:
            raise BenchError(f"fault injection failed: {self.error}")
        if phase == "mkdir" and fraction == 0.0:
            self.t0 = time.monotonic()
        self.phase = phase
        if phase == "copy" and fraction >= 0.5 and self.backup is None:
            primary = self.replicas.primary()
            view = self.replicas.view()
            self.backup = (primary + self.replicas.n - 1) % self.replicas.n  # a backup, not the next primary
            self.backup_argv = self.replicas.kill(self.backup)
            self.record("backup_killed", replica=self.backup, primary=primary, view=view)
        elif phase == "read" and fraction == 0.0 and self.backup_argv is not None:
            assert self.backup is not None
            pid = self.replicas.restart(self.backup, self.backup_argv)
            self.backup_argv = None
            self.record("backup_restarted", replica=self.backup, pid=pid)
        elif phase == "compile" and fraction == 0.0 and self.thread is None:
            self.thread = threading.Thread(target=self._primary_killer, name="fault-primary", daemon=True)
            self.thread.start()

    def _primary_killer(self) -> None:
        try:
            start = time.monotonic()
            assert self.backup is not None
            self.replicas.wait_ready(self.backup, CATCH_UP_TIMEOUT_S)
            others = [i for i in range(self.replicas.n) if i != self.backup]
            target = max(self.replicas.last_executed(i) for i in others)
            deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
            while self.replicas.last_executed(self.backup) < target and time.monotonic() < deadline:
                time.sleep(0.05)
            caught_up = self.replicas.last_executed(self.backup) >= target
            self.record("backup_caught_up" if caught_up else "backup_not_caught_up", replica=self.backup,
                        last_executed=self.replicas.last_executed(self.backup), target=target,
                        **self.replicas.transfer_stats(self.backup))
            wait = self.primary_delay_s - (time.monotonic() - start)
            if wait > 0:
                time.sleep(wait)
            if self.phase != "compile":
                self.record("primary_kill_missed", reason="phase 5 ended before the backup caught up")
                return
            primary = self.replicas.primary()
            view = self.replicas.view()
            self.replicas.kill(primary)
            self.record("primary_killed", replica=primary, view=view)
        except BaseException as exc:  # reported by the workload thread at its next hook call
            self.error = exc
            progress(f"FAULT thread failed: {exc}")

    def finish(self) -> None:
        if self.thread is not None:
            self.thread.join(timeout=CATCH_UP_TIMEOUT_S * 2 + 60)
        if self.error is not None:
            raise BenchError(f"fault injection failed: {self.error}")


def andrew_on_pbft(scratch: Path, tag: str, bftfs: Path, p: dict, lua: SourceTree, mnt: Path,
                   faults: Callable[[ClusterReplicas], FaultPlan] | None) -> dict:
    """Andrew once on a fresh 4-replica cluster mounted at `mnt`; with `faults`, under that fault plan.
    Returns the phase times, the fault events and the tree's hashes (read back after a remount)."""
    run_dir = scratch / tag
    run_dir.mkdir(parents=True)
    system = MountedSystem(run_dir, "pbft", bftfs, mnt, p["cluster_args"])
    replicas: ClusterReplicas | None = None
    try:
        with Watchdog(system, run_deadline_s(p["andrew_n"])) as dog:
            root = system.start()
            assert system.cluster_dir is not None
            replicas = ClusterReplicas(system.cluster_dir)
            plan_ = faults(replicas) if faults else None
            andrew = Andrew(system, root, lua, p["andrew_n"], p["remount"], run_dir, hook=plan_)
            result = andrew.run()
            if plan_ is not None:
                plan_.finish()
            check_andrew_tree(system, andrew)
            hashes = hash_tree(andrew.base)
            if dog.fired:
                raise BenchError("the watchdog fired")
    finally:
        system.stop()
        if replicas is not None:
            replicas.close()
    return {"phases_s": {k: round(v, 4) for k, v in result.phases_s.items()},
            "andrew_total_s": round(sum(result.phases_s.values()), 4),
            "events": plan_.events if plan_ is not None else [],
            "hashes": hashes, "tree_digest": tree_digest(hashes), "entries": len(hashes)}


def bench_faults(args) -> None:
    p = plan()
    if args.andrew_n:
        p["andrew_n"] = args.andrew_n
    bftfs = common.bftfs_binary()
    check_binary_supports(bftfs, ["pbft"])
    lua, lua_info = lua_source()
    busy = common.machine_busy_before()
    scratch = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix="bftfs-fs-faults-"))
    mnt = scratch / "mnt"  # both runs at the same path: the build output must not differ by its location
    ok = False
    try:
        progress(f"== fault-free reference: Andrew{p['andrew_n']} on PBFT")
        ref = andrew_on_pbft(scratch, "reference", bftfs, p, lua, mnt, None)
        delay = 0.3 * ref["phases_s"]["compile"]
        progress(f"== faulted run: backup killed mid-copy, restarted at phase 4, primary killed "
                 f"{delay:.1f} s into phase 5 (30% of the reference's compile)")
        bad = andrew_on_pbft(scratch, "faulted", bftfs, p, lua, mnt, lambda r: FaultPlan(r, delay))
        ref_h, bad_h = ref.pop("hashes"), bad.pop("hashes")
        differences = sorted(set(ref_h) ^ set(bad_h)) + sorted(k for k in set(ref_h) & set(bad_h)
                                                                 if ref_h[k] != bad_h[k])
        hit = {e["event"] for e in bad["events"]}
        result = {
            "meta": common.run_metadata(
                benchmark="bench_fs --faults", machine_before=busy, andrew_n=p["andrew_n"],
                andrew={"source": lua_info, "files_per_copy": len(lua.files)},
                fault_plan=FAULT_PLAN,
                comparison="every entry under the Andrew tree: type, permission bits, size and SHA-256 of the "
                           "bytes, read back after a remount (times excluded)",
                cluster_args=p["cluster_args"]),
            "reference": ref,
            "faulted": bad,
            "faults_hit": {"backup_killed": "backup_killed" in hit, "primary_killed": "primary_killed" in hit},
            "run_completed": True,
            "trees_identical": not differences and ref["tree_digest"] == bad["tree_digest"],
            "differences": differences[:20],
            "slowdown": round(bad["andrew_total_s"] / ref["andrew_total_s"], 3),
        }
        out = common.RESULTS_DIR / (args.output or "fs-faults.json")
        common.write_json(out, result)
        progress(f"wrote {out}: trees identical: {result['trees_identical']} ({ref['entries']} entries); faults hit: "
                 f"{result['faults_hit']}; Andrew {ref['andrew_total_s']:.1f} s -> {bad['andrew_total_s']:.1f} s")
        if not result["trees_identical"]:
            raise BenchError(f"the faulted run's tree differs: {differences[:5]}")
        if not all(result["faults_hit"].values()):
            raise BenchError(f"not every planned fault hit the run: {bad['events']}")
        ok = True
    finally:
        if ok and not common.keep_scratch() and not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            progress(f"kept {scratch} (logs and data)")


# ---------------------------------------------------------------------------------------------------------
# Demo mode (make demo)


def demo(args) -> None:
    """Andrew at a small scale on PBFT then NO-REP; phase times side by side. Writes no result file."""
    n = args.andrew_n or 1
    p = {"systems": ["pbft", "norep"], "andrew_n": n, "repeats": 1, "remount": True,
         "cluster_args": shlex.split(os.environ.get("BENCH_CLUSTER_ARGS", ""))}
    bftfs = common.bftfs_binary()
    check_binary_supports(bftfs, p["systems"])
    lua, lua_info = lua_source()
    scratch = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix="bftfs-fs-demo-"))
    progress(f"Andrew{n}: {n} cop{'y' if n == 1 else 'ies'} of Lua {lua_info.get('version')} from Debian's source "
             f"package ({len(lua.files)} files, {lua.bytes / 1e6:.2f} MB each), compiled with make -j{COMPILE_JOBS}")
    systems: dict = {}
    for kind in p["systems"]:
        run_dir = scratch / kind
        run_dir.mkdir(parents=True)
        system = MountedSystem(run_dir, kind, bftfs, run_dir / "mnt", p["cluster_args"])
        try:
            with Watchdog(system, 600):
                root = system.start()
                progress(f"{kind}: mounted at {root}")
                andrew = Andrew(system, root, lua, n, True, run_dir)
                a = andrew.run()
                check_andrew_tree(system, andrew)
                progress(f"{kind}: every file reads back identical; the lua built on the mount runs")
        finally:
            system.stop()
        systems[kind] = {f"andrew_{ph}_s": a.phases_s[ph] for ph in PHASES}
        systems[kind]["andrew_total_s"] = sum(a.phases_s.values())
        systems[kind]["service_cpu_s"] = sum(a.service_cpu_s.values())
        systems[kind]["requests"] = {ph: (a.requests.get(ph, {}).get("sent_read_only", 0),
                                          a.requests.get(ph, {}).get("sent_ordered", 0)) for ph in PHASES}
    head = ["Andrew" + str(n), SYSTEM_LABELS["pbft"], SYSTEM_LABELS["norep"], "PBFT/NO-REP"]
    rows = []
    for key, label in [(f"andrew_{ph}_s", PHASE_TITLES[ph]) for ph in PHASES] + [("andrew_total_s", "total")]:
        a, b = systems["pbft"][key], systems["norep"][key]
        rows.append([label, f"{a:.3f} s", f"{b:.3f} s", f"{a / b:.2f}x" if b > 0 else "-"])
    widths = [max(len(r[c]) for r in rows + [head]) for c in range(4)]
    print()
    print("  ".join(h.ljust(widths[0]) if c == 0 else h.rjust(widths[c]) for c, h in enumerate(head)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(v.ljust(widths[0]) if c == 0 else v.rjust(widths[c]) for c, v in enumerate(r)))
    print("\nRequests the mount sent per phase (read-only + ordered): "
          + "; ".join(f"{PHASE_TITLES[ph]}: PBFT {systems['pbft']['requests'][ph][0]}+"
                      f"{systems['pbft']['requests'][ph][1]}, NO-REP {systems['norep']['requests'][ph][0]}+"
                      f"{systems['norep']['requests'][ph][1]}" for ph in PHASES))
    print(f"\nCPU used meanwhile by the file system's own processes (they share this machine's "
          f"{os.cpu_count()} cores with gcc): PBFT (4 replicas, relay, FUSE daemon) "
          f"{systems['pbft']['service_cpu_s']:.1f} s, NO-REP (server, relay, FUSE daemon) "
          f"{systems['norep']['service_cpu_s']:.1f} s")
    print()


def main() -> None:
    common.exit_cleanly_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--faults", action="store_true", help="fault mode (pbft): writes bench-results/fs-faults.json")
    mode.add_argument("--demo", action="store_true", help="make demo: Andrew on PBFT and NO-REP side by side")
    ap.add_argument("--output", help="result file name under bench-results/ (default fs.json / fs-faults.json)")
    ap.add_argument("--andrew-n", type=int, help="copies of the source tree (default: ANDREW_N, or 1 for --demo)")
    ap.add_argument("--scratch", help="use this (existing, empty) directory for mounts, clusters and logs; it "
                                      "is never removed (make demo's own directory)")
    args = ap.parse_args()
    if args.andrew_n is not None and args.andrew_n < 1:
        ap.error("--andrew-n must be at least 1")
    try:
        if args.faults:
            bench_faults(args)
        elif args.demo:
            demo(args)
        else:
            bench(args)
    except BenchError as exc:
        raise SystemExit(f"bench_fs: FAILED: {exc}") from None
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: everything was unmounted and stopped on the way out
        print(f"bench_fs: interrupted ({exc or 'SIGINT'}); mounts and processes cleaned up", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
