"""Direct I/O on a bftfs mount is coherent with the page cache (docs/CLIENT.md "Direct I/O").

The same seeded sequence of operations -- O_DIRECT writes and reads through pwrite/pread, Linux AIO and io_uring,
buffered writes and reads, stores to and loads from a shared mapping, fsync, close/open, and a descriptor
switched to O_DIRECT by fcntl -- runs on a local directory and on the mount while other processes keep reading
the file through the page cache and a mapping. Every read of the sequence (most of them read back a range just
written through another path) and the final bytes must be the local file system's, byte for byte: on one
mount (`--local` and a relay mount of a 4-replica cluster), and on two mounts of one cluster, each step on one
of them, with close and open between.

The operations run in tests/integration/directio_io.c, built here with gcc (the asynchronous kinds use raw
system calls: no library beyond libc).
"""

from __future__ import annotations

import json
import mmap
import multiprocessing
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from harness.mount import Mount
from harness.mount import relay_mounts as mounts_of
from harness.relay import Relay, short_dir
from harness.waiting import wait_until

pytestmark = pytest.mark.fuse

HERE = Path(__file__).resolve().parent
FILE_BYTES = 1 << 20
PAGE = 4096
FILL = b"\xaa"
DIRECT_KINDS = ("dw", "aw", "uw", "dr", "ar", "ur")
BUFFERED_KINDS = ("bw", "br", "mw", "mr")


@pytest.fixture(scope="session")
def directio_tool(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("directio") / "directio_io"
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(out), str(HERE / "directio_io.c")],
                   check=True)
    return out


