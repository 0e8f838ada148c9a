#!/usr/bin/env python3
"""One large sequential write through a relay mount on a durable 4-replica cluster (f = 1, loopback, the
replicas fdatasync their logs and share this machine's one disk): how fast, how much memory, and whether any
view change happens (tests/integration/POSIX_FINDINGS.md #14: 64 MiB once took 441 s with 32 view changes).

For each size (MiB; default 64, 256, 1024; QUICK=1: 64, 256) a fresh `bftfs cluster start --service fs` and
`bftfs mount --relay`, then `dd if=/dev/zero of=MNT/big bs=1M count=SIZE conv=fsync`. Measured: the wall time
of dd (write and fsync), MB/s, the largest resident set of any bftfs process sampled every 0.2 s, and per
replica the final view, view changes started and batches committed (status.json).

Output: bench-results/large-write.json. Environment: BUILD (or BFTFS_BUILD), QUICK=1, SIZES_MIB=64,256,...,
BENCH_KEEP=1 keeps the scratch directory. Every process started is stopped on exit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the harness package

import reporting  # noqa: E402
from harness.binaries import bftfs_binary  # noqa: E402
from harness.cli_cluster import CliCluster  # noqa: E402
from harness.log import progress  # noqa: E402
from harness.mount import Mount  # noqa: E402
from harness.procs import exit_cleanly_on_sigterm  # noqa: E402

RESULT = reporting.RESULTS_DIR / "large-write.json"
DD_TIMEOUT_S = 900


def bftfs_rss_kib() -> int:
    """The largest VmRSS among processes named bftfs."""
    best = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if "\nName:\tbftfs\n" not in "\n" + status:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                best = max(best, int(line.split()[1]))
    return best


def one_size(bftfs: Path, scratch: Path, mib: int) -> dict:
    cluster = CliCluster(bftfs, scratch / f"c{mib}", service="fs", ports=8)
    mount = Mount(bftfs, scratch / f"m{mib}", scratch / f"mount{mib}.log", ["--relay", cluster.relay_sock])
    try:
        cluster.start()
        mount.start()
        peak = [0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], bftfs_rss_kib())
                done.wait(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.monotonic()
        dd = subprocess.run(["dd", "if=/dev/zero", f"of={mount.mountpoint / 'big'}", "bs=1M", f"count={mib}",
                             "conv=fsync"], capture_output=True, text=True, timeout=DD_TIMEOUT_S)
        elapsed = time.monotonic() - t0
        done.set()
        sampler.join()
        if dd.returncode != 0:
            raise SystemExit(f"dd of {mib} MiB failed: {dd.stderr.strip()}")
        time.sleep(1.0)  # status.json is refreshed about every 500 ms
        replicas = []
        for i in range(4):
            st = cluster.status(i)
            replicas.append({"view": st["view"], "view_changes_started": st["stats"]["view_changes_started"],
                             "batches_committed": st["stats"]["batches_committed"],
                             "fetches_refused_repeat": st["stats"].get("fetches_refused_repeat", 0)})
        row = {"mib": mib, "seconds": round(elapsed, 3), "mb_per_s": round(mib * 1.048576 / elapsed, 2),
               "max_rss_mib": round(peak[0] / 1024, 1), "replicas": replicas,
               "view_changes": sum(r["view_changes_started"] for r in replicas)}
        progress(f"{mib} MiB: {elapsed:.1f} s, {row['mb_per_s']} MB/s, max RSS {row['max_rss_mib']} MiB, "
                 f"view changes {row['view_changes']}")
        return row
    finally:
        mount.stop()
        cluster.stop()


def main() -> None:
    exit_cleanly_on_sigterm()
    bftfs = bftfs_binary()
    default = "64,256" if reporting.quick_mode() else "64,256,1024"
    sizes = [int(s) for s in os.environ.get("SIZES_MIB", default).split(",") if s.strip()]
    load_start = reporting.load_average()
    scratch = Path(tempfile.mkdtemp(prefix="bftfs-largewrite-", dir="/var/tmp"))
    try:
        rows = [one_size(bftfs, scratch, mib) for mib in sizes]
    finally:
        if not reporting.keep_scratch():
            shutil.rmtree(scratch, ignore_errors=True)
    meta = reporting.run_metadata(loadavg_1_5_15_start=load_start,
                                  workload="dd bs=1M conv=fsync through bftfs mount --relay, "
                                           "durable 4-replica cluster on one machine")
    reporting.write_json(RESULT, {"meta": meta, "runs": rows})
    progress(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
