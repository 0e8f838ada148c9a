#!/usr/bin/env python3
"""Overload through a relay mount on a durable 4-replica cluster (f = 1, loopback, the replicas fdatasync their
logs and share this machine's disk): does the mount stay responsive, does the primary keep its view, and how
long after the writers stop is everything final? (issue 19, item 3: six O_APPEND writers of 4-byte records once
became millions of separate operations, `ls` and `statfs` waited over 130 s, the replicas went through about 390
views and the mount needed 12.5 minutes to drain.)

Workloads, each on a fresh cluster and mount (`bftfs cluster start --service fs`, `bftfs mount --relay`), and
each also on a local FUSE mount of the same client (`bftfs mount --local`) for reference:
  append   six processes append 4-byte records (writer id, sequence number) to one file opened with O_APPEND;
           checked afterwards: every record once, each writer's records in its order
  mmap     four processes write 4 bytes at random places of the even pages of their quarter of one shared
           mapping of a 64 MiB file, then msync and close: no two dirty pages touch, so the kernel writes each
           back as a write of its own (many small writes, as a database's or a build tool's mappings make);
           checked afterwards: each quarter's bytes are what its writer left
  storm    four processes each create a small file, write it, close it and rename it over one of 32 names,
           over and over (the write-then-rename pattern of mail and package tools)
While a workload runs, a prober thread keeps calling stat (on an existing file, and on a new name each time,
which forces a LOOKUP round trip to the service) and statvfs on the mount, one at a time, and records how long
each call took.

Per run (bench-results/stress.json, list `runs`):
  workload, seconds (start until every writer closed its files, i.e. its writes are final), seconds_local_fuse,
  write_seconds (start until the last write call returned), stat_wait_s_max, statfs_wait_s_max (the longest
  single call of the prober: target under 1 s), lookup_wait_s_max, probes (calls made), probes_during_writes
  (calls that both started and returned while writers still ran), view_changes (VIEW-CHANGEs the replicas
  started during the run: target 0 with a correct primary), retransmissions (the relay's), drain_s (from the
  last write call's return until the parent's fsync of every written file returned: everything durable),
  relay_submitted (requests the relay sent on), verified (the check above), and the mount's counters.

Environment: BUILD (or BFTFS_BUILD), QUICK=1 (smaller runs), WORKLOADS=append,mmap,storm, APPEND_RECORDS (per
writer), MMAP_WRITES (per writer), STORM_ROUNDS (per writer), STRESS_OUT (result path), NO_LOCAL=1 (skip the
local FUSE reference), COMPARE_BUILD=<build dir> (each workload also on a cluster and mount of that build's
bftfs, e.g. an older commit's, into the run's `compare`), BENCH_KEEP=1 keeps the scratch directory. Every
process started is stopped on exit.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import random
import shutil
import struct
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
from harness.procs import HarnessError, exit_cleanly_on_sigterm  # noqa: E402
from harness.relay import relay_counters  # noqa: E402

RESULT = Path(os.environ.get("STRESS_OUT", str(reporting.RESULTS_DIR / "stress.json")))
WORKER_TIMEOUT_S = 3600
APPEND_WRITERS = 6
MMAP_WRITERS = 4
MMAP_FILE_BYTES = 64 << 20
PAGE_BYTES = 4096
STORM_WRITERS = 4
STORM_NAMES = 32
PROBE_PAUSE_S = 0.02


def sizes() -> dict[str, int]:
    quick = reporting.quick_mode()
    return {
        "append": int(os.environ.get("APPEND_RECORDS", 20000 if quick else 100000)),
        "mmap": int(os.environ.get("MMAP_WRITES", 5000 if quick else 20000)),
        "storm": int(os.environ.get("STORM_ROUNDS", 300 if quick else 1500)),
    }


# ---------------------------------------------------------------------------------------------------------
# Workers: separate processes (`bench_stress.py --worker KIND ...`), each printing one JSON line of
# CLOCK_MONOTONIC times (system-wide, so comparable with the parent's).


def worker_append(path: str, writer: int, records: int) -> dict:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    start = time.monotonic()
    for seq in range(records):
        os.write(fd, struct.pack("<I", (seq << 8) | writer))
    last_write = time.monotonic()
    os.close(fd)
    return {"start": start, "last_write": last_write, "closed": time.monotonic()}


def mmap_region(writer: int) -> tuple[int, int]:
    span = MMAP_FILE_BYTES // MMAP_WRITERS
    return writer * span, span


def mmap_place(rng: random.Random, span: int) -> int:
    """A random 4-byte slot of a random even page of a region of `span` bytes."""
    page = 2 * rng.randrange(0, span // PAGE_BYTES // 2)
    return page * PAGE_BYTES + 4 * rng.randrange(0, PAGE_BYTES // 4)


def mmap_expected(writer: int, writes: int) -> bytes:
    """The bytes of `writer`'s region after its writes (the same pseudo-random places as worker_mmap)."""
    _, span = mmap_region(writer)
    region = bytearray(span)
    rng = random.Random(1000 + writer)
    for i in range(writes):
        at = mmap_place(rng, span)
        region[at:at + 4] = struct.pack("<I", (i << 8) | writer)
    return bytes(region)


