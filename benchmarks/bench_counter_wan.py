#!/usr/bin/env python3
"""The PBFT-CS counter benchmark across emulated wide-area topologies (Wester et al., NSDI'09 §6.1, Figures 3,
4 and 9), on 4 replicas (f = 1) on loopback with one-way delays added in user space by the transport
(`--wan-delay-ms`, `--wan-site`; this kernel has no netem).

Topologies (§6): every replica is its own site and the one-way delay between two sites is D (2.5 or 15 ms);
  lan             D = 0
  primary_local   the client is at the primary's site (replica 0, the primary of view 0)
  primary_remote  the client is at a backup's site (replica 1)
  uniform         the client is at no site: D to every replica
NO-REP runs its one server at replica 0's site; as in the paper, a client at a site reaches it over the LAN
(no delay in primary_local and primary_remote), a client at no site pays D each way.

Systems, all with the same counter, transport, authentication and client code:
  norep     `bftfs norep`, `bftfs counter --norep`
  pbft      replicas without PBFT-CS, a client that waits for the consensus reply (f+1 committed or 2f+1
            tentative) before sending the next increment
  pbftcs    replicas with `--shim --early-replies`, `bftfs counter --spec`: the client sends the next
            increment on the primary's early reply, predicated on it, up to 64 in flight
  pbftcs4   the same limited to 4 increments in flight (PBFT-CS(4) of the paper)

Measurements (each from `bftfs counter --json`, which times itself with CLOCK_MONOTONIC):
  seq2000_ms      one client, 2000 increments each presenting the previous reply's token (QUICK=1: 200, reported
                  under the same key), for every system, topology and delay
  peak_ops_per_s  closed-loop clients 1..32 on the LAN for pbft and pbftcs (PBFT-CS clients limited to 4 in
                  flight, as the paper did for throughput), the best point. Both clusters run side by side and
                  the two systems' runs alternate, 3 rounds (QUICK=1: 1), so a disturbance on this shared 2-core
                  machine hits both; each point is the median of its rounds.
  faulty          PBFT-CS with the primary corrupting 1% of its early replies (`--corrupt-early-replies 0.01`), in
                  the primary-local topology at 0, 2.5 and 15 ms (Figure 9). seq2000_ms_faulty_1pct: the client
                  keeps speculating (`--spec-failure-window 0`), as in the paper's experiment, so the number is
                  the cost of the failed speculations; ..._distrust_rule: the default client, which stops
                  speculating on a primary while more than 1% of its last 100 early replies failed (§3.4) - at a
                  lie rate right at the threshold it spends long stretches without speculation. Both with the
                  slowdown against the fault-free run. The client checks itself that no increment relying on a
                  wrong prediction executed and that the counter moved by exactly the committed increments
                  (a violation fails the run)

Output: bench-results/counter-wan.json (keys points, by_topology, throughput, faulty, targets, meta),
bench-results/counter-wan.png (time per topology and delay) and counter-wan-throughput.png.
Environment: BUILD (or BFTFS_BUILD), QUICK=1 (a few minutes), BENCH_KEEP=1 keeps the scratch directory,
BENCH_PARTS=sequential,throughput,faulty (default all) re-measures only those parts and keeps the others from the
existing bench-results/counter-wan.json (faulty needs the sequential part's fault-free runs).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the harness package

import reporting  # noqa: E402
from harness.binaries import bftfs_binary  # noqa: E402
from harness.cluster import Cluster, wan_args  # noqa: E402
from harness.counter import run_counter  # noqa: E402
from harness.log import progress  # noqa: E402
from harness.procs import exit_cleanly_on_sigterm  # noqa: E402

TOPOLOGIES = ("lan", "primary_local", "primary_remote", "uniform")
SYSTEMS = ("norep", "pbft", "pbftcs", "pbftcs4")
CLIENT_SITE = {"primary_local": 0, "primary_remote": 1}  # replica whose site the client shares; uniform: none
PBFTCS_REPLICA_ARGS = ["--shim", "--early-replies"]
# Across the WAN the replicas (PBFT and PBFT-CS alike) keep up to 4 batches in agreement at once instead of 1:
# a batch takes 3-4 one-way delays to commit, and with one batch at a time a speculating client's 64 increments
# in flight wait for whole batch cycles. A lone sequential PBFT client has one request in flight, so the setting
# does not change its numbers. The LAN points and the throughput curve use the default (1).
WAN_REPLICA_ARGS = ["--batch-window", "4"]


def plan() -> dict:
    if reporting.quick_mode():
        return {"requests": 200, "delays": [2.5, 15.0], "clients": [1, 8, 32], "duration_s": 2.0,
                "warmup_s": 0.5, "fault_delays": [0.0, 2.5, 15.0], "rounds": 1}
    return {"requests": 2000, "delays": [2.5, 15.0], "clients": [1, 2, 4, 8, 16, 32], "duration_s": 3.0,
            "warmup_s": 0.5, "fault_delays": [0.0, 2.5, 15.0], "rounds": 3}


def sequential(cluster: Cluster, system: str, topology: str, delay_ms: float, p: dict,
               replica_extra: list[str] | None = None, client_extra: list[str] | None = None) -> dict:
    """Starts `system` fresh in the topology, runs one warm-up and one sequential measurement, stops it."""
    n = p["requests"]
    norep = system == "norep"
    warm, measured = cluster.take_clients(1), cluster.take_clients(1)
    if norep:
        at_site = topology in CLIENT_SITE
        sites = {warm: 0, measured: 0} if at_site else {}
        wan = wan_args(0.0 if at_site else delay_ms, sites)
    else:
        site = CLIENT_SITE.get(topology)
        sites = {} if site is None else {warm: site, measured: site}
        wan = wan_args(delay_ms, sites)
    cluster.fresh_data(f"{system}-{topology}-{delay_ms:g}-{len(replica_extra or [])}")
    if norep:
        cluster.start_norep(wan)
    else:
        extra = PBFTCS_REPLICA_ARGS if system.startswith("pbftcs") else []
        if delay_ms > 0:
            extra = extra + WAN_REPLICA_ARGS
        cluster.start_replicas(extra + list(replica_extra or []) + wan)
    client = {"norep": [], "pbft": [], "pbftcs": ["--spec", "--spec-window", 64],
              "pbftcs4": ["--spec", "--spec-window", 4]}[system] + list(client_extra or [])
    # Each request costs a few delays; allow plenty before the client's own no-progress watchdog fires.
    timeout = 60 + n * (6 * delay_ms / 1000 + 0.05)
    try:
        run_counter(cluster.counter_argv(warm, norep=norep, extra=client + ["--requests", 10, "--warmup", 0] + wan),
                    timeout)
        r = run_counter(cluster.counter_argv(measured, norep=norep, extra=client + [
            "--requests", n, "--warmup", 10, "--timeout-s", 30] + wan), timeout)
    finally:
        if norep:
            cluster.stop_norep()
        else:
            cluster.stop_replicas()
    out = {"seq2000_ms": round(r["total_ms"], 3), "requests": n, "p50_us": r.get("p50_us")}
    for key in ("first_p50_us", "rollbacks", "retries", "violations", "counter_delta", "committed",
                "first_mismatches", "first_withheld_distrusted", "retransmissions"):
        if key in r:
            out[key] = r[key]
    return out


def throughput(bftfs: Path, p: dict) -> dict:
    """Closed-loop throughput on the LAN for 1..32 clients, PBFT and PBFT-CS (clients with 4 in flight) side
    by side: both clusters are up, and their runs alternate point by point and round by round."""
    client = {"pbft": [], "pbftcs": ["--spec", "--spec-window", 4]}
    samples: dict = {s: {str(k): [] for k in p["clients"]} for s in client}
    with Cluster(bftfs, f=1, clients=512, log_level="warn", keep=reporting.keep_scratch()) as cp, \
            Cluster(bftfs, f=1, clients=512, log_level="warn", keep=reporting.keep_scratch()) as cc:
        clusters = {"pbft": cp, "pbftcs": cc}
        cp.fresh_data("pbft-throughput")
        cp.start_replicas([])
        cc.fresh_data("pbftcs-throughput")
        cc.start_replicas(PBFTCS_REPLICA_ARGS)
        for system, cluster in clusters.items():
            cluster.counter_fresh(client[system] + ["--requests", 20, "--warmup", 0], timeout_s=60)
        for rnd in range(p["rounds"]):
            for k in p["clients"]:
                for system, cluster in clusters.items():
                    r = cluster.counter_fresh(client[system] + ["--clients", k, "--duration-s", p["duration_s"],
                                                                "--warmup-s", p["warmup_s"], "--timeout-s", 20],
                                              clients=k, timeout_s=90 + p["duration_s"])
                    samples[system][str(k)].append(round(r["ops_per_s"], 1))
                    progress(f"{system}: {k:2d} clients: {r['ops_per_s']:8.0f} ops/s (p50 {r['p50_us']:.0f} us; "
                             f"round {rnd + 1}/{p['rounds']})")
    out = {}
    for system, points in samples.items():
        med = {k: sorted(v)[(len(v) - 1) // 2] for k, v in points.items()}
        out[system] = {"peak_ops_per_s": max(med.values()), "throughput": med, "samples": points}
    return out


def faulty_runs(cluster: Cluster, by: dict, p: dict) -> dict:
    """PBFT-CS with a primary lying in 1% of its early replies, always speculating and with the §3.4 rule."""
    faulty = {}
    for delay in p["fault_delays"]:
        topology = "primary_local" if delay > 0 else "lan"
        clean = by[topology][f"{delay:g}"]["pbftcs"]["seq2000_ms"]
        point: dict = {"seq2000_ms_fault_free": clean}
        for name, client_extra in (("always_speculating", ["--spec-failure-window", "0"]), ("distrust_rule", [])):
            run = sequential(cluster, "pbftcs", topology, delay, p, ["--corrupt-early-replies", "0.01"],
                             client_extra)
            run["slowdown"] = ratio(run["seq2000_ms"], clean)
            point[name] = run
            progress(f"faulty 1% {topology} {delay:g} ms, {name.replace('_', ' ')}: {run['seq2000_ms'] / 1000:.2f} s "
                     f"(x{run['slowdown']} of fault-free; rollbacks {run.get('rollbacks')}, violations "
                     f"{run.get('violations')}, counter moved {run.get('counter_delta')} for {run.get('committed')} "
                     f"committed)")
        point["seq2000_ms_faulty_1pct"] = point["always_speculating"]["seq2000_ms"]
        point["slowdown"] = point["always_speculating"]["slowdown"]
        point["seq2000_ms_faulty_1pct_distrust_rule"] = point["distrust_rule"]["seq2000_ms"]
        point["slowdown_distrust_rule"] = point["distrust_rule"]["slowdown"]
        faulty[f"{delay:g}"] = point
    return faulty


def ratio(a, b):
    return round(a / b, 3) if a and b else None


def targets(by: dict, tput: dict) -> dict:
    """The issue's targets, evaluated on these numbers."""
    lan = by["lan"]["0"]
    u15 = by["uniform"]["15"]
    l15 = by["primary_local"]["15"]
    out = {
        "lan_pbftcs_over_pbft_time": ratio(lan["pbftcs"]["seq2000_ms"], lan["pbft"]["seq2000_ms"]),
        "uniform15_pbftcs_over_norep_time": ratio(u15["pbftcs"]["seq2000_ms"], u15["norep"]["seq2000_ms"]),
        "uniform15_pbft_over_pbftcs_time": ratio(u15["pbft"]["seq2000_ms"], u15["pbftcs"]["seq2000_ms"]),
        "primary_local15_pbft_over_pbftcs_time": ratio(l15["pbft"]["seq2000_ms"], l15["pbftcs"]["seq2000_ms"]),
        "peak_pbftcs_over_pbft": ratio(tput["pbftcs"]["peak_ops_per_s"], tput["pbft"]["peak_ops_per_s"]),
    }
    out["met"] = {
        "lan_pbftcs_at_most_half_pbft": out["lan_pbftcs_over_pbft_time"] is not None
        and out["lan_pbftcs_over_pbft_time"] <= 0.5,
        "uniform15_pbftcs_within_2pct_of_norep": out["uniform15_pbftcs_over_norep_time"] is not None
        and out["uniform15_pbftcs_over_norep_time"] <= 1.02,
        "uniform15_pbftcs_2x_faster_than_pbft": out["uniform15_pbft_over_pbftcs_time"] is not None
        and out["uniform15_pbft_over_pbftcs_time"] >= 2.0,
        "primary_local15_pbft_30x_slower": out["primary_local15_pbft_over_pbftcs_time"] is not None
        and out["primary_local15_pbft_over_pbftcs_time"] >= 30.0,
        "peak_pbftcs_at_least_0.9_pbft": out["peak_pbftcs_over_pbft"] is not None
        and out["peak_pbftcs_over_pbft"] >= 0.9,
    }
    return out


