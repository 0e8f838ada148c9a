"""Network namespaces for multi-host topologies on one machine, with adversaries (partition, isolation, delay)
as context managers. Needs root and iproute2; without them NetnsLab raises Unavailable (tests skip)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Iterable, Iterator, Sequence


class Unavailable(Exception):
    """This machine cannot provide what was asked (no root, no iproute2, no netem): the message says what."""


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
    """Deletes namespaces left by an earlier run whose owning pid is gone."""
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
    killed first. Use as a context manager (close() always runs)."""

    SUBNET = "198.18.0"

    def __init__(self, hosts: int) -> None:
        assert 1 <= hosts <= 200
        tag = f"{_NS_PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        self.switch_ns = f"{tag}-sw"
        self.hosts = [Host(i, f"{tag}-h{i}", f"{self.SUBNET}.{i + 1}") for i in range(hosts)]
        self._created: list[str] = []

    def __enter__(self) -> "NetnsLab":
        if os.geteuid() != 0:
            raise Unavailable("network namespaces need root")
        if shutil.which("ip") is None:
            raise Unavailable("iproute2 (ip) is not installed")
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
        """Adds latency (and loss) to everything `host` sends, with tc netem. Unavailable if this kernel has no
        netem qdisc."""
        args = ["tc", "qdisc", "replace", "dev", host.iface, "root", "netem", "delay", f"{delay_ms}ms"]
        if jitter_ms:
            args.append(f"{jitter_ms}ms")
        if loss_pct:
            args += ["loss", f"{loss_pct}%"]
        done = self.run(host, args)
        if done.returncode != 0:
            if "unknown" in done.stderr.lower():
                raise Unavailable(f"tc netem is not available on this kernel: {done.stderr.strip()}")
            raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
        try:
            yield
        finally:
            self.run(host, ["tc", "qdisc", "del", "dev", host.iface, "root"])
