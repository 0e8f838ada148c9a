#!/usr/bin/env python3
"""Durability benchmark: fsynced data on a bftfs mount across `kill -9` of every replica (issue 5).

    BFTFS_BUILD=build python3 benchmarks/bench_fs_durability.py          # full: 6 + 3 rounds
    QUICK=1 BFTFS_BUILD=build python3 benchmarks/bench_fs_durability.py  # short: 2 + 1 rounds

Starts a cluster with the one user command (`bftfs cluster start --service fs`: 4 durable replicas with the shim
and a relay on DIR/relay.sock) and `bftfs mount --relay`. Each round runs the writer of
harness/durability.py (appends with fsync after each record to three files, one of them
O_APPEND; rename-into-place after fsync; new files with an fsync of the directory), logging outside the mount
each operation whose fsync returned, and then:
  replicas rounds   every replica gets SIGKILL at once (pids from DIR/r<i>.pid), at a different moment each
                    round (after N logged operations, plus a seeded delay; every other round right after an fsync
                    returned); they are restarted with the command lines they ran with (read from /proc before
                    the kill, so exactly what `cluster start` chose) on the same data directories; the writer's
                    blocked operation completes by itself; every logged byte is checked, then again exactly after a
                    clean stop of the writer
  total rounds      the replicas, the relay and the mount daemon get SIGKILL together (only the replicas' data
                    directories survive), everything is restarted, and a new mount is checked against the log
Per round: records_fsynced (operations whose fsync returned), records_found, bytes_fsynced, bytes_found,
restart_s (restart until the replicas report ready; for total rounds until the new mount is up), recover_s
(until the writer's blocked operation completed; for total rounds until the first full read of the files),
down_s (kill until ready).

Output: bench-results/fs-durability.json. BENCH_KEEP=1 keeps the scratch directory (logs, data). Every process
started is killed on exit.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the harness package

import reporting  # noqa: E402
from harness.binaries import bftfs_binary  # noqa: E402
from harness.cli_cluster import CliCluster  # noqa: E402
from harness.durability import run_round, run_total_crash_round  # noqa: E402
from harness.log import progress  # noqa: E402
from harness.mount import Mount  # noqa: E402
from harness.procs import exit_cleanly_on_sigterm  # noqa: E402

N = 4  # f = 1


class Bench:
    """The cluster (`bftfs cluster start`, durable replicas and the relay), the mounts made on it one after the
    other, and the kills and restarts the rounds ask for."""

    def __init__(self, bftfs: Path, root: Path) -> None:
        self.bftfs, self.root = bftfs, root
        self.cluster = CliCluster(bftfs, root / "c", service="fs", ports=N + 1, args=["--log-level", "warn"])
        self.work = root / "work"
        self.work.mkdir(parents=True)
        self.mounts: list[Mount] = []
        self._killed: dict[str, list[str]] = {}

    @property
    def mnt(self) -> Path:
        return self.mounts[-1].mountpoint

    def start(self) -> None:
        self.cluster.start()
        self.mount()

    def mount(self) -> Path:
        k = len(self.mounts)
        m = Mount(self.bftfs, self.root / f"mnt{k}", self.root / f"mnt{k}.log",
                  ["--relay", self.cluster.relay_sock])
        self.mounts.append(m)
        m.start(timeout_s=30)
        return m.mountpoint

    # ---- kills and restarts ----
    def kill_replicas(self, relay: bool = False) -> None:
        """SIGKILL to every replica (and with `relay`, the relay and the mount daemon too) at once."""
        mount = self.mounts[-1] if relay else None
        if mount is not None:
            mount.signal_group(signal.SIGKILL)
        self._killed = self.cluster.kill_together(*[f"r{i}" for i in range(N)], *(["relay"] if relay else []))
        if mount is not None:
            mount.kill()
            mount.proc = None
            subprocess.run(["umount", "-l", str(mount.mountpoint)], capture_output=True, timeout=30)

    def restart(self) -> None:
        """Everything killed last, again with the command lines it ran with, on the same data directories."""
        for name, argv in self._killed.items():
            self.cluster.restart(name, argv)
        for name in self._killed:
            self.cluster.wait_ready(name, 60)

    def kill_everything(self) -> None:
        self.kill_replicas(relay=True)

    def restart_everything(self) -> Path:
        self.restart()
        return self.mount()

    def close(self) -> None:
        for m in self.mounts:
            m.stop()
        self.cluster.stop()


def main() -> int:
    exit_cleanly_on_sigterm()
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        raise SystemExit("needs root and /dev/fuse (FUSE mounts)")
    quick = reporting.quick_mode()
    bftfs = bftfs_binary()
    busy = reporting.machine_busy_before()
    root = Path(tempfile.mkdtemp(prefix="bftfs-bench-dur-"))
    kills = (3, 30, 60) if quick else (3, 20, 35, 50, 70, 90)
    total_kills = (25,) if quick else (8, 25, 45)
    b = Bench(bftfs, root)
    rounds, total = [], []
    t0 = time.monotonic()
    try:
        b.start()
        progress(f"cluster up in {b.cluster.dir}, mounted on {b.mnt}")
        for k, after in enumerate(kills):
            r = run_round(k, b.mnt, b.work, seed=3000 + k, kill_after_records=after, kill_replicas=b.kill_replicas,
                          restart_replicas=b.restart)
            rounds.append(r.as_json())
            progress(f"replicas round {k}: {r.records_found}/{r.records_fsynced} records, "
                     f"{r.bytes_found}/{r.bytes_fsynced} bytes, restart {r.restart_s:.2f}s, recover {r.recover_s:.2f}s"
                     + (f", PROBLEMS {r.problems}" if r.problems else ""))
        for k, after in enumerate(total_kills):
            index = len(kills) + k
            r = run_total_crash_round(index, b.mnt, b.work, seed=4000 + k, kill_after_records=after,
                                      kill_everything=b.kill_everything, restart_everything=b.restart_everything)
            total.append(r.as_json())
            progress(f"total round {index}: {r.records_found}/{r.records_fsynced} records, "
                     f"{r.bytes_found}/{r.bytes_fsynced} bytes, restart {r.restart_s:.2f}s, "
                     f"first read {r.recover_s:.2f}s" + (f", PROBLEMS {r.problems}" if r.problems else ""))
    finally:
        b.close()
        if reporting.keep_scratch():
            progress(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    everything = rounds + total
    result = {
        "meta": reporting.run_metadata(machine_before=busy, wall_s=round(time.monotonic() - t0, 1)),
        "what": "kill -9 of every replica (and, in total rounds, the relay and the mount too) during an fsync "
                "workload on a bftfs mount; after restart every fsynced byte must be there",
        "command": "QUICK=1 BFTFS_BUILD=build python3 benchmarks/bench_fs_durability.py",
        "rounds": len(everything),
        "records_fsynced": sum(r["records_fsynced"] for r in everything),
        "records_found": sum(r["records_found"] for r in everything),
        "bytes_fsynced": sum(r["bytes_fsynced"] for r in everything),
        "bytes_found": sum(r["bytes_found"] for r in everything),
        "problems": sum(len(r["problems"]) for r in everything),
        "recover_s_max": round(max((r["recover_s"] for r in rounds), default=0.0), 3),
        "restart_s_max": round(max((r["restart_s"] for r in everything), default=0.0), 3),
        "replicas_rounds": rounds,
        "total_crash_rounds": total,
    }
    out = reporting.RESULTS_DIR / "fs-durability.json"
    reporting.write_json(out, result)
    progress(f"wrote {out}: {result['records_found']}/{result['records_fsynced']} records, "
             f"{result['problems']} problems")
    return 0 if result["problems"] == 0 and result["records_found"] == result["records_fsynced"] else 1


if __name__ == "__main__":
    sys.exit(main())