def plot(results: dict, out_dir: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {"norep": "NO-REP", "pbft": "PBFT", "pbftcs": "PBFT-CS", "pbftcs4": "PBFT-CS (4)"}
    by = results["by_topology"]
    delays = ["0"] + [f"{d:g}" for d in results["meta"]["delays_ms"]]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4), sharey=True)
    for ax, topology in zip(axes, ("primary_local", "primary_remote", "uniform")):
        for system in SYSTEMS:
            ys = [by[topology][d][system]["seq2000_ms"] / 1000 for d in delays]
            ax.plot([float(d) for d in delays], ys, marker="o", label=labels[system])
        ax.set_title(topology.replace("_", "-"))
        ax.set_xlabel("one-way delay between sites (ms)")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    n = results["meta"]["requests"]
    axes[0].set_ylabel(f"time for {n} sequential increments (s, log)")
    axes[0].legend()
    fig.suptitle("Counter across emulated WAN topologies (4 replicas, f=1)")
    fig.tight_layout()
    written = [out_dir / "counter-wan.png"]
    fig.savefig(written[0], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for system in ("pbft", "pbftcs"):
        t = results["throughput"][system]["throughput"]
        ks = sorted(t, key=int)
        ax.plot([int(k) for k in ks], [t[k] for k in ks], marker="o", label=labels[system])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("closed-loop clients (PBFT-CS: 4 in flight each)")
    ax.set_ylabel("increments per second")
    ax.set_title("Counter throughput on the LAN")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    written.append(out_dir / "counter-wan-throughput.png")
    fig.savefig(written[1], dpi=120)
    plt.close(fig)
    return written


def main() -> int:
    exit_cleanly_on_sigterm()
    bftfs = bftfs_binary()
    p = plan()
    parts = set((os.environ.get("BENCH_PARTS") or "sequential,throughput,faulty").split(","))
    unknown = parts - {"sequential", "throughput", "faulty"}
    if unknown:
        raise SystemExit(f"BENCH_PARTS: unknown parts {sorted(unknown)}")
    previous: dict = {}
    out_path = reporting.RESULTS_DIR / "counter-wan.json"
    if parts != {"sequential", "throughput", "faulty"}:
        previous = json.loads(out_path.read_text())
    before = reporting.machine_busy_before()
    progress(f"bench_counter_wan: {'QUICK ' if reporting.quick_mode() else ''}plan {p}; parts {sorted(parts)}; "
             f"before start: {before}")
    started = time.monotonic()
    points: list[dict] = previous.get("points", [])
    by: dict = previous.get("by_topology", {t: {} for t in TOPOLOGIES})
    configs = [("lan", 0.0)] + [(t, d) for d in p["delays"] for t in TOPOLOGIES if t != "lan"]
    tput = previous.get("throughput", {})
    faulty = previous.get("faulty", {})
    if "throughput" in parts:
        tput = throughput(bftfs, p)
    with Cluster(bftfs, f=1, clients=512, log_level="warn", keep=reporting.keep_scratch()) as cluster:
        if "sequential" in parts:
            points, by = [], {t: {} for t in TOPOLOGIES}
            for topology, delay in configs:
                point = {"topology": topology, "delay_ms": delay}
                for system in SYSTEMS:
                    point[system] = sequential(cluster, system, topology, delay, p)
                    progress(f"{topology} {delay:g} ms {system}: {point[system]['seq2000_ms'] / 1000:.2f} s")
                points.append(point)
                by[topology][f"{delay:g}"] = {s: point[s] for s in SYSTEMS}
            # With no delay the topologies coincide: the LAN point is their 0 ms point.
            for topology in TOPOLOGIES:
                by[topology].setdefault("0", by["lan"]["0"])
        if "faulty" in parts:
            faulty = faulty_runs(cluster, by, p)
    results = {
        "points": points,
        "by_topology": by,
        "throughput": tput,
        "peak_ops_per_s": {s: tput[s]["peak_ops_per_s"] for s in tput},
        "faulty": faulty,
        "seq2000_ms_faulty_1pct": {"pbftcs": {d: v["seq2000_ms_faulty_1pct"] for d, v in faulty.items()}},
        "seq2000_ms_faulty_1pct_distrust_rule": {
            "pbftcs": {d: v["seq2000_ms_faulty_1pct_distrust_rule"] for d, v in faulty.items()}},
    }
    results["targets"] = targets(by, tput)
    results["meta"] = reporting.run_metadata(
        machine_before_start=before, wall_time_s=round(time.monotonic() - started, 1), requests=p["requests"],
        delays_ms=p["delays"], closed_loop_clients=p["clients"], closed_loop_duration_s=p["duration_s"],
        replicas=4, f=1, transport="TCP on 127.0.0.1 with user-space one-way delays per link",
        parts_measured=sorted(parts),
        note=("seq2000_ms is the total time of the sequential run whatever its length (meta.requests); "
              "by_topology[t]['0'] is the LAN point for every topology"))
    if previous:
        # The parts not re-measured come from this earlier run.
        results["meta"]["earlier_run"] = previous.get("meta", {}).get("earlier_run", previous.get("meta"))
    out_dir = reporting.RESULTS_DIR
    reporting.write_json(out_dir / "counter-wan.json", results)
    written = plot(results, out_dir)
    progress(f"wrote {out_dir / 'counter-wan.json'} and {', '.join(str(w) for w in written)}")
    print(f"targets: {results['targets']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
