#!/usr/bin/env python3
"""The counter benchmark (PBFT-CS, NSDI'09 §6.1): a 4-replica PBFT cluster (f = 1) on loopback against NO-REP.

Systems, all with the same counter service, transport, authentication and client code:
  norep          `bftfs norep`: one server that executes each request at once and replies (no agreement, no log)
  norep_durable  extra: `bftfs norep --durable`, the same server group-committing a log before it replies (the
                 durability promise the replicas make), for a like-for-like comparison
  pbft           4 `bftfs replica` processes with batching (the default)
  pbft_nobatch   the same with `--no-batching` (one request per pre-prepare)
  pbft_nofsync   extra, for context: batching but `--no-fsync` (NOT durable), showing what the log's fdatasync
                 costs on this disk

Measurements, each from `bftfs counter --json` (the client times its own requests with CLOCK_MONOTONIC):
  sequential     one client, N increments back to back (N = 2000; QUICK=1: 200): total time, p50/p99 latency
                 (the first 10 requests are excluded from the percentiles, not from the total time)
  closed loop    K clients in one client process (K = 1,2,4,8,16,32; QUICK=1: 1,8,32), each issuing its next
                 increment as soon as the previous one completed, for a fixed duration after a warm-up:
                 throughput in completed increments per second
Each measurement runs 3 times (QUICK=1: once) and the median is reported, with every sample in the JSON; the
rounds interleave the systems (every system once, then again), each started fresh in every round, so that a
slow spell of the machine hits every system alike.

Every configuration starts from fresh replicas with empty data directories. Output:
  bench-results/counter.json             keys norep, norep_durable, pbft, pbft_nobatch, pbft_nofsync, norep_placement,
                                         ratios,
                                         meta
  bench-results/counter-throughput.png   ops/s against clients, one line per system
  bench-results/counter-latency.png      sequential p50/p99, and closed-loop p50 against clients

Environment: BUILD (or BFTFS_BUILD) selects the build directory; QUICK=1 runs in about a minute;
BENCH_NOREP_DURABLE=1 runs NO-REP with --durable (group-committed log, like the replicas); BENCH_KEEP=1
keeps the scratch directory with the daemons' logs and data.
Progress goes to stderr. Every process started is killed on exit, including on errors and Ctrl-C.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the harness package

import reporting  # noqa: E402
from harness.binaries import bftfs_binary  # noqa: E402
from harness.cluster import Cluster  # noqa: E402
from harness.log import progress  # noqa: E402
from harness.procs import exit_cleanly_on_sigterm  # noqa: E402

SYSTEMS = ("norep", "norep_durable", "pbft", "pbft_nobatch", "pbft_nofsync")
REPLICA_ARGS = {"pbft": [], "pbft_nobatch": ["--no-batching"], "pbft_nofsync": ["--no-fsync"]}


def plan() -> dict:
    # Every measurement is repeated `repeats` times (rounds interleave the client counts, so a disturbance
    # such as another process's disk burst spreads over the points instead of spoiling one); the median is
    # reported and every sample is kept. On a shared 2-core machine single runs vary by 2x.
    if reporting.quick_mode():
        return {"sequential_requests": 200, "clients": [1, 8, 32], "duration_s": 2.0, "warmup_s": 0.5,
                "repeats": 1}
    return {"sequential_requests": 2000, "clients": [1, 2, 4, 8, 16, 32], "duration_s": 3.0, "warmup_s": 0.5,
            "repeats": 3}


def median_run(runs: list[dict], key: str) -> dict:
    """The run whose `key` is the median (the lower middle one for an even count)."""
    ordered = sorted(runs, key=lambda r: r[key])
    return ordered[(len(ordered) - 1) // 2]


def measure_round(cluster: Cluster, system: str, p: dict, norep_args: list[str], rnd: int) -> dict:
    """Starts `system` fresh and runs one round: one sequential run and one closed-loop run per client count."""
    cluster.fresh_data(f"{system}-round{rnd + 1}")
    norep = system.startswith("norep")
    if norep:
        # norep_durable group-commits its own log (one fdatasync per loop pass, before replying), the same
        # durability promise the replicas make, for a like-for-like comparison; the targets use plain norep.
        cluster.start_norep(norep_args + (["--durable"] if system == "norep_durable" else []))
    else:
        cluster.start_replicas(REPLICA_ARGS[system])
    try:
        # One short run first so the measured runs do not include the servers' first-connection setup.
        cluster.counter_fresh(["--requests", 20, "--warmup", 0], norep=norep, timeout_s=60)
        n = p["sequential_requests"]
        seq = cluster.counter_fresh(["--requests", n, "--warmup", 10, "--timeout-s", 20], norep=norep,
                              timeout_s=120 + n * 0.05)
        progress(f"{system}: sequential {n} increments: {seq['total_ms']:.1f} ms, p50 {seq['p50_us']:.1f} us, "
                 f"p99 {seq['p99_us']:.1f} us (round {rnd + 1}/{p['repeats']})")
        loops: dict[str, dict] = {}
        for k in p["clients"]:
            r = cluster.counter_fresh(["--clients", k, "--duration-s", p["duration_s"], "--warmup-s",
                                 p["warmup_s"], "--timeout-s", 20], clients=k, norep=norep,
                                timeout_s=60 + p["duration_s"] + p["warmup_s"])
            loops[str(k)] = r
            progress(f"{system}: {k:2d} clients: {r['ops_per_s']:9.0f} ops/s (p50 {r['p50_us']:.0f} us, "
                     f"retransmissions {r.get('retransmissions', 0)}; round {rnd + 1}/{p['repeats']})")
        return {"seq": seq, "loops": loops, "wal": wal_stats(cluster) if not norep else None}
    finally:
        if norep:
            cluster.stop_norep()
        else:
            cluster.stop_replicas()


def summarize(rounds: list[dict], p: dict) -> dict:
    """One system's result from its rounds: medians, with every sample kept."""
    seqs = [r["seq"] for r in rounds]
    seq = median_run(seqs, "total_ms")
    throughput: dict[str, float] = {}
    detail: dict[str, dict] = {}
    for k in p["clients"]:
        runs = [r["loops"][str(k)] for r in rounds]
        med = median_run(runs, "ops_per_s")
        throughput[str(k)] = round(med["ops_per_s"], 1)
        detail[str(k)] = {key: med[key] for key in ("ops", "duration_s", "p50_us", "p99_us", "mean_us",
                                                    "retransmissions", "resyncs") if key in med}
        detail[str(k)]["ops_per_s_samples"] = [round(r["ops_per_s"], 1) for r in runs]
    return {
        "seq2000_ms": round(seq["total_ms"], 3),
        "sequential_requests": p["sequential_requests"],
        "latency_us_p50": round(seq["p50_us"], 2),
        "latency_us_p99": round(seq["p99_us"], 2),
        "latency_us_mean": round(seq["mean_us"], 2),
        "sequential_retransmissions": seq.get("retransmissions"),
        "seq_ms_samples": [round(r["total_ms"], 3) for r in seqs],
        "latency_us_p50_samples": [round(r["p50_us"], 2) for r in seqs],
        "peak_ops_per_s": max(throughput.values()),
        "throughput": throughput,
        "closed_loop": detail,
        "replica_log": rounds[-1]["wal"],
    }