def random_ops(rng: random.Random, count: int) -> list[str]:
    """A sequence for directio_io: `count` reads and writes of every kind, each write followed by a read of
    its range through another path, with fsync, close/open and an fcntl(O_DIRECT) switch now and then."""
    ops = [f"mr:0:{FILE_BYTES}"]  # maps the whole file once: later stores and loads use that mapping
    for _ in range(count):
        kind = rng.choice(DIRECT_KINDS + BUFFERED_KINDS)
        if kind in DIRECT_KINDS:
            off = rng.randrange(FILE_BYTES // PAGE) * PAGE
            length = min(rng.randrange(1, 48) * PAGE, FILE_BYTES - off)
        else:
            off = rng.randrange(FILE_BYTES - 1)
            length = rng.randrange(1, min(100_000, FILE_BYTES - off) + 1)
        if kind.endswith("w"):
            ops.append(f"{kind}:{off}:{length}:{rng.randrange(256):02x}")
            back = rng.choice(("br", "mr", "dr", "ar", "ur") if off % PAGE == 0 and length % PAGE == 0
                              else ("br", "mr"))
            ops.append(f"{back}:{off}:{length}")
        else:
            ops.append(f"{kind}:{off}:{length}")
        r = rng.random()
        if r < 0.05:
            ops.append("sync")
        elif r < 0.10:
            ops += ["reopen", f"mr:0:{FILE_BYTES}"]
        elif r < 0.13:
            ops.append("setfl")
    return ops


def run_ops(tool: Path, path: Path, ops: list[str]) -> list[str]:
    r = subprocess.run([str(tool), str(path), *ops], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def page_cache_reader(path: str, stop) -> None:
    """Keeps the file's pages cached and mapped: whole-file buffered reads and loads through a mapping."""
    fd = os.open(path, os.O_RDONLY)
    try:
        m = mmap.mmap(fd, FILE_BYTES, prot=mmap.PROT_READ)
        while not stop.is_set():
            os.pread(fd, FILE_BYTES, 0)
            sum(m[i] for i in range(0, FILE_BYTES, PAGE))
        m.close()
    finally:
        os.close(fd)


class Readers:
    """Processes reading `paths` through the page cache until the context ends."""

    def __init__(self, paths: list[Path], per_path: int = 2) -> None:
        self.stop = multiprocessing.Event()
        self.procs = [multiprocessing.Process(target=page_cache_reader, args=(str(p), self.stop), daemon=True)
                      for p in paths for _ in range(per_path)]

    def __enter__(self) -> "Readers":
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(timeout=30)
            assert p.exitcode == 0, "a page-cache reader failed"


def first_difference(want: list[str], got: list[str], ops: list[str]) -> str:
    for i, (w, g) in enumerate(zip(want, got)):
        if w != g:
            return f"read #{i}: local file system {w!r}, mount {g!r} (sequence: {' '.join(ops)})"
    return f"{len(want)} lines locally, {len(got)} on the mount"


def compare_one_mount(tool: Path, mnt: Path, local: Path, seed: int, count: int) -> None:
    ops = random_ops(random.Random(seed), count)
    results = {}
    for root in (local, mnt):
        path = root / f"direct-{seed}"
        path.write_bytes(FILL * FILE_BYTES)
        with Readers([path]):
            results[root] = run_ops(tool, path, ops)
    assert results[mnt] == results[local], first_difference(results[local], results[mnt], ops)
    assert (mnt / f"direct-{seed}").read_bytes() == (local / f"direct-{seed}").read_bytes()


def counters(status: Path) -> dict:
    return json.loads(status.read_text())


# ---------------------------------------------------------------------------------------------------------
# One mount


@pytest.fixture
def local_mount(bftfs_bin, tmp_path):
    top = Path(tempfile.mkdtemp(prefix="bftfs-mnt-"))
    status = tmp_path / "status.json"
    m = Mount(bftfs_bin, top / "mnt", tmp_path / "mount.log", ["--local", str(tmp_path / "state")],
              ["--status", str(status)])
    m.start()
    try:
        yield m, status
    finally:
        rc = m.stop()
        shutil.rmtree(top, ignore_errors=True)
        assert rc == 0, f"bftfs mount exited with {rc}:\n{m.log_text()}"
        assert not m.error_lines(), m.log_text()


STALE_CHUNK = 16 << 10


def check_no_stale_pages(tool: Path, mnt: Path, local: Path) -> int:
    """The defect as found: 0x55 written over 0xaa with Linux AIO (and io_uring, and pwrite; through a
    descriptor opened with O_DIRECT and one switched by fcntl) while other processes read the file through
    the page cache; reading each range back through the page cache and a mapping must give the new bytes,
    every time. Returns the number of direct writes done on the mount."""
    writes = 0
    for kind in ("aw", "uw", "dw"):
        ops = []
        for i in range(FILE_BYTES // STALE_CHUNK):
            off = i * STALE_CHUNK
            ops += [f"{kind}:{off}:{STALE_CHUNK}:{'55' if i % 2 == 0 else '66'}", f"br:{off}:{STALE_CHUNK}",
                    f"mr:{off}:{STALE_CHUNK}"]
        for setfl in ([], ["setfl"]):
            want = run_ops(tool, _filled(local / kind), setfl + ops)
            path = _filled(mnt / kind)
            with Readers([path], per_path=3):
                got = run_ops(tool, path, setfl + ops)
            assert got == want, first_difference(want, got, setfl + ops)
            writes += FILE_BYTES // STALE_CHUNK
    return writes


def test_async_direct_writes_leave_no_stale_pages_for_page_cache_readers(directio_tool, local_mount, tmp_path):
    m, status = local_mount
    local = tmp_path / "local"
    local.mkdir()
    writes = sum(check_no_stale_pages(directio_tool, m.mountpoint, local) for _ in range(2))

    def counted() -> dict | None:
        c = counters(status) if status.exists() else {}
        return c if c.get("direct_writes", 0) >= writes else None

    # Every one of them took the direct path, also those through the descriptor fcntl switched.
    c = wait_until(counted, 30, "the status file to count every direct write")
    assert c["direct_invalidations"] >= c["direct_writes"]


def _filled(path: Path) -> Path:
    path.write_bytes(FILL * FILE_BYTES)
    return path


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_mixed_direct_buffered_and_mapped_io_on_a_local_mount_matches_a_local_file_system(
        directio_tool, local_mount, tmp_path, seed):
    m, _ = local_mount
    local = tmp_path / "local"
    local.mkdir()
    compare_one_mount(directio_tool, m.mountpoint, local, seed, 150)


def test_an_o_direct_descriptor_refuses_shared_mappings(local_mount):
    """The one difference from a local file system, documented: the kernel answers ENODEV to a shared
    mapping of a descriptor opened with O_DIRECT (FOPEN_DIRECT_IO without FUSE_DIRECT_IO_ALLOW_MMAP, which
    libfuse 3.14 cannot ask for). Private mappings and other descriptors' mappings work."""
    m, _ = local_mount
    path = _filled(m.mountpoint / "f")
    fd = os.open(path, os.O_RDWR | os.O_DIRECT)
    try:
        with pytest.raises(OSError) as e:
            mmap.mmap(fd, PAGE)
        assert e.value.errno == 19  # ENODEV
        private = mmap.mmap(fd, PAGE, flags=mmap.MAP_PRIVATE)
        assert private[:4] == FILL * 4
        private.close()
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------------------
# A 4-replica cluster: one mount, and two mounts with close/open between


@pytest.fixture
def relay_mounts(cluster, bftfs_bin, tmp_path):
    c = cluster(service="fs", replica_args=["--shim", "--no-fsync"])
    relay = Relay(bftfs_bin, c, short_dir(tmp_path)).start()
    try:
        with mounts_of(bftfs_bin, relay.sock, tmp_path) as (a, b):
            yield a, b
    finally:
        relay.daemon.stop()
    assert not relay.errors(), "\n".join(relay.errors())


def test_mixed_direct_buffered_and_mapped_io_on_two_relay_mounts_match_a_local_file_system(
        directio_tool, relay_mounts, tmp_path):
    """Steps alternate between mounts A and B of one cluster (each step a process that opens the file and
    closes it at the end: close-to-open between them), while readers on both mounts keep the file's pages
    cached; B's cached pages of what A wrote directly must be gone at B's next open, and the other way round.
    Before that, the stale-page check of the defect as found, and then a longer mixed sequence, on mount A
    alone."""
    a, b = relay_mounts
    local = tmp_path / "local"
    local.mkdir()
    check_no_stale_pages(directio_tool, a.mountpoint, local)
    rng = random.Random(19)
    steps = [random_ops(rng, 60)] + [random_ops(rng, 12) for _ in range(5)]
    want = []
    path_local = _filled(local / "f")
    for ops in steps:
        want.append(run_ops(directio_tool, path_local, ops))
    _filled(a.mountpoint / "f")
    paths = [a.mountpoint / "f", b.mountpoint / "f"]
    with Readers(paths, per_path=1):
        for i, ops in enumerate(steps):
            got = run_ops(directio_tool, paths[i % 2], ops)
            assert got == want[i], f"step {i} on mount {'ab'[i % 2]}: " + first_difference(want[i], got, ops)
    final = path_local.read_bytes()
    assert paths[0].read_bytes() == final
    assert paths[1].read_bytes() == final
