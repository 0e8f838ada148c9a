"""bench_fs.py --faults: Andrew on PBFT once fault-free and once with a backup killed in the middle of phase 2,
restarted at the start of phase 4, and the primary killed during phase 5; the run must complete and the two
resulting trees (read back after a remount) must be byte-identical (bench-results/fs-faults.json)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import reporting
from fs_systems import BenchError, MountedSystem, Watchdog, check_binary_supports, run_deadline_s
from fs_workloads import check_andrew_tree, run_andrew
from harness.andrew import Andrew, SourceTree, hash_tree, lua_source, tree_digest
from harness.binaries import bftfs_binary
from harness.cli_cluster import CliCluster
from harness.log import progress
from harness.procs import HarnessError

CATCH_UP_TIMEOUT_S = 120.0


FAULT_PLAN = ("a backup (the replica before the primary, so not the next primary) gets SIGKILL when half of "
              "phase 2's files are copied; it is restarted with the same argv and data directory at the start of "
              "phase 4; during phase 5, once it has executed everything the others had when phase 5 began "
              "(f = 1 tolerates one fault at a time), the primary gets SIGKILL, 30% of the reference run's "
              "compile time after phase 5 began, and stays down")


class FaultPlan:
    """The Andrew hook of the fault run. In the workload's thread: at half of phase 2 (copy) a backup is killed;
    at the start of phase 4 it is restarted. A helper thread started at the start of phase 5 (compile) waits
    until the restarted backup has executed everything the others had executed then (f = 1: only one replica
    may be down at a time), and `primary_delay_s` after the start of phase 5 kills the primary. Every event is
    recorded with its time since the start of Andrew and the phase it hit."""

    def __init__(self, replicas: CliCluster, primary_delay_s: float) -> None:
        self.replicas = replicas
        self.primary_delay_s = primary_delay_s
        self.events: list[dict] = []
        self.t0 = time.monotonic()
        self.phase = "mkdir"
        self.backup: int | None = None
        self.backup_argv: list[str] | None = None
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def record(self, event: str, **detail) -> None:
        if "view" not in detail:
            with contextlib.suppress(HarnessError):
                detail["view"] = self.replicas.view()
        with self.lock:
            entry = {"t_s": round(time.monotonic() - self.t0, 3), "phase": self.phase, "event": event, **detail}
            self.events.append(entry)
        progress(f"FAULT {event} {detail} at {entry['t_s']:.2f} s of Andrew (phase {self.phase})")

    def __call__(self, phase: str, fraction: float) -> None:
        if self.error is not None:
            raise BenchError(f"fault injection failed: {self.error}")
        if phase == "mkdir" and fraction == 0.0:
            self.t0 = time.monotonic()
        self.phase = phase
        if phase == "copy" and fraction >= 0.5 and self.backup is None:
            primary = self.replicas.primary()
            view = self.replicas.view()
            self.backup = (primary + self.replicas.n - 1) % self.replicas.n  # a backup, not the next primary
            self.backup_argv = self.replicas.kill(self.backup)
            self.record("backup_killed", replica=self.backup, primary=primary, view=view)
        elif phase == "read" and fraction == 0.0 and self.backup_argv is not None:
            assert self.backup is not None
            pid = self.replicas.restart(self.backup, self.backup_argv)
            self.backup_argv = None
            self.record("backup_restarted", replica=self.backup, pid=pid)
        elif phase == "compile" and fraction == 0.0 and self.thread is None:
            self.thread = threading.Thread(target=self._primary_killer, name="fault-primary", daemon=True)
            self.thread.start()

    def _primary_killer(self) -> None:
        try:
            start = time.monotonic()
            assert self.backup is not None
            self.replicas.wait_ready(self.backup, CATCH_UP_TIMEOUT_S)
            others = [i for i in range(self.replicas.n) if i != self.backup]
            target = max(self.replicas.last_executed(i) for i in others)
            deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
            while self.replicas.last_executed(self.backup) < target and time.monotonic() < deadline:
                time.sleep(0.05)
            caught_up = self.replicas.last_executed(self.backup) >= target
            self.record("backup_caught_up" if caught_up else "backup_not_caught_up", replica=self.backup,
                        last_executed=self.replicas.last_executed(self.backup), target=target,
                        **self.replicas.transfer_stats(self.backup))
            wait = self.primary_delay_s - (time.monotonic() - start)
            if wait > 0:
                time.sleep(wait)
            if self.phase != "compile":
                self.record("primary_kill_missed", reason="phase 5 ended before the backup caught up")
                return
            primary = self.replicas.primary()
            view = self.replicas.view()
            self.replicas.kill(primary)
            self.record("primary_killed", replica=primary, view=view)
        except BaseException as exc:  # reported by the workload thread at its next hook call
            self.error = exc
            progress(f"FAULT thread failed: {exc}")

    def finish(self) -> None:
        if self.thread is not None:
            self.thread.join(timeout=CATCH_UP_TIMEOUT_S * 2 + 60)
        if self.error is not None:
            raise BenchError(f"fault injection failed: {self.error}")


def andrew_on_pbft(scratch: Path, tag: str, bftfs: Path, p: dict, lua: SourceTree, mnt: Path,
                   faults: Callable[[CliCluster], FaultPlan] | None) -> dict:
    """Andrew once on a fresh 4-replica cluster mounted at `mnt`; with `faults`, under that fault plan.
    Returns the phase times, the fault events and the tree's hashes (read back after a remount)."""
    run_dir = scratch / tag
    run_dir.mkdir(parents=True)
    system = MountedSystem(run_dir, "pbft", bftfs, mnt, p["cluster_args"])
    try:
        with Watchdog(system, run_deadline_s(p["andrew_n"])) as dog:
            root = system.start()
            assert system.cluster is not None
            plan_ = faults(system.cluster) if faults else None
            andrew = Andrew(system.name, root, lua, p["andrew_n"], run_dir, hook=plan_)
            result = run_andrew(system, andrew, p["remount"])
            if plan_ is not None:
                plan_.finish()
            check_andrew_tree(system, andrew)
            hashes = hash_tree(andrew.base)
            if dog.fired:
                raise BenchError("the watchdog fired")
    finally:
        system.stop()  # cluster stop, and SIGKILL to a replica the fault plan restarted if it still runs
    return {"phases_s": {k: round(v, 4) for k, v in result.phases_s.items()},
            "andrew_total_s": round(sum(result.phases_s.values()), 4),
            "events": plan_.events if plan_ is not None else [],
            "hashes": hashes, "tree_digest": tree_digest(hashes), "entries": len(hashes)}