def norep_placement(cluster: Cluster, p: dict, norep_args: list[str]) -> dict | None:
    """NO-REP's sequential latency with the server and the client pinned (taskset) to the same CPU and to
    different CPUs. On this kind of VM a wake-up across CPUs costs tens of microseconds, so NO-REP's unpinned
    latency is bimodal (about 11 us or about 60 us per increment, whichever placement the scheduler picks); this
    shows both modes next to the unpinned figure. PBFT's five processes on two CPUs cannot avoid cross-CPU
    wake-ups, so its figures are not pinned. None when taskset or a second CPU is missing."""
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        return None
    cluster.fresh_data("norep-pinned")
    cluster.start_norep(norep_args, prefix=["taskset", "-c", "0"])
    try:
        n = p["sequential_requests"]
        out = {}
        for name, cpu in (("same_cpu", "0"), ("other_cpu", "1")):
            runs = [cluster.counter_fresh(["--requests", n, "--warmup", 10], norep=True, timeout_s=120,
                                    prefix=["taskset", "-c", cpu]) for _ in range(p["repeats"])]
            med = median_run(runs, "total_ms")
            out[name] = {"seq_ms": round(med["total_ms"], 3), "latency_us_p50": med["p50_us"],
                         "latency_us_p99": med["p99_us"], "seq_ms_samples": [round(r["total_ms"], 3) for r in runs]}
            progress(f"norep pinned, client on {name.replace('_', ' ')}: p50 {med['p50_us']:.1f} us")
        return out
    finally:
        cluster.stop_norep()