def worker_mmap(path: str, writer: int, writes: int) -> dict:
    base, span = mmap_region(writer)
    fd = os.open(path, os.O_RDWR)
    start = time.monotonic()
    m = mmap.mmap(fd, span, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=base)
    rng = random.Random(1000 + writer)
    for i in range(writes):
        at = mmap_place(rng, span)
        m[at:at + 4] = struct.pack("<I", (i << 8) | writer)
    last_write = time.monotonic()
    m.flush()
    m.close()
    os.close(fd)
    return {"start": start, "last_write": last_write, "closed": time.monotonic()}


def worker_storm(directory: str, writer: int, rounds: int) -> dict:
    start = time.monotonic()
    tmp = os.path.join(directory, f"w{writer}.tmp")
    payload = bytes([writer]) * 64
    for i in range(rounds):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, payload + struct.pack("<I", i))
        os.close(fd)
        os.rename(tmp, os.path.join(directory, f"w{writer}-{i % STORM_NAMES}"))
    last = time.monotonic()
    return {"start": start, "last_write": last, "closed": last}


WORKERS = {"append": worker_append, "mmap": worker_mmap, "storm": worker_storm}


def worker_main(argv: list[str]) -> None:
    kind, path, writer, count = argv[0], argv[1], int(argv[2]), int(argv[3])
    print(json.dumps(WORKERS[kind](path, writer, count)), flush=True)


# ---------------------------------------------------------------------------------------------------------
# The prober


