"""Shared process and cluster helpers for the bftfs benchmarks (bench_counter.py, bench_faults.py).

Benchmarks are not tests: they start real `bftfs` processes on loopback, measure, and write JSON and plots
under bench-results/. This module owns everything about processes so that each benchmark script is only its
measurement plan:

  bftfs_binary()     $BFTFS_BUILD or $BUILD (default "build", relative to the repository) + /cli/bftfs
  LocalCluster       `bftfs keygen` into a scratch directory, then replicas and the NO-REP server as
                     processes in their own process groups; readiness is polled from status.json with a
                     deadline; close() (also on an exception, via `with`) kills every process group it started
  run_counter()      one `bftfs counter ... --json` to completion, parsed
  progress()         timestamped progress on stderr
  run_metadata()     date, git commit, machine load, CPU, for the `meta` object of every result file

Contract used from the daemons (runtime/status_file.h): <data dir>/status.json, replaced atomically about every
500 ms, with "pid" and "running"; a daemon is ready when the file names its own pid and "running" is true.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable, Sequence

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "bench-results"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
POLL_S = 0.02

_T0 = time.monotonic()


def progress(message: str) -> None:
    """One progress line on stderr, prefixed with the seconds since the script started."""
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


def exit_cleanly_on_sigterm() -> None:
    """Turns SIGTERM and SIGHUP into KeyboardInterrupt, so `with LocalCluster(...)` and `finally` blocks still
    kill every process the benchmark started when make or a CI runner stops it."""
    def handler(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


def quick_mode() -> bool:
    """QUICK=1 in the environment (make bench QUICK=1): shorter runs, same outputs."""
    return os.environ.get("QUICK", "0") not in ("", "0", "false", "no")


def keep_scratch() -> bool:
    """BENCH_KEEP=1: keep the cluster's scratch directory (logs and data) after the run, and say where."""
    return os.environ.get("BENCH_KEEP") == "1"


# ---------------------------------------------------------------------------------------------------------
# Binary and metadata


def build_dir() -> Path:
    """$BFTFS_BUILD (set by the Makefile), else $BUILD, else "build"; relative paths are taken from the
    repository root so the scripts work from any working directory."""
    value = os.environ.get("BFTFS_BUILD") or os.environ.get("BUILD") or "build"
    path = Path(value)
    return path if path.is_absolute() else REPO / path


def bftfs_binary() -> Path:
    """The `bftfs` executable, or SystemExit with a message saying how to build it."""
    path = build_dir() / "cli" / "bftfs"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise SystemExit(f"{path} is not built: run `make` (or set BUILD=<build dir>)")
    return path


