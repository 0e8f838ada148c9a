"""Fixtures for bftfs integration tests: real `bftfs` processes on this machine.

What is here (tests are written in other files of this directory):
  build_dir, bftfs_bin   where the binaries are; a test is SKIPPED with the reason when `bftfs` is not built
                         (under `make test`, BFTFS_REQUIRE_BINARIES=1 turns that skip into a failure)
  ports                  per-test unique, currently unused port ranges
  cluster                factory: `bftfs keygen` into tmp_path, start n = 3f+1 replicas, wait until ready
  netns                  factory: network namespaces joined by veth pairs and a bridge (multi-host topologies),
                         with partition / isolate adversaries as context managers; always cleaned up
  run_counter            run `bftfs counter ... --json` and return its parsed JSON

Conventions (house style): readiness is polled with a deadline, never slept for; teardown always kills what a
test started, even when the test failed; an ERROR line in a daemon's log fails the test unless the test said
it expects it (cluster.expect_error(regex)).

Contract used from the daemons (runtime/status_file.h): `bftfs replica` and `bftfs norep` write
<data dir>/status.json -- one JSON object, replaced atomically, refreshed about every 500 ms -- with at least
"pid" and "running". A daemon is ready when its file names its own pid (so a stale file from an earlier
incarnation never counts) and "running" is true; this is the rule `bftfs cluster start` uses too.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import pytest

# The POSIX suite's shared fixtures (test_posix_*.py load it with pytest_plugins): asserts rewritten there too.
pytest.register_assert_rewrite("posix_harness")

REPO = Path(__file__).resolve().parents[2]
STATUS_FILE = "status.json"
READY_TIMEOUT_S = float(os.environ.get("BFTFS_READY_TIMEOUT_S", "30"))
STOP_TIMEOUT_S = 5.0
POLL_INTERVAL_S = 0.02

# Every daemon started through these fixtures, so that nothing outlives the session even if a fixture's own
# teardown was skipped by an internal error.
_LIVE: set["Daemon"] = set()


# ---------------------------------------------------------------------------------------------------------
# Binaries


def find_build_dir() -> Path:
    """The build directory: $BFTFS_BUILD (set by the Makefile), else <repo>/build."""
    env = os.environ.get("BFTFS_BUILD")
    return Path(env).resolve() if env else REPO / "build"


def require_binary(relative: str) -> Path:
    """The path of a built binary, e.g. "cli/bftfs". Skips the test with the reason if it is not built,
    or fails it when BFTFS_REQUIRE_BINARIES=1 (make test): a missing binary there is a broken build."""
    path = find_build_dir() / relative
    if path.is_file() and os.access(path, os.X_OK):
        return path
    reason = f"{path} is not built (run `make`; set BFTFS_BUILD for another build directory)"
    if os.environ.get("BFTFS_REQUIRE_BINARIES") == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def build_dir() -> Path:
    return find_build_dir()


@pytest.fixture(scope="session")
def bftfs_bin() -> Path:
    return require_binary("cli/bftfs")


# ---------------------------------------------------------------------------------------------------------
# Waiting


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str,
               interval_s: float = POLL_INTERVAL_S) -> object:
    """Polls `predicate` until it returns a truthy value (which is returned) or `timeout_s` passes, then raises
    TimeoutError naming `what`. An exception from the predicate propagates at once (fail fast)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.1f}s waiting for {what}")
        time.sleep(interval_s)


# ---------------------------------------------------------------------------------------------------------
# Ports


class PortAllocator:
    """Hands out ranges of ports that are free now (TCP and UDP, checked by binding) and were not handed out
    before in this session. Ranges are random so that concurrent pytest runs rarely collide."""

    LOW, HIGH = 20000, 60000

    def __init__(self) -> None:
        self._taken: list[tuple[int, int]] = []
        self._rng = random.Random(os.getpid() ^ time.monotonic_ns())

    @staticmethod
    def _free(port: int) -> bool:
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            with socket.socket(socket.AF_INET, kind) as s:
                try:
                    s.bind(("0.0.0.0", port))
                except OSError:
                    return False
        return True

    def alloc(self, count: int) -> int:
        """The first of `count` consecutive free ports."""
        assert 0 < count < 1000
        for _ in range(200):
            base = self._rng.randrange(self.LOW, self.HIGH - count)
            if any(base < hi and lo < base + count for lo, hi in self._taken):
                continue
            if all(self._free(p) for p in range(base, base + count)):
                self._taken.append((base, base + count))
                return base
        raise RuntimeError(f"no {count} consecutive free ports found")


