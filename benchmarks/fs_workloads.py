"""What bench_fs.py times: the PBFT-CS paper's NFS micro-benchmarks (grep, write, create100) and the Andrew
phases (the workload itself is harness/andrew.py), each checked after it ran (a benchmark that measures a
broken file system is worthless)."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fs_systems import BenchError, System
from harness.andrew import PHASE_TITLES, PHASES, STEP_TIMEOUT_S, Andrew, SourceTree, load_tree, write_file, write_tree
from harness.log import progress

GREP_TARGET_BYTES = 9_100_000  # "about 9.1 MB" of headers (PBFT-CS section 6.2)
GREP_PATTERN = "struct"
GREP_ROOTS = ("linux", "asm-generic", "x86_64-linux-gnu/asm", ".")  # under /usr/include, in this order
WRITE_BYTES = 3_900_000
WRITE_CHUNK = 8192
CREATE_FILES = 100
CREATE_BYTES = 4096
REQUEST_KEYS = ("sent_read_only", "sent_ordered", "sent_compound", "lookups_enoent")


# ---------------------------------------------------------------------------------------------------------
# The grep corpus


def grep_corpus() -> SourceTree:
    """~9.1 MB of C headers from /usr/include: the Linux UAPI headers first (the paper grepped the Linux
    headers), then other headers in sorted order, until the target size is reached."""
    base = Path("/usr/include")
    chosen: list[Path] = []
    seen: set[Path] = set()
    total = 0
    for top in GREP_ROOTS:
        start = (base / top).resolve()
        if not start.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames.sort()
            for name in sorted(filenames):
                path = Path(dirpath) / name
                if not name.endswith(".h") or path.is_symlink() or not path.is_file():
                    continue
                rel = path.relative_to(base)
                size = path.stat().st_size
                if rel in seen or total + size > GREP_TARGET_BYTES:  # a big header may not overshoot the target
                    continue
                seen.add(rel)
                chosen.append(rel)
                total += size
                if total >= GREP_TARGET_BYTES * 0.995:
                    return load_tree(base, chosen)
    raise BenchError(f"/usr/include has only {total} bytes of headers; {GREP_TARGET_BYTES} wanted "
                     "(install linux-libc-dev and libc6-dev)")


def grep_count(root: Path) -> int:
    """Runs the benchmark's grep over `root`; returns the total number of matching lines."""
    done = subprocess.run(["grep", "-r", "-c", "-F", "--", GREP_PATTERN, str(root)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"},
                          timeout=STEP_TIMEOUT_S)
    if done.returncode not in (0, 1):
        raise BenchError(f"grep over {root} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return sum(int(line.rsplit(":", 1)[1]) for line in done.stdout.splitlines() if line)


def expected_grep(corpus: SourceTree) -> int:
    """Matching lines in the original headers (the files grep reads on the system under test are copies)."""
    pattern = GREP_PATTERN.encode()
    return sum(1 for _, _, data in corpus.files for line in data.split(b"\n") if pattern in line)


# ---------------------------------------------------------------------------------------------------------
# Micro-benchmarks


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def micro_grep(system: System, root: Path, corpus: SourceTree, expected: int) -> float:
    dest = root / "grep"
    os.mkdir(dest)
    progress(f"{system.name}: grep setup: copying {len(corpus.files)} headers ({corpus.bytes / 1e6:.1f} MB), untimed")
    write_tree(corpus, dest)
    system.cold(dest)
    seconds, count = timed(lambda: grep_count(dest))
    if count != expected:
        raise BenchError(f"{system.name}: grep counted {count} lines with {GREP_PATTERN!r}, the original headers "
                         f"have {expected}")
    progress(f"{system.name}: grep {seconds:.3f} s ({count} matching lines, as in the originals)")
    return seconds


def micro_write(system: System, root: Path) -> float:
    data = random.Random(3900).randbytes(WRITE_BYTES)
    dest = root / "write"
    os.mkdir(dest)
    path = dest / "big"
    seconds, _ = timed(lambda: write_file(path, data, chunk=WRITE_CHUNK, fsync=True))
    system.cold(dest)
    if hashlib.sha256(path.read_bytes()).digest() != hashlib.sha256(data).digest():
        raise BenchError(f"{system.name}: the 3.9 MB file reads back different after a remount")
    progress(f"{system.name}: write 3.9 MB {seconds:.3f} s (read back identical)")
    return seconds


def micro_create(system: System, root: Path) -> float:
    data = random.Random(100).randbytes(CREATE_BYTES)
    dest = root / "create"
    os.mkdir(dest)

    def run() -> None:
        for i in range(CREATE_FILES):
            write_file(dest / f"f{i:03d}", data, chunk=CREATE_BYTES)

    seconds, _ = timed(run)
    names = sorted(os.listdir(dest))
    if names != [f"f{i:03d}" for i in range(CREATE_FILES)] or any(
            (dest / n).stat().st_size != CREATE_BYTES for n in names):
        raise BenchError(f"{system.name}: create100 left {len(names)} entries or wrong sizes")
    progress(f"{system.name}: create 100 x 4 KB {seconds:.3f} s")
    return seconds


# ---------------------------------------------------------------------------------------------------------
# Andrew


@dataclass
class AndrewResult:
    phases_s: dict
    tree: Path
    service_cpu_s: dict = field(default_factory=dict)  # CPU seconds of the file system's processes per phase
    requests: dict = field(default_factory=dict)  # per phase: the relay's request counters (REQUEST_KEYS, ops_*)


def run_andrew(system: System, andrew: Andrew, remount: bool) -> AndrewResult:
    """Runs the Andrew phases on `system`, timing each; before phases 3, 4 and 5 the client's caches are emptied
    (untimed) when `remount`. Around each phase: the andrew's hook at fraction 0 and 1, and the CPU and relay
    requests the file system's processes spent on it."""
    phases: dict[str, float] = {}
    service_cpu: dict[str, float] = {}
    requests: dict[str, dict] = {}
    for phase in PHASES:
        if remount and phase in ("stat", "read", "compile"):
            system.cold(andrew.base)
        andrew.hook(phase, 0.0)
        req0 = system.requests()
        cpu0 = system.service_cpu_s()
        seconds, _ = timed(andrew.phase(phase))
        service_cpu[phase] = system.service_cpu_s() - cpu0
        delta = request_delta(req0, system.requests())
        if delta is not None:
            requests[phase] = delta
            progress(f"{system.name}: {phase}: {delta.get('sent_read_only', 0)} read-only + "
                     f"{delta.get('sent_ordered', 0)} ordered requests; ops "
                     + ", ".join(f"{k[4:]} {v}" for k, v in sorted(delta.items()) if k.startswith("ops_")))
        andrew.hook(phase, 1.0)
        phases[phase] = seconds
        progress(f"{system.name}: Andrew{andrew.copies} {PHASE_TITLES[phase]}: {seconds:.3f} s"
                 + (f" (file system processes used {service_cpu[phase]:.2f} CPU-s)" if service_cpu[phase] else ""))
    return AndrewResult(phases, andrew.base, service_cpu_s=service_cpu, requests=requests)


def request_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int] | None:
    """The relay counters (REQUEST_KEYS and ops_*) that moved from `before` to `after`; None without a relay."""
    if not after:
        return None
    return {k: after[k] - before.get(k, 0) for k in after
            if (k in REQUEST_KEYS or k.startswith("ops_")) and after[k] - before.get(k, 0)}


def check_andrew_tree(system: System, andrew: Andrew) -> None:
    """After a remount: every copied file reads back with the bytes written, and the built lua runs (untimed)."""
    system.cold(andrew.base)
    andrew.check_tree()
    andrew.check_build()
