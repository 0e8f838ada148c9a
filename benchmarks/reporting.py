"""What every benchmark writes besides its numbers: the run's metadata, result files written atomically, and
the QUICK / BENCH_KEEP switches. The processes a benchmark starts come from the harness package (harness/);
benchmarks are not tests: they measure and write JSON and plots under bench-results/, and assert nothing.

  quick_mode()       QUICK=1: shorter runs, same outputs
  keep_scratch()     BENCH_KEEP=1: keep the scratch directory (logs and data) after the run
  run_metadata()     date, git commit, machine load, CPU, for the `meta` object of every result file
  machine_busy_before()  how busy the machine was before the benchmark started
  write_json()       a result file, written atomically
  percentile()       nearest-rank percentile
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Sequence

from harness.binaries import REPO, build_dir

# Where results go: bench-results/, or $BENCH_RESULTS_DIR (benchmarks/ab_builds.py runs each build into its own).
RESULTS_DIR = Path(os.environ["BENCH_RESULTS_DIR"]) if os.environ.get("BENCH_RESULTS_DIR") else REPO / "bench-results"


def quick_mode() -> bool:
    """QUICK=1 in the environment (make bench QUICK=1): shorter runs, same outputs."""
    return os.environ.get("QUICK", "0") not in ("", "0", "false", "no")


def keep_scratch() -> bool:
    """BENCH_KEEP=1: keep the cluster's scratch directory (logs and data) after the run, and say where."""
    return os.environ.get("BENCH_KEEP") == "1"


# ---------------------------------------------------------------------------------------------------------
# Metadata


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


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of `values`; NaN for an empty list."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]
