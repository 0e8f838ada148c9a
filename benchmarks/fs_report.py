"""bench_fs.py's results: medians over repeats, ratios between systems, the plot and the tables on stdout."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from harness.andrew import PHASE_TITLES, PHASES
from harness.log import progress

SYSTEM_LABELS = {"native": "native", "local": "FUSE local", "norep": "NO-REP", "pbft": "PBFT (f=1)"}
NUMERIC_KEYS = ("grep_s", "write_s", "create100_s", *(f"andrew_{p}_s" for p in PHASES), "andrew_total_s")


def summarize(runs: list[dict]) -> dict:
    out: dict = {k: round(statistics.median(r[k] for r in runs), 4) for k in NUMERIC_KEYS}
    if len(runs) > 1:
        out["spread"] = {k: [round(min(r[k] for r in runs), 4), round(max(r[k] for r in runs), 4)]
                         for k in NUMERIC_KEYS}
    out["andrew_service_cpu_s"] = {p: round(statistics.median(r["andrew_service_cpu_s"][p] for r in runs), 3)
                                   for p in PHASES}
    if all("andrew_requests" in r for r in runs):
        # Requests per phase (the relay's counters): median over repeats of each key.
        out["andrew_requests"] = {
            p: {k: int(statistics.median(r["andrew_requests"].get(p, {}).get(k, 0) for r in runs))
                for k in sorted({k for r in runs for k in r["andrew_requests"].get(p, {})})}
            for p in PHASES}
    out["runs"] = [{**{k: round(r[k], 4) for k in NUMERIC_KEYS}, "andrew_service_cpu_s": r["andrew_service_cpu_s"],
                    **({"andrew_requests": r["andrew_requests"]} if "andrew_requests" in r else {})}
                   for r in runs]
    if runs and runs[0].get("system"):
        out["system"] = runs[0]["system"]
    return out


def ratios(systems: dict) -> dict:
    out = {}
    for a, b in (("pbft", "norep"), ("norep", "local"), ("local", "native"), ("pbft", "native")):
        if a in systems and b in systems:
            out[f"{a}_over_{b}"] = {k: round(systems[a][k] / systems[b][k], 3) if systems[b][k] else None
                                    for k in NUMERIC_KEYS}
    return out


def plot(path: Path, systems: dict, title: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        progress("matplotlib missing: no plot (make deps installs it)")
        return
    names = list(systems)
    labels = [SYSTEM_LABELS[n] for n in names]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    micro = ("grep_s", "write_s", "create100_s")
    width = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        xs = [j + i * width for j in range(len(micro))]
        ax1.bar(xs, [systems[n][k] for k in micro], width, label=labels[i])
    ax1.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(micro))])
    ax1.set_xticklabels(["grep 9.1 MB", "write 3.9 MB", "create 100 x 4 KB"])
    ax1.set_yscale("log")  # native and PBFT differ by orders of magnitude here
    ax1.set_ylabel("seconds (median, log scale)")
    ax1.set_title("PBFT-CS section 6.2 micro-benchmarks")
    ax1.legend(fontsize=8)
    bottoms = [0.0] * len(names)
    for phase in PHASES:
        vals = [systems[n][f"andrew_{phase}_s"] for n in names]
        ax2.bar(labels, vals, 0.6, bottom=bottoms, label=PHASE_TITLES[phase])
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    for x, total in enumerate(bottoms):
        ax2.text(x, total, f"{total:.1f} s", ha="center", va="bottom", fontsize=8)
    ax2.set_ylabel("seconds (median)")
    ax2.set_title(title)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(systems: dict, andrew_name: str) -> None:
    """Every figure of every system, in seconds, as a table on stdout."""
    names = list(systems)
    rows = [("grep 9.1 MB", "grep_s"), ("write 3.9 MB", "write_s"), ("create 100 x 4 KB", "create100_s")]
    rows += [(f"{andrew_name} {PHASE_TITLES[p]}", f"andrew_{p}_s") for p in PHASES]
    rows += [(f"{andrew_name} total", "andrew_total_s")]
    head = ["seconds"] + [SYSTEM_LABELS[n] for n in names]
    _print_rows(head, [[label] + [f"{systems[n][k]:.3f}" for n in names] for label, k in rows])


def print_demo_table(systems: dict, n: int) -> None:
    """The demo's Andrew phases on PBFT and NO-REP side by side, with the requests each phase sent and the CPU
    the file system's processes used."""
    head = ["Andrew" + str(n), SYSTEM_LABELS["pbft"], SYSTEM_LABELS["norep"], "PBFT/NO-REP"]
    rows = []
    for key, label in [(f"andrew_{ph}_s", PHASE_TITLES[ph]) for ph in PHASES] + [("andrew_total_s", "total")]:
        a, b = systems["pbft"][key], systems["norep"][key]
        rows.append([label, f"{a:.3f} s", f"{b:.3f} s", f"{a / b:.2f}x" if b > 0 else "-"])
    _print_rows(head, rows)
    print("\nRequests the mount sent per phase (read-only + ordered): "
          + "; ".join(f"{PHASE_TITLES[ph]}: PBFT {systems['pbft']['requests'][ph][0]}+"
                      f"{systems['pbft']['requests'][ph][1]}, NO-REP {systems['norep']['requests'][ph][0]}+"
                      f"{systems['norep']['requests'][ph][1]}" for ph in PHASES))
    print(f"\nCPU used meanwhile by the file system's own processes (they share this machine's "
          f"{os.cpu_count()} cores with gcc): PBFT (4 replicas, relay, FUSE daemon) "
          f"{systems['pbft']['service_cpu_s']:.1f} s, NO-REP (server, relay, FUSE daemon) "
          f"{systems['norep']['service_cpu_s']:.1f} s")
    print()


def _print_rows(head: list[str], rows: list[list[str]]) -> None:
    """A table: the first column left-aligned, the others right-aligned, a rule under the head."""
    widths = [max(len(r[c]) for r in rows + [head]) for c in range(len(head))]
    print()
    print("  ".join(h.ljust(widths[0]) if c == 0 else h.rjust(widths[c]) for c, h in enumerate(head)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(v.ljust(widths[0]) if c == 0 else v.rjust(widths[c]) for c, v in enumerate(r)))
