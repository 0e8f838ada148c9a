#!/usr/bin/env python3
"""What one durable log write costs on this machine's disk: the floor under every durable reply.

A bftfs replica makes its PreparedRecord durable before it sends the COMMIT and the tentative reply a client
waits for (protocol/effects.h), and the benchmark clusters run all four replicas (n = 3f+1, f = 1) on one disk.
So a PBFT request's latency can never be below the time of one durable write while the other replicas make
theirs at the same moment. This benchmark measures exactly that write, with the system calls the log uses
(storage/wal.cc: an overwrite of preallocated, zero-filled blocks through a descriptor opened with
O_DIRECT | O_DSYNC, Wal::write_direct; where a file system refuses O_DIRECT, pwritev2(RWF_DSYNC) through the
page cache, Wal::write_durable), in the directory where the benchmarks put their data directories:

  writers_1   one process writing and syncing 4 KiB records one after the other (a lone replica, or the
              NO-REP server with --durable), O_DIRECT | O_DSYNC
  writers_4   four processes doing the same at once, each on its own file (the four replicas of a cluster)
  rwf_dsync_writers_1, rwf_dsync_writers_4   the same with pwritev2(RWF_DSYNC) through the page cache (what
              the log used before O_DIRECT, and still uses on tmpfs)

Besides latency, each reports the CPU time a writer was charged per write (user + system of the writing
process; on a virtual disk most of a durable write's cost is the kernel's).

For each: latency p50/p99/mean in microseconds and the total number of durable writes per second. When
bench-results/counter.json exists, `floor` relates the writers_4 p50 to the NO-REP latencies measured there:
the least PBFT/NO-REP latency ratio this disk allows, before any message is sent.

Writes bench-results/fsync-floor.json. QUICK=1 takes fewer samples. This is a benchmark: nothing is asserted.
"""

from __future__ import annotations

import json
import mmap
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the harness package

import reporting  # noqa: E402
from harness.log import progress  # noqa: E402
from harness.procs import exit_cleanly_on_sigterm  # noqa: E402

RECORD_BYTES = 4096
FILE_BYTES = 16 << 20  # preallocated and zero-filled, like a log segment


def prepare_file(path: Path) -> None:
    zeros = b"\0" * (1 << 20)
    with open(path, "wb") as f:
        for _ in range(FILE_BYTES // len(zeros)):
            f.write(zeros)
        f.flush()
        os.fsync(f.fileno())


def writer(path: str, samples: int, start_at: float, direct: bool, out) -> None:
    fd = os.open(path, os.O_RDWR | (os.O_DIRECT | os.O_DSYNC if direct else 0))
    try:
        record = mmap.mmap(-1, RECORD_BYTES)  # page-aligned, as O_DIRECT needs
        latencies = []
        while time.monotonic() < start_at:  # every writer starts at once
            time.sleep(0.0005)
        began = time.monotonic()
        cpu0 = time.process_time()
        for i in range(samples):
            record[0] = i & 0xFF
            offset = (i * RECORD_BYTES) % FILE_BYTES
            t0 = time.perf_counter_ns()
            os.pwritev(fd, [record], offset, 0 if direct else os.RWF_DSYNC)
            latencies.append((time.perf_counter_ns() - t0) / 1000.0)
        out.put({"latencies_us": latencies, "elapsed_s": time.monotonic() - began,
                 "cpu_us_per_write": (time.process_time() - cpu0) * 1e6 / samples})
    finally:
        os.close(fd)


def run(directory: Path, writers: int, samples: int, direct: bool) -> dict:
    paths = [directory / f"log{i}" for i in range(writers)]
    for p in paths:
        prepare_file(p)
    queue: multiprocessing.Queue = multiprocessing.Queue()
    start_at = time.monotonic() + 0.3
    procs = [multiprocessing.Process(target=writer, args=(str(p), samples, start_at, direct, queue)) for p in paths]
    for p in procs:
        p.start()
    results = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    lat = sorted(x for r in results for x in r["latencies_us"])
    elapsed = max(r["elapsed_s"] for r in results)
    return {
        "writers": writers,
        "method": "O_DIRECT|O_DSYNC" if direct else "pwritev2(RWF_DSYNC)",
        "samples_per_writer": samples,
        "record_bytes": RECORD_BYTES,
        "latency_us_p50": round(reporting.percentile(lat, 0.50), 1),
        "latency_us_p99": round(reporting.percentile(lat, 0.99), 1),
        "latency_us_mean": round(statistics.fmean(lat), 1),
        "durable_writes_per_s": round(len(lat) / elapsed, 1),
        "cpu_us_per_write": round(statistics.median(r["cpu_us_per_write"] for r in results), 1),
    }


def main() -> int:
    exit_cleanly_on_sigterm()
    samples = 300 if reporting.quick_mode() else 2000
    scratch = Path(tempfile.mkdtemp(prefix="bftfs-fsync-"))
    try:
        result: dict = {}
        for direct in (True, False):
            for writers in (1, 4):
                key = f"writers_{writers}" if direct else f"rwf_dsync_writers_{writers}"
                progress(f"fsync floor: {key}, {samples} durable 4 KiB writes each")
                result[key] = run(scratch, writers, samples, direct)
                progress(f"  {json.dumps(result[key])}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    counter = reporting.RESULTS_DIR / "counter.json"
    if counter.exists():
        measured = json.loads(counter.read_text())
        floor: dict = {"pbft_durable_write_us_p50": result["writers_4"]["latency_us_p50"],
                       "counter_json_commit": measured.get("meta", {}).get("git_commit")}
        for system in ("norep", "norep_durable"):
            p50 = measured.get(system, {}).get("latency_us_p50")
            if p50:
                floor[f"{system}_latency_us_p50"] = p50
                floor[f"least_pbft_over_{system}_latency_p50"] = round(result["writers_4"]["latency_us_p50"] / p50, 2)
        result["floor"] = floor
    result["meta"] = reporting.run_metadata(scratch_dir=str(scratch.parent), quick=reporting.quick_mode(),
                                         syscall="writers_*: pwritev2 through an O_DIRECT|O_DSYNC descriptor (the "
                                                 "log's method); rwf_dsync_*: pwritev2(RWF_DSYNC) through the page "
                                                 "cache; overwrites of a preallocated zero-filled file")
    out = reporting.RESULTS_DIR / "fsync-floor.json"
    reporting.write_json(out, result)
    progress(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