class Prober:
    """A thread that calls stat (an existing file; a new name each time) and statvfs on `mnt` one after the
    other until stopped, and records each call's duration and when it started and ended."""

    def __init__(self, mnt: Path, probe_file: Path) -> None:
        self.mnt = mnt
        self.probe_file = probe_file
        self.calls: dict[str, list[tuple[float, float]]] = {"stat": [], "lookup": [], "statfs": []}
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def timed(self, kind: str, fn) -> None:
        t0 = time.monotonic()
        try:
            fn()
        except FileNotFoundError:
            pass
        self.calls[kind].append((t0, time.monotonic()))

    def run(self) -> None:
        i = 0
        while not self.stop_flag.is_set():
            self.timed("stat", lambda: os.stat(self.probe_file))
            self.timed("lookup", lambda: os.stat(self.mnt / f"no-such-name-{i}"))
            self.timed("statfs", lambda: os.statvfs(self.mnt))
            i += 1
            self.stop_flag.wait(PROBE_PAUSE_S)

    def start(self) -> "Prober":
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stops after the call under way returns (however long it takes: that call is what we measure)."""
        self.stop_flag.set()
        self.thread.join()

    def longest(self, kind: str) -> float:
        return round(max((b - a for a, b in self.calls[kind]), default=0.0), 3)

    def during(self, until: float) -> int:
        return sum(1 for calls in self.calls.values() for a, b in calls if b <= until)


# ---------------------------------------------------------------------------------------------------------
# One workload on one mount


def prepare(kind: str, mnt: Path) -> list[Path]:
    """Creates what the workload needs; returns the files whose writes must be durable at the end."""
    if kind == "append":
        path = mnt / "append.log"
        path.touch()
        return [path]
    if kind == "mmap":
        path = mnt / "mapped.bin"
        with open(path, "wb") as f:
            f.truncate(MMAP_FILE_BYTES)
        return [path]
    (mnt / "storm").mkdir()
    return []


def writers(kind: str, mnt: Path) -> list[tuple[str, int]]:
    if kind == "append":
        return [(str(mnt / "append.log"), w) for w in range(APPEND_WRITERS)]
    if kind == "mmap":
        return [(str(mnt / "mapped.bin"), w) for w in range(MMAP_WRITERS)]
    return [(str(mnt / "storm"), w) for w in range(STORM_WRITERS)]


def verify(kind: str, mnt: Path, count: int) -> str:
    """"ok", or what is wrong with the workload's result."""
    if kind == "append":
        data = (mnt / "append.log").read_bytes()
        if len(data) != 4 * count * APPEND_WRITERS:
            return f"append.log has {len(data)} bytes, expected {4 * count * APPEND_WRITERS}"
        nxt = [0] * APPEND_WRITERS
        for (value,) in struct.iter_unpack("<I", data):
            w, seq = value & 0xFF, value >> 8
            if w >= APPEND_WRITERS or seq != nxt[w]:
                return f"record of writer {w} seq {seq} where seq {nxt[w] if w < APPEND_WRITERS else '?'} was due"
            nxt[w] += 1
        return "ok"
    if kind == "mmap":
        with open(mnt / "mapped.bin", "rb") as f:
            for w in range(MMAP_WRITERS):
                base, span = mmap_region(w)
                f.seek(base)
                if hashlib.sha256(f.read(span)).digest() != hashlib.sha256(mmap_expected(w, count)).digest():
                    return f"region of writer {w} differs from what it wrote"
        return "ok"
    names = sorted(p.name for p in (mnt / "storm").iterdir())
    want = sorted(f"w{w}-{i}" for w in range(STORM_WRITERS) for i in range(min(count, STORM_NAMES)))
    return "ok" if names == want else f"storm directory holds {len(names)} names, expected {len(want)}"


def run_workload(kind: str, mnt: Path, count: int) -> dict:
    """Runs `kind` on the mounted `mnt` with a prober; returns times, probe waits and the check."""
    durable = prepare(kind, mnt)
    probe_file = mnt / "probe"
    probe_file.write_bytes(b"probe")
    prober = Prober(mnt, probe_file).start()
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", kind, path, str(w), str(count)],
                              stdout=subprocess.PIPE, text=True) for path, w in writers(kind, mnt)]
    reports = []
    for p in procs:
        out, _ = p.communicate(timeout=WORKER_TIMEOUT_S)
        if p.returncode != 0:
            raise SystemExit(f"{kind} worker exited {p.returncode}")
        reports.append(json.loads(out))
    closed = max(r["closed"] for r in reports)
    last_write = max(r["last_write"] for r in reports)
    for path in durable:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    all_durable = time.monotonic()
    prober.stop()
    return {"seconds": round(closed - t0, 3), "write_seconds": round(last_write - t0, 3),
            "drain_s": round(all_durable - last_write, 3),
            "stat_wait_s_max": prober.longest("stat"), "lookup_wait_s_max": prober.longest("lookup"),
            "statfs_wait_s_max": prober.longest("statfs"),
            "probes": sum(len(c) for c in prober.calls.values()), "probes_during_writes": prober.during(last_write),
            "verified": verify(kind, mnt, count)}


def view_changes(cluster: CliCluster) -> int:
    total = 0
    for i in range(cluster.n):
        st = cluster.status(i) or {}
        total += int(st.get("stats", {}).get("view_changes_started", 0))
    return total


def started_cluster(bftfs: Path, directory: Path) -> CliCluster:
    """A started file-service cluster (with its relay). A port range can be taken by another process between
    its choice and the replicas' bind (a shared machine): the start is tried again once on a new range."""
    directory.mkdir(parents=True, exist_ok=True)
    for attempt in (1, 2):
        cluster = CliCluster(bftfs, directory / f"try{attempt}", service="fs", ports=8)
        try:
            return cluster.start()
        except HarnessError as exc:
            cluster.stop()
            if attempt == 2:
                raise
            progress(f"cluster start failed, once more on other ports: {str(exc).splitlines()[-1]}")
    raise AssertionError("unreachable")


