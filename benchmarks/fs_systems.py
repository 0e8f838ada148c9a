"""The file systems bench_fs.py measures (native, local, norep, pbft), behind one interface, and the watchdog
that turns a hung file system into failed operations (the module docstring of bench_fs.py says what each is
and how its caches are emptied)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import threading
from pathlib import Path
from typing import Sequence

from harness.cli_cluster import CliCluster
from harness.log import progress
from harness.mount import Mount
from harness.procs import HarnessError, bftfs_pids, process_cpu_s
from harness.relay import relay_counters

ALL_SYSTEMS = ("native", "local", "norep", "pbft")
DURABILITY = {"native": "page cache; only the write benchmark fsyncs",
              "local": "the service's state is saved to its directory at unmount",
              "norep": "`cluster start --norep --norep-durable`: the file service on the replicas' disk store "
                       "(checkpoint every 128 requests) and every request in an fdatasync'ed write-ahead log "
                       "(group commit) before its reply: what a PBFT reply promises",
              "pbft": "replicas fdatasync their write-ahead logs (group commit) before they vote; the file "
                      "service on the disk store (checkpoint every 128 batches)"}
MOUNT_TIMEOUT_S = 30.0
CLUSTER_TIMEOUT_S = 60.0


def run_deadline_s(andrew_n: int) -> float:
    """How long one system's whole run may take before the watchdog declares the file system hung: generous
    (a compile of one copy takes about 20 s on this 2-core machine when it is busy)."""
    return 600.0 + 300.0 * andrew_n


class BenchError(HarnessError):
    """A benchmark step failed (wrong result, a command failed, a hang): the run stops with this message."""


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
    """local, norep or pbft: a FUSE mount of our client (harness Mount, in the foreground), with (norep, pbft) a
    cluster and its relay started by `bftfs cluster start` in a directory of its own (harness CliCluster)."""

    def __init__(self, scratch: Path, kind: str, bftfs: Path, mountpoint: Path, cluster_args: Sequence[str] = ()):
        super().__init__(scratch)
        assert kind in ("local", "norep", "pbft")
        self.name = kind
        self.bftfs = bftfs
        self.mnt = mountpoint
        self.cluster_args = list(cluster_args)
        self.cluster: CliCluster | None = None
        self.local_dir: Path | None = None
        self.current: Mount | None = None
        self.mount_count = 0
        self.client_counters: list[dict] = []  # per mount session, from `bftfs mount --status` at exit

    @property
    def cluster_dir(self) -> Path | None:
        return self.cluster.dir if self.cluster is not None else None

    # ---- cluster ----
    def start_cluster(self) -> None:
        # NO-REP durable: the same promise as a PBFT reply (the request is in an fdatasync'ed log before the reply;
        # the file service on the same disk store, norep/norep_server.h).
        norep = self.name == "norep"
        self.cluster = CliCluster(self.bftfs, self.scratch / f"cluster-{self.name}", service="fs", norep=norep,
                                  ports=8, args=["--log-level", "warn", *(["--norep-durable"] if norep else []),
                                                 *self.cluster_args])
        progress(f"{self.name}: bftfs cluster start: keys for a new cluster, "
                 f"{'one NO-REP server' if norep else '4 replicas (f=1)'} and the relay, ports "
                 f"{self.cluster.base_port}..")
        self.cluster.start(CLUSTER_TIMEOUT_S)

    def stop_cluster(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()

    # ---- mount ----
    def mount(self) -> None:
        assert self.current is None
        if self.name == "local":
            if self.local_dir is None:
                self.local_dir = self.scratch / "local-service"
                self.local_dir.mkdir(parents=True)
            backend: list[object] = ["--local", self.local_dir]
        else:
            assert self.cluster is not None
            backend = ["--relay", self.cluster.relay_sock]
        self.mount_count += 1
        self.current = Mount(self.bftfs, self.mnt, self.scratch / f"mount-{self.name}.log", backend,
                             shlex.split(os.environ.get("BENCH_MOUNT_ARGS", "")),  # e.g. "--entry-timeout 3"
                             counters_file=self.scratch / f"mount-{self.name}-{self.mount_count}.status.json")
        try:
            self.current.start(MOUNT_TIMEOUT_S)
        except (RuntimeError, TimeoutError) as exc:
            self.current = None  # Mount.start stopped everything it started
            raise BenchError(f"{self.name}: mount: {exc}") from None

    def umount(self) -> None:
        if self.current is None:
            return
        mount, self.current = self.current, None
        if mount.stop() is None:
            progress(f"WARNING: the mount daemon of {self.mnt} did not exit after the unmount; it was stopped")
        # The daemon wrote its final counters at exit (bftfs mount --status): one entry per mount session.
        counters = mount.counters()
        if counters is not None:
            self.client_counters.append(counters)
            progress(f"{self.name}: mount session {len(self.client_counters)}: "
                     + ", ".join(f"{k} {v}" for k, v in counters.items() if v))

    def requests(self) -> dict[str, int]:
        if self.cluster is None:
            return {}
        return relay_counters(self.cluster.relay_sock)

    def service_cpu_s(self) -> float:
        marks = [str(self.mnt)] + ([str(self.cluster.dir)] if self.cluster is not None else [])
        return sum(process_cpu_s(pid) for pid in bftfs_pids(marks))

    def abort(self) -> None:
        if self.current is not None:
            self.current.abort()

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