_PORTS = PortAllocator()


@pytest.fixture
def ports() -> PortAllocator:
    return _PORTS


# ---------------------------------------------------------------------------------------------------------
# Processes

_ERROR_LINE = re.compile(r"^\S+\s+ERROR\b|^==\d+==ERROR|runtime error:|^terminate called")


class Daemon:
    """One long-running process (a replica, NO-REP, later the relay or the client daemon). Its output goes to
    `log_path`; it runs in its own process group so that stop() and kill() reach its children too."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, data_dir: Path | None = None,
                 prefix: Sequence[str] = ()) -> None:
        self.name = name
        self.argv = list(prefix) + [str(a) for a in argv]
        self.log_path = log_path
        self.data_dir = data_dir
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def status_path(self) -> Path | None:
        return self.data_dir / STATUS_FILE if self.data_dir else None

    def start(self) -> "Daemon":
        assert not self.alive(), f"{self.name} is already running"
        if self.data_dir:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"---- start {self.starts}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.starts += 1
        _LIVE.add(self)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> dict | None:
        """The daemon's status.json, or None if absent, unreadable, or written by another pid (stale)."""
        path = self.status_path
        if path is None or self.proc is None:
            return None
        try:
            value = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(value, dict) or value.get("pid") != self.proc.pid:
            return None
        return value

    def is_ready(self) -> bool:
        """Ready: running, and its own status.json says "running": true. Raises if the process died."""
        if not self.alive():
            code = self.proc.returncode if self.proc else None
            raise RuntimeError(f"{self.name} is not running (exit code {code}); log tail:\n{self.log_tail()}")
        status = self.status()
        return status is not None and status.get("running") is True

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        try:
            wait_until(self.is_ready, timeout_s, f"{self.name} to write a ready {self.status_path}")
        except TimeoutError as e:
            raise TimeoutError(f"{e}; log tail:\n{self.log_tail()}") from None

    def _signal_group(self, sig: int) -> None:
        """Signals the daemon's process group. Only called while the leader is not yet reaped (running or a
        zombie), so the group id cannot have been reused by an unrelated process."""
        assert self.proc is not None and self.proc.returncode is None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def _wait_exit_unreaped(self, timeout_s: float) -> bool:
        """Waits until the leader exits without reaping it (it stays a zombie holding the group id)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_INTERVAL_S)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM to the group, SIGKILL after `timeout_s`; then SIGKILL to whatever else is left in the group.
        Returns the exit code (None if never started)."""
        if self.proc is None:
            return None
        if self.proc.returncode is None:  # not reaped yet: the group id is still ours
            self._signal_group(signal.SIGTERM)
            self._wait_exit_unreaped(timeout_s)
            self._signal_group(signal.SIGKILL)
            self.proc.wait()
        _LIVE.discard(self)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL, as in a crash: the daemon gets no chance to clean up."""
        if self.proc is not None and self.proc.returncode is None:
            self._signal_group(signal.SIGKILL)
            self.proc.wait()
        _LIVE.discard(self)

    def restart(self, wait_ready: bool = True) -> None:
        self.stop()
        if self.status_path and self.status_path.exists():
            self.status_path.unlink()  # so readiness is the new process's word, not the old one's
        self.start()
        if wait_ready:
            self.wait_ready()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def error_lines(self) -> list[str]:
        return [line for line in self.log_text().splitlines() if _ERROR_LINE.search(line)]


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    for daemon in list(_LIVE):
        daemon.kill()


# ---------------------------------------------------------------------------------------------------------
# The counter client


def parse_json_output(text: str) -> dict:
    """The JSON object a `--json` command printed: the whole stdout, or else its last line that is an object
    (so a log line before it does not break parsing)."""
    text = text.strip()
    try:
        value = json.loads(text)
    except ValueError:
        value = None
        for line in reversed(text.splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    value = json.loads(line)
                    break
                except ValueError:
                    continue
    if not isinstance(value, dict):
        raise ValueError(f"no JSON object in output:\n{text[-2000:]}")
    return value


def counter(bftfs: Path, config: Path, client_id: int, *, requests: int | None = None, norep: bool = False,
            server: str | None = None, clients: int | None = None, duration_s: float | None = None,
            extra: Iterable[str] = (), prefix: Sequence[str] = (), timeout_s: float = 300.0) -> dict:
    """Runs `bftfs counter --config CONFIG --id CLIENT_ID ... --json` to completion and returns its JSON.
    With norep=True it talks to the NO-REP server at `server` ("host:port"; default: replica 0's address).
    Raises AssertionError (with stderr) if it fails or times out."""
    argv = list(prefix) + [str(bftfs), "counter", "--config", str(config), "--id", str(client_id), "--json"]
    if requests is not None:
        argv += ["--requests", str(requests)]
    if norep:
        argv.append("--norep")
        if server is not None:
            argv += ["--server", server]
    if clients is not None:
        argv += ["--clients", str(clients)]
    if duration_s is not None:
        argv += ["--duration-s", f"{duration_s:g}"]
    argv += list(extra)
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{' '.join(argv)} did not finish in {timeout_s}s; stderr:\n{e.stderr}") from None
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {done.returncode}; stderr:\n{done.stderr[-4000:]}")
    return parse_json_output(done.stdout)


@pytest.fixture
def run_counter(bftfs_bin: Path) -> Callable[..., dict]:
    """run_counter(config, client_id, requests=..., norep=..., clients=..., duration_s=..., prefix=...)."""
    def run(config: Path, client_id: int, **kwargs) -> dict:
        return counter(bftfs_bin, config, client_id, **kwargs)
    return run


# ---------------------------------------------------------------------------------------------------------
# Network namespaces


class Host:
    def __init__(self, index: int, ns: str, addr: str) -> None:
        self.index = index
        self.ns = ns        # network namespace name
        self.addr = addr    # IPv4 address of eth0 inside it
        self.iface = "eth0"

    @property
    def prefix(self) -> list[str]:
        """Command prefix that runs a program inside this host."""
        return ["ip", "netns", "exec", self.ns]

    def __repr__(self) -> str:
        return f"Host({self.index}, {self.ns}, {self.addr})"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


_NS_PREFIX = "bftfs-t"


def _cleanup_stale_namespaces() -> None:
    """Deletes namespaces left by an earlier run of these fixtures whose owning pid is gone."""
    listing = _ip("netns", "list", check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.strip() else ""
        m = re.match(rf"^{_NS_PREFIX}(\d+)-", name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            _ip("netns", "del", name, check=False)


class NetnsLab:
    """`hosts` network namespaces, each with eth0 = 198.18.0.<i+1>/24 (RFC 2544 benchmarking range, never
    routed anywhere), all plugged by veth pairs into a bridge that lives in its own namespace, so the host's
    own network is never touched. Deleting the namespaces removes every link; processes still inside are
    killed first. Use as a context manager or through the `netns` fixture (which always tears down)."""

    SUBNET = "198.18.0"

    def __init__(self, hosts: int) -> None:
        assert 1 <= hosts <= 200
        tag = f"{_NS_PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        self.switch_ns = f"{tag}-sw"
        self.hosts = [Host(i, f"{tag}-h{i}", f"{self.SUBNET}.{i + 1}") for i in range(hosts)]
        self._created: list[str] = []
        self._blackholes: set[tuple[int, str]] = set()

    def __enter__(self) -> "NetnsLab":
        if os.geteuid() != 0:
            pytest.skip("network namespaces need root")
        if shutil.which("ip") is None:
            pytest.skip("iproute2 (ip) is not installed")
        _cleanup_stale_namespaces()
        try:
            self._create(self.switch_ns)
            _ip("-n", self.switch_ns, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch_ns, "link", "set", "br0", "up")
            for h in self.hosts:
                self._create(h.ns)
                _ip("link", "add", h.iface, "netns", h.ns, "type", "veth",
                    "peer", "name", f"p{h.index}", "netns", self.switch_ns)
                _ip("-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", h.iface)
                _ip("-n", h.ns, "link", "set", h.iface, "up")
                _ip("-n", self.switch_ns, "link", "set", f"p{h.index}", "master", "br0")
                _ip("-n", self.switch_ns, "link", "set", f"p{h.index}", "up")
        except BaseException:
            self.close()
            raise
        return self

    def _create(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._created.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Kills every process inside the namespaces and deletes them. Safe to call twice."""
        for ns in reversed(self._created):
            pids = _ip("netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", ns, check=False)
        self._created.clear()

    @property
    def addresses(self) -> list[str]:
        return [h.addr for h in self.hosts]

    def run(self, host: Host, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        """Runs a command inside `host` to completion (kwargs go to subprocess.run)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(host.prefix + [str(a) for a in argv], **kwargs)

    # ---- adversaries ----
    @contextlib.contextmanager
    def partition(self, *groups: Iterable[Host]) -> Iterator[None]:
        """Hosts in different groups cannot reach each other (both directions) while the block runs; hosts
        not named keep full connectivity. Implemented with blackhole routes on both sides."""
        sets = [list(g) for g in groups]
        added: list[tuple[Host, str]] = []
        try:
            for i, group in enumerate(sets):
                others = [h for j, g in enumerate(sets) if j != i for h in g]
                for a in group:
                    for b in others:
                        _ip("-n", a.ns, "route", "add", "blackhole", f"{b.addr}/32")
                        added.append((a, b.addr))
            yield
        finally:
            for a, addr in added:
                _ip("-n", a.ns, "route", "del", "blackhole", f"{addr}/32", check=False)

    @contextlib.contextmanager
    def isolate(self, host: Host) -> Iterator[None]:
        """The host's link is down while the block runs (it can reach no one, no one reaches it)."""
        _ip("-n", host.ns, "link", "set", host.iface, "down")
        try:
            yield
        finally:
            _ip("-n", host.ns, "link", "set", host.iface, "up", check=False)

    @contextlib.contextmanager
    def delay(self, host: Host, delay_ms: float, jitter_ms: float = 0.0, loss_pct: float = 0.0) -> Iterator[None]:
        """Adds latency (and loss) to everything `host` sends, with tc netem. Skips the test if this kernel
        has no netem qdisc."""
        args = ["tc", "qdisc", "replace", "dev", host.iface, "root", "netem", "delay", f"{delay_ms}ms"]
        if jitter_ms:
            args.append(f"{jitter_ms}ms")
        if loss_pct:
            args += ["loss", f"{loss_pct}%"]
        done = self.run(host, args)
        if done.returncode != 0:
            if "unknown" in done.stderr.lower():
                pytest.skip(f"tc netem is not available on this kernel: {done.stderr.strip()}")
            raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
        try:
            yield
        finally:
            self.run(host, ["tc", "qdisc", "del", "dev", host.iface, "root"])


@pytest.fixture
def netns() -> Iterator[Callable[[int], NetnsLab]]:
    """Factory: netns(hosts) -> a set-up NetnsLab. Every lab is torn down after the test, after the clusters
    (the `cluster` fixture depends on this one, so its processes are stopped first)."""
    labs: list[NetnsLab] = []

    def make(hosts: int) -> NetnsLab:
        lab = NetnsLab(hosts)
        labs.append(lab)
        return lab.__enter__()

    yield make
    for lab in reversed(labs):
        lab.close()


# ---------------------------------------------------------------------------------------------------------
# Clusters


class Cluster:
    """A bftfs cluster of n = 3f+1 replicas made by `bftfs keygen` in `root`:
    root/cluster.conf, root/keys/, root/replica-<i>/ (data, status.json), root/replica-<i>.log."""

    def __init__(self, bftfs: Path, root: Path, *, f: int = 1, clients: int = 16, service: str = "counter",
                 hosts: Sequence[str] = ("127.0.0.1",), base_port: int,
                 replica_prefix: Callable[[int], Sequence[str]] | None = None,
                 replica_args: Sequence[str] = ()) -> None:
        self.bftfs = bftfs
        self.root = root
        self.f = f
        self.n = 3 * f + 1
        self.clients_requested = clients
        self.service = service
        self.hosts = list(hosts)
        self.base_port = base_port
        self.replica_prefix = replica_prefix or (lambda i: ())
        self.replica_args = list(replica_args)
        self.replicas: list[Daemon] = []
        self.norep: Daemon | None = None
        self.client_ids: list[int] = []
        self.addresses: list[tuple[str, int]] = []
        self._expected_errors: list[re.Pattern] = []

    @property
    def config(self) -> Path:
        return self.root / "cluster.conf"

    def keygen(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        argv = [str(self.bftfs), "keygen", "--dir", str(self.root), "--f", str(self.f),
                "--clients", str(self.clients_requested), "--hosts", ",".join(self.hosts),
                "--base-port", str(self.base_port)]
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr}"
        self._read_config()
        self.replicas = [
            Daemon(f"replica-{i}",
                   [self.bftfs, "replica", "--config", self.config, "--id", i, "--data", self.root / f"replica-{i}",
                    "--service", self.service, *self.replica_args],
                   self.root / f"replica-{i}.log", self.root / f"replica-{i}", prefix=self.replica_prefix(i))
            for i in range(self.n)
        ]

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
        assert sorted(replicas) == list(range(self.n)), f"{self.config}: expected replicas 0..{self.n - 1}"
        self.addresses = [replicas[i] for i in range(self.n)]
        self.client_ids = clients

    # ---- lifecycle ----
    def start(self, ids: Iterable[int] | None = None, wait: bool = True,
              timeout_s: float = READY_TIMEOUT_S) -> None:
        ids = list(range(self.n)) if ids is None else list(ids)
        for i in ids:
            self.replicas[i].start()
        if wait:
            self.wait_ready(ids, timeout_s)

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

    def status(self, i: int) -> dict | None:
        return self.replicas[i].status()

    @property
    def norep_address(self) -> str:
        """Where start_norep() listens: the first host, on the port after the replicas' (allocated with them),
        so NO-REP can run while the replicas do."""
        host = self.hosts[0]
        return f"[{host}]:{self.base_port + self.n}" if ":" in host else f"{host}:{self.base_port + self.n}"

    def start_norep(self, service: str | None = None, extra: Sequence[str] = (),
                    prefix: Sequence[str] = (), wait: bool = True) -> Daemon:
        """Starts the unreplicated server (`bftfs norep`) with this cluster's configuration, listening on
        norep_address; counter(norep=True) talks to it there."""
        assert self.norep is None or not self.norep.alive(), "NO-REP is already running"
        self.norep = Daemon("norep", [self.bftfs, "norep", "--config", self.config, "--data", self.root / "norep",
                                      "--service", service or self.service, "--listen", self.norep_address,
                                      *extra],
                            self.root / "norep.log", self.root / "norep", prefix=prefix)
        self.norep.start()
        if wait:
            self.norep.wait_ready()
        return self.norep

    def counter(self, client_id: int | None = None, **kwargs) -> dict:
        """`bftfs counter --json` against this cluster (kwargs as in counter()); the first client by default."""
        cid = self.client_ids[0] if client_id is None else client_id
        if kwargs.get("norep"):
            kwargs.setdefault("server", self.norep_address)
        return counter(self.bftfs, self.config, cid, **kwargs)

    # ---- logs ----
    def expect_error(self, pattern: str) -> None:
        """ERROR lines matching `pattern` (a regex) do not fail the test."""
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

    def close(self) -> None:
        """Stops every process (always), then raises AssertionError on unexpected ERROR lines."""
        for d in self.daemons():
            d.stop()
        errors = self.unexpected_errors()
        if errors:
            raise AssertionError("unexpected ERROR lines in daemon logs:\n" + "\n".join(errors[:50]))


@pytest.fixture
def cluster(bftfs_bin: Path, tmp_path: Path, ports: PortAllocator, netns) -> Iterator[Callable[..., Cluster]]:
    """Factory: cluster(f=1, service="counter", clients=16, lab=None, start=True, replica_args=()) -> Cluster.

    Runs `bftfs keygen` into tmp_path/cluster<k> on a fresh port range and (unless start=False) starts all
    n = 3f+1 replicas and waits until each is ready. With lab=<NetnsLab>, replica i runs in lab.hosts[i % len]
    and listens on that host's address. Teardown stops every process even if the test failed, then fails the
    test on unexpected ERROR log lines."""
    made: list[Cluster] = []

    def make(f: int = 1, service: str = "counter", clients: int = 16, lab: NetnsLab | None = None,
             start: bool = True, replica_args: Sequence[str] = (),
             ready_timeout_s: float = READY_TIMEOUT_S) -> Cluster:
        n = 3 * f + 1
        if lab is not None:
            hosts = lab.addresses
            prefix = (lambda i: lab.hosts[i % len(lab.hosts)].prefix)
        else:
            hosts, prefix = ["127.0.0.1"], None
        c = Cluster(bftfs_bin, tmp_path / f"cluster{len(made)}", f=f, clients=clients, service=service,
                    hosts=hosts, base_port=ports.alloc(n + 1), replica_prefix=prefix, replica_args=replica_args)
        made.append(c)
        c.keygen()
        if start:
            c.start(timeout_s=ready_timeout_s)
        return c

    yield make
    problems = []
    for c in reversed(made):
        try:
            c.close()
        except AssertionError as e:
            problems.append(f"{c.root}: {e}")
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