def on_cluster(bftfs: Path, scratch: Path, kind: str, count: int) -> dict:
    cluster = started_cluster(bftfs, scratch / f"c-{kind}")
    counters_file = scratch / f"mount-{kind}.json"
    mount = Mount(bftfs, scratch / f"m-{kind}", scratch / f"mount-{kind}.log", ["--relay", cluster.relay_sock],
                  counters_file=counters_file)
    try:
        mount.start()
        time.sleep(1.0)  # status.json is refreshed about every 500 ms
        vc0 = view_changes(cluster)
        relay0 = relay_counters(cluster.relay_sock)
        row = run_workload(kind, mount.mountpoint, count)
        relay1 = relay_counters(cluster.relay_sock)
        time.sleep(1.0)
        row["view_changes"] = view_changes(cluster) - vc0
        row["retransmissions"] = relay1.get("retransmissions", 0) - relay0.get("retransmissions", 0)
        row["relay_submitted"] = relay1.get("submitted", 0) - relay0.get("submitted", 0)
        row["views"] = [int((cluster.status(i) or {}).get("view", -1)) for i in range(cluster.n)]
        t_stop = time.monotonic()
        code = mount.stop()
        row["unmount_s"] = round(time.monotonic() - t_stop, 3)
        row["mount_exit"] = code
        row["mount"] = mount.counters() or {}
        return row
    finally:
        mount.stop()
        cluster.stop()


def on_local(bftfs: Path, scratch: Path, kind: str, count: int) -> dict:
    data = scratch / f"local-{kind}"
    data.mkdir()
    mount = Mount(bftfs, scratch / f"lm-{kind}", scratch / f"local-{kind}.log", ["--local", data])
    try:
        mount.start()
        return run_workload(kind, mount.mountpoint, count)
    finally:
        mount.stop()


def main() -> None:
    exit_cleanly_on_sigterm()
    bftfs = bftfs_binary()
    kinds = [k for k in os.environ.get("WORKLOADS", "append,mmap,storm").split(",") if k]
    counts = sizes()
    load_start = reporting.load_average()
    scratch = Path(tempfile.mkdtemp(prefix="bftfs-stress-", dir="/var/tmp"))
    rows = []
    try:
        for kind in kinds:
            progress(f"{kind}: {counts[kind]} per writer, 4-replica cluster")
            row = {"workload": kind, "per_writer": counts[kind]}
            row.update(on_cluster(bftfs, scratch, kind, counts[kind]))
            compare = os.environ.get("COMPARE_BUILD")
            if compare:
                other = Path(compare) / "cli" / "bftfs"
                progress(f"{kind}: the same with {other}")
                row["compare"] = {"bftfs": str(other), **on_cluster(other, scratch / "compare", kind, counts[kind])}
            if os.environ.get("NO_LOCAL") != "1":
                local = on_local(bftfs, scratch, kind, counts[kind])
                row["seconds_local_fuse"] = local["seconds"]
                row["local_fuse"] = local
            progress(f"{kind}: {row['seconds']} s (local FUSE {row.get('seconds_local_fuse')} s), stat max "
                     f"{row['stat_wait_s_max']} s, lookup max {row['lookup_wait_s_max']} s, statfs max "
                     f"{row['statfs_wait_s_max']} s, view changes {row['view_changes']}, retransmissions "
                     f"{row['retransmissions']}, drain {row['drain_s']} s, {row['verified']}")
            rows.append(row)
    finally:
        if reporting.keep_scratch():
            progress(f"scratch kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    meta = reporting.run_metadata(loadavg_1_5_15_start=load_start, sizes=counts,
                                  workload="stress workloads through bftfs mount --relay, durable 4-replica "
                                           "cluster on one machine; the same on bftfs mount --local")
    reporting.write_json(RESULT, {"meta": meta, "runs": rows})
    progress(f"wrote {RESULT}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2:])
    else:
        main()
