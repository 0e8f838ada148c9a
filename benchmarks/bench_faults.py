#!/usr/bin/env python3
"""Fault benchmark: how a 4-replica PBFT counter cluster (f = 1, loopback) behaves while replicas fail.

Scenarios (each on a fresh cluster with empty data directories, under closed-loop load of LOAD_CLIENTS clients
in one `bftfs counter --clients` process):
  primary_crash   the primary gets SIGKILL mid-run and stays dead; repeated (full: 3 times, QUICK: once)
  primary_stall   the primary gets SIGSTOP, then SIGCONT STALL_S = 2 s later
  backup_down     one backup is never started: sequential latency and closed-loop throughput, against the same
                  measurements with all four replicas up (`all_up`); alternated 3 times (QUICK: once), medians

Throughput timeline. The load process reports completed increments per window; the fault time is taken with
time.monotonic_ns() (CLOCK_MONOTONIC, the clock the client uses), so both are on one time axis. Two sources,
recorded in the JSON as timeline_source:
  "client-timeline"   `bftfs counter --timeline-ms W` (per-window completion counts; W = 50 ms here)
  "progress-lines"    fallback when the CLI has no --timeline-ms: the client's once-a-second stderr progress
                      lines ("counter: N done, ..."), timestamped on arrival; windows are then about 1 s wide
                      and every recovery time below is only as precise as that
Definitions (also written into faults.json under "definitions"):
  pre_fault_ops_per_s   mean rate over the windows that lie entirely inside [fault - PRE_S, fault)
  recovery_ms           (end of the first window that starts at or after the fault and whose rate is
                        >= RECOVERY_FRACTION (50 %) of pre_fault_ops_per_s) - fault time. An upper bound: by then
                        throughput had returned for a whole window. None if it never returned within the run.
  first_completion_ms   (start of the first window at or after the fault with at least one completion) - fault
  zero_windows          windows at or after the fault, before recovery, with no completion at all

Output: bench-results/faults.json and bench-results/faults-timeline.png. Environment: BUILD (or BFTFS_BUILD),
QUICK=1 for a short run, BENCH_KEEP=1 keeps the scratch directory (logs, data). Progress on stderr; every
process started is killed on exit.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the harness package

import reporting  # noqa: E402
from harness.binaries import bftfs_binary  # noqa: E402
from harness.cluster import Cluster  # noqa: E402
from harness.counter import counter_help  # noqa: E402
from harness.log import progress  # noqa: E402
from harness.procs import exit_cleanly_on_sigterm  # noqa: E402

LOAD_CLIENTS = 8
TIMELINE_MS = 50
RECOVERY_FRACTION = 0.5
STALL_S = 2.0
WARMUP_S = 1.0

_PROGRESS = re.compile(r"counter: (\d+) done")
# Replica log lines (common/log.h): "2026-11-22T13:31:51.123Z INFO r1 v3 s1280 <message>".
_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z\s+(\w+)\s+r(\d+)\b.*?(view change timer expired|"
                       r"view change to v\d+|new view installed)")


def plan() -> dict:
    if reporting.quick_mode():
        return {"pre_s": 2.0, "post_s": 5.0, "crash_repeats": 1, "backup_down_clients": [8],
                "sequential_requests": 200, "closed_loop_s": 2.0, "steady_repeats": 1}
    return {"pre_s": 3.0, "post_s": 8.0, "crash_repeats": 3, "backup_down_clients": [1, 8, 32],
            "sequential_requests": 1000, "closed_loop_s": 3.0, "steady_repeats": 3}


# ---------------------------------------------------------------------------------------------------------
# The load process and its timeline


class LoadRun:
    """One closed-loop `bftfs counter --clients K` process, its stderr progress lines timestamped on arrival,
    and (when the CLI supports it) its own per-window timeline."""

    def __init__(self, cluster: Cluster, clients: int, duration_s: float, use_timeline: bool) -> None:
        args = ["--clients", clients, "--duration-s", duration_s, "--warmup-s", WARMUP_S, "--timeout-s", 60]
        if use_timeline:
            args += ["--timeline-ms", TIMELINE_MS]
        self.argv = cluster.counter_argv(cluster.take_clients(clients), extra=args)
        self.use_timeline = use_timeline
        self.progress_lines: list[tuple[int, int]] = []  # (monotonic ns on arrival, cumulative completions)
        self.stderr_tail: list[str] = []
        self.start_ns = time.monotonic_ns()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        # Both pipes are drained by threads of our own (communicate() would race the stderr reader for lines).
        self._stdout: list[str] = []
        self._readers = [threading.Thread(target=self._read_stderr, daemon=True),
                         threading.Thread(target=self._read_stdout, daemon=True)]
        for t in self._readers:
            t.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._stdout.append(line)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            now = time.monotonic_ns()
            m = _PROGRESS.search(line)
            if m:
                self.progress_lines.append((now, int(m.group(1))))
            else:
                self.stderr_tail = (self.stderr_tail + [line.rstrip()])[-20:]

    def completed_so_far(self) -> int:
        return self.progress_lines[-1][1] if self.progress_lines else 0

    def finish(self, timeout_s: float) -> dict:
        """Waits for the process and returns its JSON (raises with its stderr if it failed)."""
        try:
            self.proc.wait(timeout=timeout_s)
        except BaseException:
            self.kill()
            raise
        for t in self._readers:
            t.join(timeout=5)
        if self.proc.returncode != 0:
            raise RuntimeError(f"load exited {self.proc.returncode}: {' | '.join(self.stderr_tail)}")
        lines = [line for line in self._stdout if line.strip()]
        if not lines:
            raise RuntimeError(f"load printed no JSON: {' | '.join(self.stderr_tail)}")
        return json.loads(lines[-1])

    def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def windows(self, result: dict) -> tuple[str, list[tuple[int, int, int]]]:
        """The timeline as (start ns, end ns, completions) windows on the CLOCK_MONOTONIC axis."""
        if self.use_timeline and "timeline" in result:
            w = int(result["timeline_ms"]) * 1_000_000
            t0 = int(result["timeline_start_mono_ns"])
            return "client-timeline", [(t0 + i * w, t0 + (i + 1) * w, int(c)) for i, c in enumerate(result["timeline"])]
        out = []
        prev_t, prev_n = self.start_ns, 0
        for t, n in self.progress_lines:
            out.append((prev_t, t, n - prev_n))
            prev_t, prev_n = t, n
        return "progress-lines", out


def analyse(windows: list[tuple[int, int, int]], fault_ns: int, pre_s: float, since_ns: int | None = None) -> dict:
    """Recovery figures for a fault at `fault_ns` (definitions in the module docstring). `since_ns` (default
    the fault) is where the search for recovery starts, e.g. SIGCONT for a stall."""
    since_ns = fault_ns if since_ns is None else since_ns
    pre = [(s, e, c) for s, e, c in windows if s >= fault_ns - int(pre_s * 1e9) and e <= fault_ns]
    pre_span_s = sum(e - s for s, e, _ in pre) / 1e9
    pre_rate = sum(c for _, _, c in pre) / pre_span_s if pre_span_s > 0 else 0.0
    after = [(s, e, c) for s, e, c in windows if s >= since_ns]
    recovery = None
    first_completion = None
    zero = 0
    for s, e, c in after:
        rate = c / ((e - s) / 1e9) if e > s else 0.0
        if first_completion is None and c > 0:
            first_completion = (s - fault_ns) / 1e6
        if pre_rate > 0 and rate >= RECOVERY_FRACTION * pre_rate:
            recovery = (e - fault_ns) / 1e6
            break
        if c == 0:
            zero += 1
    post = [(s, e, c) for s, e, c in windows
            if recovery is not None and s >= fault_ns + recovery * 1e6]
    post_span_s = sum(e - s for s, e, _ in post) / 1e9
    return {
        "pre_fault_ops_per_s": round(pre_rate, 1),
        "pre_fault_windows": len(pre),
        "recovery_ms": None if recovery is None else round(recovery, 1),
        "first_completion_ms": None if first_completion is None else round(first_completion, 1),
        "zero_windows": zero,
        "post_recovery_ops_per_s": round(sum(c for _, _, c in post) / post_span_s, 1) if post_span_s > 0 else None,
    }


def view_change_events(cluster: Cluster, since_unix_s: float) -> dict:
    """Milliseconds from `since_unix_s` (the fault, wall clock) to the view-change events in the replicas' INFO
    logs (whose timestamps are UTC wall-clock with millisecond resolution): the first view-change timer expiry,
    the first "view change to v<N>", and each replica's first "new view installed". Independent of the client's
    timeline resolution."""
    first: dict[str, float] = {}
    installed: dict[str, float] = {}
    for i, d in enumerate(cluster.replicas):
        try:
            lines = d.log_path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            m = _LOG_LINE.match(line)
            if not m:
                continue
            t = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(
                tzinfo=datetime.timezone.utc).timestamp()
            if t < since_unix_s - 0.001:
                continue
            ms = round((t - since_unix_s) * 1e3, 1)
            event = m.group(4)
            key = ("timer_expired_ms" if event.startswith("view change timer") else
                   "view_change_started_ms" if event.startswith("view change to") else None)
            if key is not None:
                first[key] = min(first.get(key, ms), ms)
            elif str(i) not in installed:
                installed[str(i)] = ms
    out = {"first_timer_expired_ms": first.get("timer_expired_ms"),
           "first_view_change_started_ms": first.get("view_change_started_ms"),
           "new_view_installed_ms": installed}
    done = sorted(installed.values())
    quorum = 2 * cluster.f + 1
    out["new_view_installed_by_quorum_ms"] = done[quorum - 1] if len(done) >= quorum else None
    return out


def timeline_for_json(windows, origin_ns: int) -> dict:
    """Compact timeline: window starts relative to `origin_ns` (ms) and rates (ops/s)."""
    return {
        "t_ms": [round((s - origin_ns) / 1e6, 1) for s, _, _ in windows],
        "t_end_ms": [round((e - origin_ns) / 1e6, 1) for _, e, _ in windows],
        "ops_per_s": [round(c / ((e - s) / 1e9), 1) if e > s else 0.0 for s, e, c in windows],
    }


# ---------------------------------------------------------------------------------------------------------
# Scenarios


def sleep_until_ns(t_ns: int) -> None:
    while True:
        left = (t_ns - time.monotonic_ns()) / 1e9
        if left <= 0:
            return
        time.sleep(min(left, 0.05))


def fault_run(cluster: Cluster, p: dict, use_timeline: bool, kind: str) -> dict:
    """Starts a fresh cluster and the load, injects `kind` ("crash" or "stall") at warm-up + pre_s into the
    primary, and analyses the timeline."""
    cluster.start_replicas(log_level="info")  # INFO: view-change events with timestamps, no per-request lines
    primary = cluster.primary()
    victim = cluster.replicas[primary]
    duration_s = p["pre_s"] + p["post_s"]
    load = LoadRun(cluster, LOAD_CLIENTS, duration_s, use_timeline)
    try:
        fault_ns = load.start_ns + int((WARMUP_S + p["pre_s"]) * 1e9)
        sleep_until_ns(fault_ns)
        if load.proc.poll() is not None:
            raise RuntimeError(f"load ended before the fault: {' | '.join(load.stderr_tail)}")
        if load.completed_so_far() == 0:
            raise RuntimeError("no increment completed before the fault; the cluster is not serving")
        resume_ns = None
        fault_ns = time.monotonic_ns()
        fault_unix_s = time.time()
        if kind == "crash":
            victim.signal_group(signal.SIGKILL)
            progress(f"  SIGKILL primary r{primary} (pid {victim.pid})")
        else:
            victim.signal_group(signal.SIGSTOP)
            progress(f"  SIGSTOP primary r{primary} (pid {victim.pid}) for {STALL_S} s")
            sleep_until_ns(fault_ns + int(STALL_S * 1e9))
            victim.signal_group(signal.SIGCONT)
            resume_ns = time.monotonic_ns()
            progress(f"  SIGCONT r{primary}")
        result = load.finish(timeout_s=duration_s + WARMUP_S + 90)
    finally:
        load.kill()
    statuses = {i: d.status() for i, d in enumerate(cluster.replicas) if d.alive()}
    views = {i: s.get("view") for i, s in statuses.items() if s}
    cluster.stop_replicas()
    source, windows = load.windows(result)
    out = {"primary": primary, "timeline_source": source, "ops_total": result.get("ops"),
           "retransmissions": result.get("retransmissions"), "views_after": views}
    out.update(analyse(windows, fault_ns, p["pre_s"]))
    out["view_change"] = view_change_events(cluster, fault_unix_s)
    if resume_ns is not None:
        since = analyse(windows, fault_ns, p["pre_s"], since_ns=resume_ns)
        out["resumed_at_ms"] = round((resume_ns - fault_ns) / 1e6, 1)
        out["recovery_after_resume_ms"] = (None if since["recovery_ms"] is None
                                           else round(since["recovery_ms"] - out["resumed_at_ms"], 1))
    out["timeline"] = timeline_for_json(windows, fault_ns)
    return out


def steady_measure(cluster: Cluster, p: dict, ids: list[int]) -> dict:
    """Sequential latency and closed-loop throughput with replicas `ids` running (the others never started)."""
    cluster.start_replicas(ids=ids)
    try:
        cluster.counter_fresh(["--requests", 20, "--warmup", 0], timeout_s=120)
        n = p["sequential_requests"]
        seq = cluster.counter_fresh(["--requests", n, "--warmup", 10, "--timeout-s", 30], timeout_s=300)
        tp = {}
        for k in p["backup_down_clients"]:
            r = cluster.counter_fresh(["--clients", k, "--duration-s", p["closed_loop_s"], "--warmup-s", WARMUP_S,
                                 "--timeout-s", 30], clients=k, timeout_s=120)
            tp[str(k)] = {"ops_per_s": round(r["ops_per_s"], 1), "p50_us": r["p50_us"], "p99_us": r["p99_us"],
                          "retransmissions": r.get("retransmissions")}
        return {"seq_total_ms": round(seq["total_ms"], 2), "latency_us_p50": seq["p50_us"],
                "latency_us_p99": seq["p99_us"], "sequential_retransmissions": seq.get("retransmissions"),
                "closed_loop": tp}
    finally:
        cluster.stop_replicas()


def summarize_steady(samples: list[dict], ids: list[int], p: dict) -> dict:
    """Medians over the repeated steady measurements of one configuration, with every sample kept."""
    out = {"replicas_up": ids, "sequential_requests": p["sequential_requests"], "samples": len(samples)}
    for key in ("seq_total_ms", "latency_us_p50", "latency_us_p99"):
        out[key] = median_or_none(s[key] for s in samples)
        out[key + "_samples"] = [s[key] for s in samples]
    out["closed_loop"] = {}
    for k in p["backup_down_clients"]:
        runs = [s["closed_loop"][str(k)] for s in samples]
        out["closed_loop"][str(k)] = {
            "ops_per_s": median_or_none(r["ops_per_s"] for r in runs),
            "ops_per_s_samples": [r["ops_per_s"] for r in runs],
            "p50_us": median_or_none(r["p50_us"] for r in runs),
            "p99_us": median_or_none(r["p99_us"] for r in runs),
        }
    return out


def median_or_none(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 1) if values else None


def plot(results: dict, out_dir: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    for ax, key, title in ((axes[0], "primary_crash", "Primary SIGKILLed at t=0 (stays down)"),
                           (axes[1], "primary_stall", f"Primary SIGSTOPped at t=0, SIGCONT at {STALL_S:g} s")):
        runs = results[key]["runs"]
        for i, run in enumerate(runs):
            tl = run["timeline"]
            if tl["t_ms"]:
                xs = [t / 1e3 for t in tl["t_ms"]] + [tl["t_end_ms"][-1] / 1e3]
                ax.step(xs, tl["ops_per_s"] + tl["ops_per_s"][-1:], where="post", color=f"C{i}",
                        label=f"run {i + 1}")
            if run.get("recovery_ms") is not None:
                ax.axvline(run["recovery_ms"] / 1e3, linestyle=":", color=f"C{i}", alpha=0.8)
            nv = run.get("view_change", {}).get("new_view_installed_by_quorum_ms")
            if nv is not None:
                ax.axvline(nv / 1e3, linestyle="--", color="black", alpha=0.5, linewidth=0.8)
        ax.set_ylim(bottom=0)
        ax.axvline(0, color="red", linewidth=1)
        if key == "primary_stall":
            ax.axvline(STALL_S, color="green", linewidth=1)
        ax.set_title(title + f"\n{LOAD_CLIENTS} closed-loop clients; dotted: recovery_ms; dashed: new view (2f+1)",
                     fontsize=10)
        ax.set_ylabel("increments per second")
        ax.grid(True, alpha=0.3)
        if len(runs) > 1:
            ax.legend(loc="lower right")
    source = results["primary_crash"]["runs"][0]["timeline_source"]
    axes[1].set_xlabel(f"seconds from the fault (timeline: {source})")
    fig.tight_layout()
    path = out_dir / "faults-timeline.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def crash_scenario(cluster: Cluster, p: dict, use_timeline: bool) -> dict:
    """primary_crash, repeated on fresh data: its runs and the medians over them."""
    crash_runs = []
    for rep in range(p["crash_repeats"]):
        cluster.fresh_data(f"crash{rep}")
        progress(f"primary_crash run {rep + 1}/{p['crash_repeats']}")
        crash_runs.append(fault_run(cluster, p, use_timeline, "crash"))
        progress(f"  recovery {crash_runs[-1]['recovery_ms']} ms (pre-fault "
                 f"{crash_runs[-1]['pre_fault_ops_per_s']} ops/s); view change {crash_runs[-1]['view_change']}")
    return {
        "primary_crash_recovery_ms": median_or_none(r["recovery_ms"] for r in crash_runs),
        "primary_crash_runs_not_recovered": sum(1 for r in crash_runs if r["recovery_ms"] is None),
        "primary_crash_new_view_ms": median_or_none(r["view_change"]["new_view_installed_by_quorum_ms"]
                                                    for r in crash_runs),
        "primary_crash": {"runs": crash_runs, "recovery_ms_each": [r["recovery_ms"] for r in crash_runs]},
    }


def stall_scenario(cluster: Cluster, p: dict, use_timeline: bool) -> dict:
    """primary_stall, once on fresh data."""
    cluster.fresh_data("stall")
    progress("primary_stall")
    stall = fault_run(cluster, p, use_timeline, "stall")
    progress(f"  recovery {stall['recovery_ms']} ms after SIGSTOP; view change {stall['view_change']}")
    return {
        "primary_stall_recovery_ms": stall["recovery_ms"],
        "primary_stall_new_view_ms": stall["view_change"]["new_view_installed_by_quorum_ms"],
        "primary_stall": {"stall_s": STALL_S, "runs": [stall]},
    }


def backup_down_scenario(cluster: Cluster, p: dict) -> dict:
    """backup_down against all_up, alternated so that a slow phase of the machine hits both alike."""
    up_samples, down_samples = [], []
    for rep in range(p["steady_repeats"]):
        cluster.fresh_data(f"allup{rep}")
        progress(f"all_up: sequential and closed loop (round {rep + 1}/{p['steady_repeats']})")
        up_samples.append(steady_measure(cluster, p, [0, 1, 2, 3]))
        cluster.fresh_data(f"backupdown{rep}")
        progress(f"backup_down, replica 3 never started (round {rep + 1}/{p['steady_repeats']})")
        down_samples.append(steady_measure(cluster, p, [0, 1, 2]))
        progress(f"  p50 {up_samples[-1]['latency_us_p50']:.0f} -> {down_samples[-1]['latency_us_p50']:.0f} us")
    all_up = summarize_steady(up_samples, [0, 1, 2, 3], p)
    down = summarize_steady(down_samples, [0, 1, 2], p)
    ratios = {k: (round(down["closed_loop"][k]["ops_per_s"] / all_up["closed_loop"][k]["ops_per_s"], 3)
                  if all_up["closed_loop"][k]["ops_per_s"] else None) for k in all_up["closed_loop"]}
    progress(f"  median p50 {all_up['latency_us_p50']:.0f} -> {down['latency_us_p50']:.0f} us; "
             f"throughput ratio {ratios}")
    return {"all_up": all_up, "one_backup_down": down, "throughput_ratio_down_over_up": ratios,
            "latency_p50_ratio_down_over_up": round(down["latency_us_p50"] / all_up["latency_us_p50"], 3)}


def definitions(p: dict, use_timeline: bool) -> dict:
    """What faults.json's figures mean (written into it)."""
    return {
        "load": f"{LOAD_CLIENTS} closed-loop counter clients in one bftfs counter process",
        "timeline_window_ms": TIMELINE_MS if use_timeline else "about 1000 (client progress lines)",
        "pre_fault_ops_per_s": f"mean rate over windows entirely inside [fault - {p['pre_s']} s, fault)",
        "recovery_ms": (f"end of the first window starting at or after the fault with rate >= "
                        f"{RECOVERY_FRACTION:.0%} of pre_fault_ops_per_s, minus the fault time (upper bound)"),
        "primary_crash_recovery_ms": ("median of primary_crash.runs[].recovery_ms over the runs that recovered; "
                                      "primary_crash_runs_not_recovered counts the others"),
        "primary_stall_recovery_ms": f"recovery_ms measured from SIGSTOP (SIGCONT after {STALL_S} s)",
        "backup_down": "medians over steady_repeats fresh clusters each, all-up and one-down alternated",
        "first_completion_ms": "start of the first window at or after the fault with a completion, minus the fault",
        "view_change": ("from the replicas' INFO log timestamps (UTC, 1 ms) relative to the fault's wall-clock time: "
                        "first view-change timer expiry, first 'view change to', each replica's 'new view "
                        "installed'; new_view_installed_by_quorum_ms = when the (2f+1)-th replica installed it"),
        "primary_crash_new_view_ms": "median of primary_crash.runs[].view_change.new_view_installed_by_quorum_ms",
        "timeline": "t_ms / t_end_ms: window starts / ends relative to the fault; ops_per_s: completions / width",
    }


