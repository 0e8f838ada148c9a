"""Fixtures for bftfs integration tests: real `bftfs` processes on this machine, started and stopped through the
harness package (harness/, which the benchmarks use too). Tests are written in the other files here.

  build_dir, bftfs_bin   where the binaries are; a test is SKIPPED with the reason when `bftfs` is not built
                         (under `make test`, BFTFS_REQUIRE_BINARIES=1 turns that skip into a failure)
  ports                  per-test unique, currently unused port ranges (harness.ports)
  cluster                factory: `bftfs keygen` into tmp_path, start n = 3f+1 replicas, wait until ready
                         (harness.cluster.Cluster)
  netns                  factory: network namespaces joined by veth pairs and a bridge (multi-host topologies),
                         with partition / isolate adversaries as context managers (harness.netns.NetnsLab);
                         always cleaned up; skipped without root
  run_counter            run `bftfs counter ... --json` and return its parsed JSON

Conventions (house style): readiness is polled with a deadline, never slept for; teardown always kills what a
test started, even when the test failed; an ERROR line in a daemon's log fails the test unless the test said
it expects it (cluster.expect_error(regex)).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator, Sequence

import pytest

# Asserts in the harness and in the POSIX suite's shared module (test_posix_*.py load it with pytest_plugins)
# are rewritten too, so their failures show the values compared.
pytest.register_assert_rewrite("harness", "posix_suite")

from harness.binaries import build_dir as find_build_dir  # noqa: E402
from harness.binaries import built  # noqa: E402
from harness.cluster import Cluster  # noqa: E402
from harness.counter import counter  # noqa: E402
from harness.daemon import READY_TIMEOUT_S, kill_every_daemon  # noqa: E402
from harness.netns import NetnsLab, Unavailable  # noqa: E402
from harness.ports import PORTS, PortAllocator  # noqa: E402


def require_binary(relative: str) -> Path:
    """The path of a built binary, e.g. "cli/bftfs". Skips the test with the reason if it is not built,
    or fails it when BFTFS_REQUIRE_BINARIES=1 (make test): a missing binary there is a broken build."""
    path = built(relative)
    if path is not None:
        return path
    reason = f"{find_build_dir() / relative} is not built (run `make`; set BFTFS_BUILD for another build directory)"
    if os.environ.get("BFTFS_REQUIRE_BINARIES") == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def build_dir() -> Path:
    return find_build_dir()


@pytest.fixture(scope="session")
def bftfs_bin() -> Path:
    return require_binary("cli/bftfs")


@pytest.fixture
def ports() -> PortAllocator:
    return PORTS


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    kill_every_daemon()


@pytest.fixture
def run_counter(bftfs_bin: Path) -> Callable[..., dict]:
    """run_counter(config, client_id, requests=..., norep=..., clients=..., duration_s=..., prefix=...)."""
    def run(config: Path, client_id: int, **kwargs) -> dict:
        return counter(bftfs_bin, config, client_id, **kwargs)
    return run


@pytest.fixture
def netns() -> Iterator[Callable[[int], NetnsLab]]:
    """Factory: netns(hosts) -> a set-up NetnsLab (skips the test without root or iproute2). Every lab is torn
    down after the test, after the clusters (the `cluster` fixture depends on this one, so its processes are
    stopped first)."""
    labs: list[NetnsLab] = []

    def make(hosts: int) -> NetnsLab:
        lab = NetnsLab(hosts)
        labs.append(lab)
        try:
            return lab.__enter__()
        except Unavailable as e:
            pytest.skip(str(e))

    yield make
    for lab in reversed(labs):
        lab.close()


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
        c.close()
        errors = c.unexpected_errors()
        if errors:
            problems.append(f"{c.root}: unexpected ERROR lines in daemon logs:\n" + "\n".join(errors[:50]))
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