def wal_stats(cluster: Cluster) -> dict:
    """The replicas' write-ahead-log sync statistics over the whole run (status.json "log" object; refreshed
    about every 500 ms, so the last few hundred ms may be missing): what each fdatasync cost on this disk."""
    syncs, avg, mx = [], [], []
    for i in range(cluster.n):
        log = (cluster.status(i) or {}).get("log", {})
        syncs.append(log.get("wal_syncs"))
        avg.append(log.get("wal_sync_us_avg"))
        mx.append(log.get("wal_sync_us_max"))
    return {"wal_syncs": syncs, "wal_sync_us_avg": avg, "wal_sync_us_max": mx}


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b and not math.isnan(a) and not math.isnan(b) else None


def ratios(results: dict) -> dict:
    out = {}
    for base in ("norep", "norep_durable"):
        for system in ("pbft", "pbft_nobatch", "pbft_nofsync"):
            s, n = results[system], results[base]
            out[f"{system}_over_{base}_latency_p50"] = ratio(s["latency_us_p50"], n["latency_us_p50"])
            out[f"{system}_over_{base}_latency_p99"] = ratio(s["latency_us_p99"], n["latency_us_p99"])
            out[f"{system}_over_{base}_seq_time"] = ratio(s["seq2000_ms"], n["seq2000_ms"])
            out[f"{system}_over_{base}_peak_throughput"] = ratio(s["peak_ops_per_s"], n["peak_ops_per_s"])
    return out


