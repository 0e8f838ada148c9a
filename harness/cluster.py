"""A bftfs cluster made by `bftfs keygen`: n = 3f+1 replicas and optionally one NO-REP server, each a Daemon.

Layout in `root`: cluster.conf and keys/ from keygen; the replicas' data directories replica-<i>/ (with their
status.json) and logs replica-<i>.log; the NO-REP server's norep/ and norep.log. After fresh_data(TAG) new
daemons use TAG/replica-<i>/ and TAG/norep/, with logs TAG-replica-<i>.log and TAG-norep.log, so a benchmark can
start every configuration from an empty service state in one cluster directory.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

from harness.counter import counter_argv, run_counter
from harness.daemon import READY_TIMEOUT_S, Daemon
from harness.log import progress
from harness.ports import free_port_range
from harness.procs import run_in_group
from harness.waiting import wait_until


class Cluster:
    """n = 3f+1 replicas of `service` (and on request a NO-REP server) on `hosts` (replica i on
    hosts[i % len]), ports from `base_port` (allocated when None: n + 1, the last one for a NO-REP server
    beside the replicas).

    `replica_prefix(i)` is put before replica i's command line (e.g. `ip netns exec`); `replica_args` follow the
    fixed ones, `log_level` (None: the daemons' default) goes to every daemon. Without `root` the cluster lives
    in a new temporary directory that close() removes, unless `keep`, or unless the `with` block ended in an
    exception: then it is kept (logs and data) and its path printed.

    Client ids: a benchmark should give every run ids no earlier run used (take_clients), so no run starts with
    a stale token, which costs a resynchronising round trip inside the measurement."""

    def __init__(self, bftfs: Path, root: Path | None = None, *, f: int = 1, clients: int = 16,
                 service: str = "counter", hosts: Sequence[str] = ("127.0.0.1",), base_port: int | None = None,
                 replica_prefix: Callable[[int], Sequence[str]] | None = None, replica_args: Sequence[str] = (),
                 log_level: str | None = None, keep: bool = False) -> None:
        self.bftfs = bftfs
        self.f = f
        self.n = 3 * f + 1
        self.clients_requested = clients
        self.service = service
        self.hosts = list(hosts)
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="bftfs-cluster-")) if root is None else root
        self.keep = keep
        self.base_port = free_port_range(self.n + 1) if base_port is None else base_port
        self.replica_prefix = replica_prefix or (lambda i: ())
        self.replica_args = list(replica_args)
        self.log_level = log_level
        self.data_tag: str | None = None
        self.replicas: list[Daemon] = []
        self.norep: Daemon | None = None
        self.client_ids: list[int] = []
        self.addresses: list[tuple[str, int]] = []
        self._next_client = 0
        self._norep_beside = False
        self._expected_errors: list[re.Pattern] = []

    @property
    def config(self) -> Path:
        return self.root / "cluster.conf"

    def __enter__(self) -> "Cluster":
        self.keygen()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(failed=exc_type is not None)

    # ---- keys and configuration ----
    def keygen(self) -> None:
        """`bftfs keygen` into root; reads the addresses and client ids back and makes the replica daemons."""
        self.root.mkdir(parents=True, exist_ok=True)
        argv = [str(self.bftfs), "keygen", "--dir", str(self.root), "--f", str(self.f),
                "--clients", str(self.clients_requested), "--hosts", ",".join(self.hosts),
                "--base-port", str(self.base_port)]
        done = run_in_group(argv, 120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr.strip()}")
        self._read_config()
        self.replicas = [self._replica(i) for i in range(self.n)]

    def _read_config(self) -> None:
        """The replica addresses and client ids that keygen wrote (format: common/config.h)."""
        replicas: dict[int, tuple[str, int]] = {}
        clients: list[int] = []
        for line in self.config.read_text().splitlines():
            words = line.split("#", 1)[0].split()
            if len(words) >= 3 and words[0] == "replica":
                host, _, port = words[2].rpartition(":")
                replicas[int(words[1])] = (host.strip("[]"), int(port))
            elif len(words) >= 2 and words[0] == "client":
                clients.append(int(words[1]))
        if sorted(replicas) != list(range(self.n)):
            raise RuntimeError(f"{self.config}: expected replicas 0..{self.n - 1}, found {sorted(replicas)}")
        if len(clients) != self.clients_requested:
            raise RuntimeError(f"{self.config}: expected {self.clients_requested} clients, found {len(clients)}")
        self.addresses = [replicas[i] for i in range(self.n)]
        self.client_ids = clients

    def take_clients(self, k: int) -> int:
        """The first of `k` consecutive client ids not handed out before (wrapping around when the pool is used
        up; a reused id only costs one resynchronisation)."""
        assert 1 <= k <= len(self.client_ids)
        if self._next_client + k > len(self.client_ids):
            self._next_client = 0
        first = self.client_ids[self._next_client]
        assert self.client_ids[self._next_client + k - 1] == first + k - 1, "client ids are not consecutive"
        self._next_client += k
        return first

    # ---- replicas ----
    def _path(self, name: str, suffix: str = "") -> Path:
        if self.data_tag is None:
            return self.root / f"{name}{suffix}"
        return self.root / (f"{self.data_tag}-{name}{suffix}" if suffix else f"{self.data_tag}/{name}")

    def replica_data(self, i: int) -> Path:
        return self._path(f"replica-{i}")

    def _replica(self, i: int, extra_args: Sequence[str] = (), log_level: str | None = None) -> Daemon:
        level = log_level or self.log_level
        return Daemon(f"replica-{i}",
                      [self.bftfs, "replica", "--config", self.config, "--id", i, "--data", self.replica_data(i),
                       "--service", self.service, *(["--log-level", level] if level else []), *self.replica_args,
                       *extra_args],
                      self._path(f"replica-{i}", ".log"), self.replica_data(i), prefix=self.replica_prefix(i))

    def fresh_data(self, tag: str) -> None:
        """From now on daemons use new, empty data directories named after `tag` (a fresh service state); the
        replica daemons are made anew (any still running are killed first)."""
        for d in self.daemons():
            d.kill()
        self.data_tag = tag
        self.replicas = [self._replica(i) for i in range(self.n)]
        self.norep = None

    def start(self, ids: Iterable[int] | None = None, wait: bool = True,
              timeout_s: float = READY_TIMEOUT_S) -> None:
        """Starts replicas `ids` (default all) with the arguments they had, and waits until they are ready."""
        ids = list(range(self.n)) if ids is None else list(ids)
        for i in ids:
            self.replicas[i].start()
        if wait:
            self.wait_ready(ids, timeout_s)

    def start_replicas(self, extra_args: Sequence[str] = (), ids: Iterable[int] | None = None,
                       log_level: str | None = None, wait: bool = True) -> None:
        """Starts replicas `ids` (default all) as new daemons with `extra_args` after the cluster's arguments
        (and `log_level` instead of the cluster's); an earlier incarnation still running is killed."""
        ids = list(range(self.n)) if ids is None else list(ids)
        for i in ids:
            self.replicas[i].kill()
            self.replicas[i] = self._replica(i, extra_args, log_level)
            self.replicas[i].start()
        if wait:
            self.wait_ready(ids)

    def wait_ready(self, ids: Iterable[int] | None = None, timeout_s: float = READY_TIMEOUT_S) -> None:
        ids = list(range(self.n)) if ids is None else list(ids)
        deadline = time.monotonic() + timeout_s
        for i in ids:
            self.replicas[i].wait_ready(max(0.1, deadline - time.monotonic()))

    def stop(self, i: int) -> None:
        self.replicas[i].stop()

    def kill(self, i: int) -> None:
        """Crash replica i (SIGKILL)."""
        self.replicas[i].kill()

    def restart(self, i: int, wait_ready: bool = True) -> None:
        self.replicas[i].restart(wait_ready)

    def stop_replicas(self) -> None:
        for d in self.replicas:
            d.stop()

    def status(self, i: int) -> dict | None:
        return self.replicas[i].status()

    def primary(self) -> int:
        """The primary by the highest view any live replica reports (view mod n)."""
        views = [s["view"] for s in (d.status() for d in self.replicas if d.alive()) if s and "view" in s]
        if not views:
            raise RuntimeError("no replica reports its view")
        return max(views) % self.n

    # ---- NO-REP ----
    @property
    def norep_address(self) -> str:
        """Where the NO-REP server listens (start_norep): replica 0's address, or beside the replicas the port
        after theirs (allocated with them)."""
        host, port = self.addresses[0] if not self._norep_beside else (self.hosts[0], self.base_port + self.n)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def start_norep(self, extra_args: Sequence[str] = (), prefix: Sequence[str] = (), service: str | None = None,
                    wait: bool = True, beside_replicas: bool = False) -> Daemon:
        """Starts the unreplicated server (`bftfs norep`, after `prefix`, e.g. taskset) with this cluster's
        configuration; counter(norep=True) talks to it at norep_address. It listens on replica 0's address (its
        default: free while the replicas are stopped), or with `beside_replicas` on the port after the
        replicas', so it can run while they do. (Not on that port always: no one listened there before, so a
        recent client connection may hold it in TIME_WAIT and the bind fail.) An earlier server is killed."""
        if self.norep is not None:
            self.norep.kill()
        self._norep_beside = beside_replicas
        data = self._path("norep")
        listen = ["--listen", self.norep_address] if beside_replicas else []
        self.norep = Daemon("norep", [self.bftfs, "norep", "--config", self.config, "--data", data,
                                      "--service", service or self.service, *listen,
                                      *(["--log-level", self.log_level] if self.log_level else []), *extra_args],
                            self._path("norep", ".log"), data, prefix=prefix)
        self.norep.start()
        if wait:
            self.norep.wait_ready()
        return self.norep

    def stop_norep(self) -> None:
        if self.norep is not None:
            self.norep.stop()

    # ---- the counter client ----
    def counter_argv(self, client_id: int, **options) -> list[str]:
        """counter_argv (harness.counter) against this cluster; with norep=True against its NO-REP server."""
        if options.get("norep"):
            options.setdefault("server", self.norep_address)
        return counter_argv(self.bftfs, self.config, client_id, **options)

    def counter(self, client_id: int | None = None, *, timeout_s: float = 300.0, **options) -> dict:
        """`bftfs counter --json` to completion (options as in counter_argv); the first client id by default."""
        cid = self.client_ids[0] if client_id is None else client_id
        return run_counter(self.counter_argv(cid, **options), timeout_s)

    def counter_fresh(self, args: Sequence[object], clients: int = 1, norep: bool = False,
                      timeout_s: float = 300.0, prefix: Sequence[str] = ()) -> dict:
        """`bftfs counter --json ARGS` with `clients` client ids never used before (take_clients)."""
        return self.counter(self.take_clients(clients), timeout_s=timeout_s, norep=norep, extra=args,
                            prefix=prefix)

    # ---- logs and teardown ----
    def expect_error(self, pattern: str) -> None:
        """ERROR lines matching `pattern` (a regex) are not reported by unexpected_errors()."""
        self._expected_errors.append(re.compile(pattern))

    def daemons(self) -> list[Daemon]:
        return self.replicas + ([self.norep] if self.norep else [])

    def unexpected_errors(self) -> list[str]:
        out = []
        for d in self.daemons():
            for line in d.error_lines():
                if not any(p.search(line) for p in self._expected_errors):
                    out.append(f"{d.name}: {line}")
        return out

    def close(self, failed: bool = False) -> None:
        """Stops every process this cluster started (always). A temporary root is removed unless `keep` or
        `failed` (then its path is printed: the logs are there)."""
        for d in self.daemons():
            with contextlib.suppress(Exception):
                d.stop()
        if self._own_root and not (self.keep or failed):
            shutil.rmtree(self.root, ignore_errors=True)
        elif self._own_root:
            progress(f"kept {self.root} (logs and data)")


# ---------------------------------------------------------------------------------------------------------
# What the replicas report


def status_value(status: dict | None, key: str):
    """`key` from a status.json object, searching nested objects (keys are unique across the nesting)."""
    if not isinstance(status, dict):
        return None
    if key in status:
        return status[key]
    for v in status.values():
        if isinstance(v, dict):
            found = status_value(v, key)
            if found is not None:
                return found
    return None


def last_executed(cluster: Cluster, i: int) -> int | None:
    return status_value(cluster.status(i), "last_executed")


def wait_caught_up(cluster: Cluster, ids: Iterable[int], target: int, timeout_s: float, what: str) -> None:
    """Polls until every replica in `ids` reports last_executed >= `target`; AssertionError with what they
    report if that does not happen within `timeout_s`."""
    ids = list(ids)

    def done() -> bool:
        return all((last_executed(cluster, i) or 0) >= target for i in ids)

    try:
        wait_until(done, timeout_s, what)
    except TimeoutError as e:
        seen = {i: last_executed(cluster, i) for i in ids}
        raise AssertionError(f"{e}: last_executed {seen}, target {target}") from None


def wait_converged(cluster: Cluster, ids: Iterable[int], timeout_s: float, above: int = 0) -> int:
    """Polls until every replica in `ids` reports the same last_executed, greater than `above`, and returns it.
    Status files are refreshed about every 500 ms, so a read may be stale: pass in `above` what must already be
    covered (e.g. a value read before the last requests were sent)."""
    ids = list(ids)

    def same():
        seen = {last_executed(cluster, i) for i in ids}
        if len(seen) != 1 or None in seen:
            return None
        value = seen.pop()
        return value if value > above else None

    try:
        return wait_until(same, timeout_s, f"replicas {ids} to report the same last_executed")
    except TimeoutError as e:
        raise AssertionError(f"{e}: {[cluster.status(i) for i in ids]}") from None


# ---------------------------------------------------------------------------------------------------------
# Wide-area emulation (runtime/wan.h)


def wan_args(delay_ms: float, sites: dict[int, int]) -> list[str]:
    """The WAN options every process of one run gets (the same spec everywhere): a one-way delay between
    sites, and node -> site assignments (nodes not named are their own site). None for a LAN (delay 0)."""
    if delay_ms <= 0:
        return []
    args = ["--wan-delay-ms", f"{delay_ms:g}"]
    if sites:
        args += ["--wan-site", ",".join(f"{node}={site}" for node, site in sorted(sites.items()))]
    return args
