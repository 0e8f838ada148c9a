#!/usr/bin/env python3
"""Recovery of the file service's disk store (docs/FILESERVICE.md §6) on a 4-replica cluster (f = 1, loopback).

Replicas run `bftfs replica --service fs --shim` (state in <data>/fs: values in a data file, checksums in a
separate index journal). The client is build/tests/fs_load (PBFT client runtime submitting file-service
compounds; not the FUSE mount). Two scenarios on one cluster:

  wipe     preload PRELOAD_FILES files of 64 KiB; start a write load (4 KiB files, closed loop, one client);
           SIGKILL replica 2, delete its data directory, start it again. Measured from that start:
             transfer_s   until its status shows a completed state transfer
             rejoin_s     until it has executed up to what replica 0 had committed when the transfer completed
             fetched_bytes  its state_transfer_bytes (partition bytes and partition-tree nodes accepted)
           then, with replica 1 stopped (so replica 2 is needed for every quorum), every preloaded file is read
           back (read-only requests) and compared.
  corrupt  flip one byte inside every copy of a preloaded file's second 4 KiB in replica 3's data file; read
           every preloaded file back (every read must return the written bytes: replica 3 detects the checksum
           mismatch and stays silent); wait for replica 3 to report damage; run the write load until it has
           repaired by state transfer. Measured from the start of the read-back: detect_s (its status shows the
           damage; polled once the read-back finished, so an upper bound), repair_s (state transfer completed),
           repair_fetched_bytes (the damaged partition, every partition changed since its newest checkpoint,
           and the tree nodes above them).
           Then with replica 1 stopped every file is read back again (replica 3 counts in the quorum).
  crash_all  SIGKILL every replica during a write load, start them all again on their data directories: every
           preloaded file (acknowledged before the crash) is read back. Measured: restart_s (until a request
           completes again).

Output: bench-results/fs-recovery.json. Environment: BUILD (or BFTFS_BUILD), QUICK=1 (fewer, smaller files),
BENCH_KEEP=1 keeps the scratch directory. Progress on stderr; every process started is stopped on exit.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the harness package

import reporting  # noqa: E402
from harness.binaries import bftfs_binary, build_dir  # noqa: E402
from harness.cluster import Cluster  # noqa: E402
from harness.log import progress  # noqa: E402
from harness.procs import exit_cleanly_on_sigterm  # noqa: E402
from harness.waiting import wait_until  # noqa: E402

MASK = (1 << 64) - 1
PRELOAD_PREFIX = "pre"
LOAD_FILE_BYTES = 4096


def plan() -> dict:
    if reporting.quick_mode():
        return {"preload_files": 60, "preload_bytes": 65536}
    return {"preload_files": 400, "preload_bytes": 65536}


def pattern(prefix: str, i: int, size: int) -> bytes:
    """The bytes fs_load writes for file i of `prefix` (tests/tools/fs_load.cc: the same xorshift64 stream)."""
    x = 0x9E3779B97F4A7C15 ^ (i + 1)
    for c in prefix.encode():
        x = ((x ^ c) * 0x100000001B3) & MASK
    if x == 0:
        x = 1
    out = bytearray(size)
    for k in range(size):
        x ^= (x << 13) & MASK
        x ^= x >> 7
        x ^= (x << 17) & MASK
        out[k] = x & 0xFF
    return bytes(out)


class FsBench:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.fs_load = build_dir() / "tests" / "fs_load"
        if not self.fs_load.exists():
            raise RuntimeError(f"{self.fs_load} is missing: run make first")

    def start_replica(self, i: int) -> None:
        """Starts replica i (not waiting for it), killing an earlier incarnation."""
        self.cluster.start_replicas(ids=[i], wait=False)

    def status(self, i: int) -> dict:
        return self.cluster.replicas[i].status() or {}

    def stat(self, i: int, key: str) -> int:
        return int(self.status(i).get("stats", {}).get(key, 0))

    def load_argv(self, mode: str, prefix: str, files: int | None, file_bytes: int,
                  duration_s: float | None = None) -> list[str]:
        argv = [str(self.fs_load), "--config", str(self.cluster.config), "--id", str(self.cluster.take_clients(1)),
                "--mode", mode, "--prefix", prefix, "--file-bytes", str(file_bytes), "--timeout-s", "60"]
        if files is not None:
            argv += ["--files", str(files)]
        if duration_s is not None:
            argv += ["--duration-s", str(duration_s)]
        return argv

    def run_load(self, *args, **kwargs) -> str:
        argv = self.load_argv(*args, **kwargs)
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        return done.stdout.strip()

    def background_load(self, prefix: str) -> subprocess.Popen:
        return subprocess.Popen(self.load_argv("write", prefix, None, LOAD_FILE_BYTES, duration_s=3600),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)


def stop_process(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def corrupt_copies(path: Path, needle: bytes) -> int:
    data = path.read_bytes()
    copies = 0
    with open(path, "r+b") as f:
        pos = data.find(needle)
        while pos >= 0:
            offset = pos + len(needle) // 2
            f.seek(offset)
            f.write(bytes([data[offset] ^ 0x20]))
            copies += 1
            pos = data.find(needle, pos + len(needle))
    return copies


def scenario_wipe(b: FsBench, p: dict) -> dict:
    c = b.cluster
    load = b.background_load("wload")
    try:
        time.sleep(1.0)
        progress("wipe: SIGKILL replica 2, delete its data directory, start it again")
        c.replicas[2].kill()
        shutil.rmtree(c.replica_data(2))
        t0 = time.monotonic()
        b.start_replica(2)
        wait_until(lambda: b.stat(2, "state_transfers") >= 1, 120, "replica 2's state transfer")
        t_transfer = time.monotonic() - t0
        target = int(b.status(0).get("last_committed", 0))
        wait_until(lambda: int(b.status(2).get("last_executed", 0)) >= target, 120, "replica 2 to catch up")
        t_rejoin = time.monotonic() - t0
        fetched = b.stat(2, "state_transfer_bytes")
        progress(f"wipe: transfer {t_transfer:.2f}s, rejoined {t_rejoin:.2f}s, fetched {fetched} bytes")
    finally:
        stop_process(load)
    data_bytes_r0 = (c.replica_data(0) / "fs" / "data").stat().st_size
    progress("wipe: replica 1 down; every preloaded file read back through a quorum that needs replica 2")
    c.replicas[1].stop()
    verify = b.run_load("verify", PRELOAD_PREFIX, p["preload_files"], p["preload_bytes"])
    b.start_replica(1)
    c.wait_ready([1])
    return {"transfer_s": round(t_transfer, 3), "rejoin_s": round(t_rejoin, 3), "fetched_bytes": fetched,
            "preloaded_bytes": p["preload_files"] * p["preload_bytes"], "replica0_data_file_bytes": data_bytes_r0,
            "verify_after": verify}


def scenario_corrupt(b: FsBench, p: dict) -> dict:
    c = b.cluster
    victim = 5
    needle = pattern(PRELOAD_PREFIX, victim, p["preload_bytes"])[4096:8192]
    copies = corrupt_copies(c.replica_data(3) / "fs" / "data", needle)
    if copies == 0:
        raise RuntimeError("the victim's bytes are not in replica 3's data file")
    progress(f"corrupt: flipped a byte in {copies} copies of file {victim}'s block on replica 3; reading all back")
    damaged_before = b.stat(3, "service_damaged")
    transfers_before = b.stat(3, "state_transfers")
    bytes_before = b.stat(3, "state_transfer_bytes")
    t0 = time.monotonic()
    verify = b.run_load("verify", PRELOAD_PREFIX, p["preload_files"], p["preload_bytes"])
    wait_until(lambda: b.stat(3, "service_damaged") > damaged_before, 60, "replica 3 to report damage")
    t_detect = time.monotonic() - t0
    load = b.background_load("cload")
    try:
        wait_until(lambda: b.stat(3, "state_transfers") > transfers_before, 120, "replica 3's repair")
        t_repair = time.monotonic() - t0
    finally:
        stop_process(load)
    fetched = b.stat(3, "state_transfer_bytes") - bytes_before
    progress(f"corrupt: detected {t_detect:.2f}s, repaired {t_repair:.2f}s after the first read, fetched {fetched} bytes")
    c.replicas[1].stop()
    verify_after = b.run_load("verify", PRELOAD_PREFIX, p["preload_files"], p["preload_bytes"])
    b.start_replica(1)
    c.wait_ready([1])
    return {"corrupted_copies": copies, "verify_while_corrupt": verify, "detect_s": round(t_detect, 3),
            "repair_s": round(t_repair, 3), "repair_fetched_bytes": fetched, "verify_after_repair": verify_after}


def scenario_crash_all(b: FsBench, p: dict) -> dict:
    c = b.cluster
    load = b.background_load("kload")
    try:
        time.sleep(1.5)
        progress("crash_all: SIGKILL every replica under load, then start them all again")
        for d in c.replicas:
            d.kill()
    finally:
        stop_process(load)
    t0 = time.monotonic()
    for i in range(c.n):
        b.start_replica(i)
    c.wait_ready()
    probe = b.run_load("write", "probe", 1, 10)
    t_restart = time.monotonic() - t0
    verify = b.run_load("verify", PRELOAD_PREFIX, p["preload_files"], p["preload_bytes"])
    progress(f"crash_all: serving again {t_restart:.2f}s after the restart; every preloaded file intact")
    return {"restart_s": round(t_restart, 3), "probe": probe, "verify_after": verify}


def main() -> int:
    exit_cleanly_on_sigterm()
    p = plan()
    with Cluster(bftfs_binary(), clients=64, service="fs", replica_args=["--shim"], log_level="info",
                 keep=reporting.keep_scratch()) as cluster:
        b = FsBench(cluster)
        for i in range(cluster.n):
            b.start_replica(i)
        cluster.wait_ready()
        try:
            progress(f"preload: {p['preload_files']} files of {p['preload_bytes']} bytes")
            preload = b.run_load("write", PRELOAD_PREFIX, p["preload_files"], p["preload_bytes"])
            wipe = scenario_wipe(b, p)
            corrupt = scenario_corrupt(b, p)
            crash_all = scenario_crash_all(b, p)
        finally:
            cluster.stop_replicas()
        result = reporting.run_metadata(benchmark="fs-recovery", plan=p, preload=preload, wipe=wipe, corrupt=corrupt,
                                     crash_all=crash_all)
        out = reporting.RESULTS_DIR / "fs-recovery.json"
        reporting.write_json(out, result)
        progress(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