def plot(results: dict, out_dir: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {"norep": "NO-REP", "norep_durable": "NO-REP, durable log", "pbft": "PBFT (batching)", "pbft_nobatch": "PBFT (no batching)",
              "pbft_nofsync": "PBFT, no fsync (not durable)"}
    styles = {"pbft_nofsync": "--", "norep_durable": ":"}
    written = []

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for system in SYSTEMS:
        t = results[system]["throughput"]
        ks = sorted(t, key=int)
        ax.plot([int(k) for k in ks], [t[k] for k in ks], styles.get(system, "-"), marker="o", label=labels[system])
    ks_all = sorted({int(k) for system in SYSTEMS for k in results[system]["throughput"]})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks_all, [str(k) for k in ks_all])
    ax.set_yscale("log")  # NO-REP and PBFT differ by more than an order of magnitude
    ax.set_xlabel("closed-loop clients")
    ax.set_ylabel("increments per second (log)")
    ax.set_title("Counter throughput (4 replicas, f=1, loopback)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out_dir / "counter-throughput.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    xs = range(len(SYSTEMS))
    ax1.bar([x - 0.2 for x in xs], [results[s]["latency_us_p50"] for s in SYSTEMS], width=0.4, label="p50")
    ax1.bar([x + 0.2 for x in xs], [results[s]["latency_us_p99"] for s in SYSTEMS], width=0.4, label="p99")
    ax1.set_xticks(list(xs), [labels[s].replace(" (", "\n(").replace(", ", ",\n") for s in SYSTEMS], fontsize=8)
    ax1.set_yscale("log")
    ax1.set_ylabel("latency (us)")
    n = results["pbft"]["sequential_requests"]
    ax1.set_title(f"One client, {n} sequential increments")
    ax1.legend()
    ax1.grid(True, axis="y", alpha=0.3)
    for system in SYSTEMS:
        d = results[system]["closed_loop"]
        ks = sorted(d, key=int)
        ax2.plot([int(k) for k in ks], [d[k]["p50_us"] for k in ks], styles.get(system, "-"), marker="o",
                 label=labels[system])
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(ks_all, [str(k) for k in ks_all])
    ax2.set_yscale("log")
    ax2.set_xlabel("closed-loop clients")
    ax2.set_ylabel("p50 latency (us)")
    ax2.set_title("Closed-loop latency")
    ax2.grid(True, alpha=0.3)
    ax2.legend()
    fig.tight_layout()
    path = out_dir / "counter-latency.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)
    return written


def main() -> int:
    exit_cleanly_on_sigterm()
    bftfs = bftfs_binary()
    p = plan()
    load_start = reporting.load_average()
    before = reporting.machine_busy_before()
    norep_args = ["--durable"] if os.environ.get("BENCH_NOREP_DURABLE") == "1" else []
    progress(f"bench_counter: {'QUICK ' if reporting.quick_mode() else ''}plan {p}; before start: {before}")
    results: dict = {}
    started = time.monotonic()
    max_clients = max(p["clients"])
    # Enough client identities that no measured run reuses one (see Cluster.take_clients).
    pool = 1 + p["repeats"] * (1 + sum(p["clients"])) + 2 * p["repeats"] + 2
    with Cluster(bftfs, f=1, clients=pool * len(SYSTEMS) + max_clients, log_level="warn",
                 keep=reporting.keep_scratch()) as cluster:
        # Rounds interleave the systems (norep, norep_durable, pbft, ... then again), so that a slow spell of
        # this shared machine hits every system alike instead of spoiling one system's every sample.
        rounds: dict[str, list[dict]] = {system: [] for system in SYSTEMS}
        for rnd in range(p["repeats"]):
            for system in SYSTEMS:
                rounds[system].append(measure_round(cluster, system, p, norep_args, rnd))
        for system in SYSTEMS:
            results[system] = summarize(rounds[system], p)
        results["norep_placement"] = norep_placement(cluster, p, norep_args)
    results["ratios"] = ratios(results)
    results["meta"] = reporting.run_metadata(
        loadavg_1_5_15_start=load_start, machine_before_start=before,
        wall_time_s=round(time.monotonic() - started, 1),
        sequential_requests=p["sequential_requests"],
        sequential_warmup_excluded_from_percentiles=10,
        closed_loop_clients=p["clients"],
        closed_loop_duration_s=p["duration_s"],
        closed_loop_warmup_s=p["warmup_s"],
        repeats=p["repeats"],
        aggregation=("rounds interleave the systems, each system started fresh in every round; median over "
                     "rounds: seq2000_ms/latency_us_* from the run with the median total time; "
                     "throughput[k] and closed_loop[k] from the run with the median ops/s"),
        replicas=4,
        f=1,
        transport="TCP on 127.0.0.1",
        transport_sharing=("the same client library and transport for every system: the K closed-loop clients of "
                           "the one client process share one connection per replica (PBFT) or to the server "
                           "(NO-REP), each with its own keys; servers send each loop pass's frames for one "
                           "connection with one system call"),
        replica_log=("group commit on a sync thread: PRE-PREPARE, PREPARE, STATUS and fetches leave while a "
                     "group is being written; COMMIT, CHECKPOINT, view-change messages and replies wait until "
                     "the records before them are durable (protocol/effects.h send_waits_for_log)"),
        replicas_fsync="yes (fdatasync of the write-ahead log) for pbft and pbft_nobatch; no for pbft_nofsync",
        norep_durable=bool(norep_args),
        note=("seq2000_ms is the total time of the sequential run whatever its length "
              "(meta.sequential_requests); throughput keys are closed-loop client counts"),
    )
    out_dir = reporting.RESULTS_DIR
    reporting.write_json(out_dir / "counter.json", results)
    written = plot(results, out_dir)
    progress(f"wrote {out_dir / 'counter.json'} and {', '.join(str(w) for w in written)}")
    r = results["ratios"]
    print(f"norep: seq {results['norep']['seq2000_ms']} ms, peak {results['norep']['peak_ops_per_s']} ops/s; "
          f"pbft: seq {results['pbft']['seq2000_ms']} ms, peak {results['pbft']['peak_ops_per_s']} ops/s; "
          f"pbft/norep latency p50 x{r['pbft_over_norep_latency_p50']}, "
          f"throughput x{r['pbft_over_norep_peak_throughput']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