def main() -> int:
    exit_cleanly_on_sigterm()
    bftfs = bftfs_binary()
    p = plan()
    use_timeline = "--timeline-ms" in counter_help(bftfs)
    load_start = reporting.load_average()
    before = reporting.machine_busy_before()
    progress(f"bench_faults: {'QUICK ' if reporting.quick_mode() else ''}plan {p}; timeline "
             f"{'--timeline-ms ' + str(TIMELINE_MS) if use_timeline else 'from 1 s progress lines (no --timeline-ms)'}"
             f"; before start: {before}")
    started = time.monotonic()
    results: dict = {}
    with Cluster(bftfs, f=1, clients=256, log_level="warn", keep=reporting.keep_scratch()) as cluster:
        results.update(crash_scenario(cluster, p, use_timeline))
        results.update(stall_scenario(cluster, p, use_timeline))
        results["backup_down"] = backup_down_scenario(cluster, p)
    results["definitions"] = definitions(p, use_timeline)
    results["meta"] = reporting.run_metadata(loadavg_1_5_15_start=load_start, machine_before_start=before,
                                             wall_time_s=round(time.monotonic() - started, 1), plan=p,
                                             timeline_source="client-timeline" if use_timeline else "progress-lines",
                                             replicas=4, f=1, transport="TCP on 127.0.0.1", replicas_fsync=True)
    out_dir = reporting.RESULTS_DIR
    reporting.write_json(out_dir / "faults.json", results)
    path = plot(results, out_dir)
    progress(f"wrote {out_dir / 'faults.json'} and {path}")
    print(f"primary crash recovery {results['primary_crash_recovery_ms']} ms (median; runs "
          f"{results['primary_crash']['recovery_ms_each']}); primary stall recovery "
          f"{results['primary_stall_recovery_ms']} ms; one backup down: throughput x"
          f"{results['backup_down']['throughput_ratio_down_over_up']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