def git_commit() -> str:
    """HEAD's commit, with "-dirty" if tracked files differ from it; "unknown" outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not head:
        return "unknown"
    return head + ("-dirty" if dirty else "")


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies summed over all CPUs, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def machine_busy_before(sample_s: float = 1.0) -> dict:
    """How busy the machine is *before* a benchmark starts (others compiling, fuzzing...): CPU busy percent over
    `sample_s`, the load average, and the busiest processes by their recent CPU share (ps). Recorded in meta so
    that results taken on a shared machine say what they competed with."""
    b0, t0 = _cpu_times()
    time.sleep(sample_s)
    b1, t1 = _cpu_times()
    busy = 100.0 * (b1 - b0) / (t1 - t0) if t1 > t0 else float("nan")
    top: list[str] = []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["ps", "-eo", "pcpu,comm", "--sort=-pcpu", "--no-headers"], capture_output=True,
                             text=True, timeout=10).stdout
        top = [" ".join(line.split()) for line in out.splitlines()[:3]]
    return {"cpu_busy_pct": round(busy, 1), "loadavg_1_5_15": load_average(), "busiest_processes_pcpu": top}


def run_metadata(**extra) -> dict:
    """The `meta` object of a result file. Load averages are sampled now; scripts also record them at the
    start, because the benchmark itself loads the machine."""
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "host": platform.node(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "loadavg_1_5_15_end": load_average(),
        "quick": quick_mode(),
        "bftfs": str(build_dir() / "cli" / "bftfs"),  # not required: some benchmarks also run without it
    }
    meta.update(extra)
    return meta


def write_json(path: Path, value: dict) -> None:
    """Writes `value` to `path` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(value, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


# ---------------------------------------------------------------------------------------------------------
# Ports


def free_port_range(count: int, rng: random.Random | None = None) -> int:
    """The first of `count` consecutive ports that are free now on 127.0.0.1 (TCP and UDP)."""
    rng = rng or random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(500):
        base = rng.randrange(20000, 60000 - count)
        if all(_port_free(p) for p in range(base, base + count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports found")


def _port_free(port: int) -> bool:
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


# ---------------------------------------------------------------------------------------------------------
# Processes


class Daemon:
    """One background process in its own process group (session), output appended to `log_path`."""

    def __init__(self, name: str, argv: Sequence[object], log_path: Path, data_dir: Path | None) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = log_path
        self.data_dir = data_dir
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        assert not self.alive(), f"{self.name} is already running"
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                (self.data_dir / "status.json").unlink()  # readiness must come from this incarnation
        with open(self.log_path, "ab") as log:
            log.write(f"---- start: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> dict | None:
        """This incarnation's status.json, or None (absent, half-written, or another pid's)."""
        if self.data_dir is None or self.proc is None:
            return None
        try:
            value = json.loads((self.data_dir / "status.json").read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(value, dict) or value.get("pid") != self.proc.pid:
            return None
        return value

    def ready(self) -> bool:
        if not self.alive():
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode if self.proc else None}; "
                               f"log tail:\n{self.log_tail()}")
        status = self.status()
        return bool(status and status.get("running") is True)

    def signal_group(self, sig: int) -> None:
        """Signals the whole process group. Only while the leader is unreaped, so the id is still ours."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL to the group (a crash) and reap."""
        if self.proc is not None and self.proc.returncode is None:
            self.signal_group(signal.SIGKILL)  # also ends a SIGSTOPped process
            self.proc.wait()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, then SIGKILL after `timeout_s`."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.signal_group(signal.SIGCONT)
        self.signal_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def wait_until(predicate, timeout_s: float, what: str):
    """Polls `predicate` until truthy (returned) or TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.1f}s waiting for {what}")
        time.sleep(POLL_S)


class LocalCluster:
    """A cluster on 127.0.0.1 in a scratch directory: cluster.conf and keys from `bftfs keygen`, replica i with
    data directory r<i>/ and log r<i>.log, the NO-REP server with norep/ and norep.log.

    Client ids: every counter run should use client ids no earlier run used (`take_clients`), so no run
    starts with a stale token (which would cost a resynchronising round trip inside the measurement)."""

    def __init__(self, bftfs: Path, f: int = 1, clients: int = 512, root: Path | None = None,
                 keep: bool = False) -> None:
        self.bftfs = bftfs
        self.f = f
        self.n = 3 * f + 1
        self.client_count = clients
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="bftfs-bench-")) if root is None else root
        self.keep = keep
        self.base_port = free_port_range(self.n + 1)
        self.replicas: list[Daemon] = []
        self.norep: Daemon | None = None
        self.client_ids: list[int] = []
        self._next_client = 0
        self.data_tag = "run0"

    @property
    def config(self) -> Path:
        return self.root / "cluster.conf"

    def __enter__(self) -> "LocalCluster":
        self.keygen()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def keygen(self) -> None:
        argv = [str(self.bftfs), "keygen", "--dir", str(self.root), "--f", str(self.f), "--clients",
                str(self.client_count), "--hosts", "127.0.0.1", "--base-port", str(self.base_port)]
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
        self.client_ids = []
        for line in self.config.read_text().splitlines():
            words = line.split("#", 1)[0].split()
            if len(words) >= 2 and words[0] == "client":
                self.client_ids.append(int(words[1]))
        if len(self.client_ids) != self.client_count:
            raise RuntimeError(f"{self.config}: expected {self.client_count} clients, found {len(self.client_ids)}")

    def take_clients(self, k: int) -> int:
        """The first of `k` consecutive client ids not handed out before (wrapping around when the pool is used
        up; a reused id only costs one resynchronisation)."""
        assert 1 <= k <= self.client_count
        if self._next_client + k > self.client_count:
            self._next_client = 0
        first = self.client_ids[self._next_client]
        assert self.client_ids[self._next_client + k - 1] == first + k - 1, "client ids are not consecutive"
        self._next_client += k
        return first

    # ---- replicas ----
    def fresh_data(self, tag: str) -> None:
        """Later starts use new, empty data directories named after `tag` (a fresh service state), so each
        measured configuration starts from the same empty state."""
        self.data_tag = tag

    def replica_data(self, i: int) -> Path:
        return self.root / self.data_tag / f"r{i}"

    def start_replicas(self, extra_args: Sequence[str] = (), ids: Iterable[int] | None = None,
                       log_level: str = "warn", wait: bool = True) -> None:
        ids = list(range(self.n)) if ids is None else list(ids)
        if not self.replicas:
            self.replicas = [None] * self.n  # type: ignore[list-item]
        for i in ids:
            old = self.replicas[i]
            if old is not None:
                old.kill()
            d = Daemon(f"replica-{i}",
                       [self.bftfs, "replica", "--config", self.config, "--id", i, "--data", self.replica_data(i),
                        "--service", "counter", "--log-level", log_level, *extra_args],
                       self.root / f"{self.data_tag}-r{i}.log", self.replica_data(i))
            self.replicas[i] = d
            d.start()
        if wait:
            self.wait_ready(ids)

    def restart_replica(self, i: int, wait: bool = True) -> None:
        """Starts replica i again with the same arguments and data directory (after kill or stop)."""
        d = self.replicas[i]
        d.kill()
        d.start()
        if wait:
            self.wait_ready([i])

    def wait_ready(self, ids: Iterable[int] | None = None, timeout_s: float = READY_TIMEOUT_S) -> None:
        ids = list(range(self.n)) if ids is None else list(ids)
        deadline = time.monotonic() + timeout_s
        for i in ids:
            d = self.replicas[i]
            wait_until(d.ready, max(0.1, deadline - time.monotonic()), f"{d.name} to be ready ({d.log_path})")

    def status(self, i: int) -> dict | None:
        return self.replicas[i].status()

    def primary(self) -> int:
        """The primary by the highest view any live replica reports (view mod n)."""
        views = [s["view"] for s in (d.status() for d in self.replicas if d and d.alive()) if s and "view" in s]
        if not views:
            raise RuntimeError("no replica reports its view")
        return max(views) % self.n

    def stop_replicas(self) -> None:
        for d in self.replicas:
            if d is not None:
                d.stop()

    # ---- NO-REP ----
    def start_norep(self, extra_args: Sequence[str] = (), log_level: str = "warn",
                    prefix: Sequence[str] = ()) -> None:
        """Starts `bftfs norep` (after `prefix`, e.g. taskset) with a fresh data directory of this data tag."""
        if self.norep is not None:
            self.norep.kill()
        data = self.root / self.data_tag / "norep"
        self.norep = Daemon("norep", [*prefix, self.bftfs, "norep", "--config", self.config, "--data", data,
                                      "--service", "counter", "--log-level", log_level, *extra_args],
                            self.root / f"{self.data_tag}-norep.log", data)
        self.norep.start()
        wait_until(self.norep.ready, READY_TIMEOUT_S, f"norep to be ready ({self.norep.log_path})")

    def stop_norep(self) -> None:
        if self.norep is not None:
            self.norep.stop()

    # ---- clients ----
    def counter_argv(self, first_client: int, args: Sequence[object], norep: bool = False,
                     prefix: Sequence[str] = ()) -> list[str]:
        argv = [*prefix, str(self.bftfs), "counter", "--config", str(self.config), "--id", str(first_client),
                "--json"]
        if norep:
            argv.append("--norep")
        return argv + [str(a) for a in args]

    def counter(self, args: Sequence[object], clients: int = 1, norep: bool = False,
                timeout_s: float = 300.0, prefix: Sequence[str] = ()) -> dict:
        """Runs `bftfs counter --json` with fresh client ids to completion; returns its JSON."""
        return run_counter(self.counter_argv(self.take_clients(clients), args, norep, prefix), timeout_s)

    def daemons(self) -> list[Daemon]:
        return [d for d in self.replicas if d is not None] + ([self.norep] if self.norep else [])

    def close(self) -> None:
        """Kills every process this cluster started; removes the scratch directory unless `keep`."""
        for d in self.daemons():
            with contextlib.suppress(Exception):
                d.kill()
        if self._own_root and not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)
        elif self.keep:
            progress(f"kept {self.root} (logs and data)")


def run_counter(argv: Sequence[str], timeout_s: float) -> dict:
    """Runs one `bftfs counter ... --json` in its own process group (killed on timeout or interrupt) and
    returns its JSON (the last stdout line). Raises RuntimeError with stderr on failure."""
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n{err.strip()[-2000:]}")
    lines = [line for line in out.splitlines() if line.strip()]
    if not lines:
        raise RuntimeError(f"{' '.join(argv)} printed nothing on stdout:\n{err.strip()[-2000:]}")
    return json.loads(lines[-1])


def counter_help(bftfs: Path) -> str:
    """`bftfs counter --help` (to detect optional features such as --timeline-ms)."""
    done = subprocess.run([str(bftfs), "counter", "--help"], capture_output=True, text=True, timeout=10)
    return done.stdout + done.stderr


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of `values`; NaN for an empty list."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]