def run_fault_mode(args, plan: dict) -> None:
    """`bench_fs.py --faults`: Andrew on PBFT fault-free, then under FaultPlan; writes fs-faults.json."""
    p = plan
    if args.andrew_n:
        p["andrew_n"] = args.andrew_n
    bftfs = bftfs_binary()
    check_binary_supports(bftfs, ["pbft"])
    lua, lua_info = lua_source()
    busy = reporting.machine_busy_before()
    scratch = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix="bftfs-fs-faults-"))
    mnt = scratch / "mnt"  # both runs at the same path: the build output must not differ by its location
    ok = False
    try:
        progress(f"== fault-free reference: Andrew{p['andrew_n']} on PBFT")
        ref = andrew_on_pbft(scratch, "reference", bftfs, p, lua, mnt, None)
        delay = 0.3 * ref["phases_s"]["compile"]
        progress(f"== faulted run: backup killed mid-copy, restarted at phase 4, primary killed "
                 f"{delay:.1f} s into phase 5 (30% of the reference's compile)")
        bad = andrew_on_pbft(scratch, "faulted", bftfs, p, lua, mnt, lambda r: FaultPlan(r, delay))
        ref_h, bad_h = ref.pop("hashes"), bad.pop("hashes")
        differences = sorted(set(ref_h) ^ set(bad_h)) + sorted(k for k in set(ref_h) & set(bad_h)
                                                                 if ref_h[k] != bad_h[k])
        hit = {e["event"] for e in bad["events"]}
        result = {
            "meta": reporting.run_metadata(
                benchmark="bench_fs --faults", machine_before=busy, andrew_n=p["andrew_n"],
                andrew={"source": lua_info, "files_per_copy": len(lua.files)},
                fault_plan=FAULT_PLAN,
                comparison="every entry under the Andrew tree: type, permission bits, size and SHA-256 of the "
                           "bytes, read back after a remount (times excluded)",
                cluster_args=p["cluster_args"]),
            "reference": ref,
            "faulted": bad,
            "faults_hit": {"backup_killed": "backup_killed" in hit, "primary_killed": "primary_killed" in hit},
            "run_completed": True,
            "trees_identical": not differences and ref["tree_digest"] == bad["tree_digest"],
            "differences": differences[:20],
            "slowdown": round(bad["andrew_total_s"] / ref["andrew_total_s"], 3),
        }
        out = reporting.RESULTS_DIR / (args.output or "fs-faults.json")
        reporting.write_json(out, result)
        progress(f"wrote {out}: trees identical: {result['trees_identical']} ({ref['entries']} entries); faults hit: "
                 f"{result['faults_hit']}; Andrew {ref['andrew_total_s']:.1f} s -> {bad['andrew_total_s']:.1f} s")
        if not result["trees_identical"]:
            raise BenchError(f"the faulted run's tree differs: {differences[:5]}")
        if not all(result["faults_hit"].values()):
            raise BenchError(f"not every planned fault hit the run: {bad['events']}")
        ok = True
    finally:
        if ok and not reporting.keep_scratch() and not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            progress(f"kept {scratch} (logs and data)")
