#!/usr/bin/env python3
"""Side-by-side comparison of two or more builds on one benchmark, rounds interleaved.

This machine is shared and noisy, so builds are compared in one run: every round runs the benchmark once per
build, in an order that rotates from round to round, each into its own results directory
($BENCH_RESULTS_DIR), and the summary keeps every round's figures and their medians. A build is a build
directory (what BFTFS_BUILD names: it holds cli/bftfs); to compare with an older commit, build that commit in a
worktree and name its build directory. A build directory of a commit from before the `cli/` folder existed can
be given as a directory with `cli/bftfs` linked to its `replica/bftfs`.

  python3 benchmarks/ab_builds.py --bench fs --build base=/tmp/base-build --build new=build --rounds 3 \\
      --output restructure-ab-fs.json

Benchmarks: fs (bench_fs.py, QUICK: Andrew at n = 1 and the micro-benchmarks, on the systems of
BENCH_SYSTEMS, default pbft,norep) and counter (bench_counter.py, QUICK). Writes bench-results/OUTPUT.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the harness package
sys.path.insert(0, str(Path(__file__).resolve().parent))
import reporting  # noqa: E402

HERE = Path(__file__).resolve().parent

# Per benchmark: its script, its result file, and the figures kept from it (path of keys -> name).
BENCHES = {
    "fs": ("bench_fs.py", "fs.json", lambda d: {
        f"{system}.{key}": values[key]
        for system, values in d["systems"].items()
        for key in ("andrew_total_s", "andrew_compile_s", "andrew_copy_s", "grep_s", "write_s", "create100_s")
        if key in values}),
    "counter": ("bench_counter.py", "counter.json", lambda d: {
        f"{system}.{key}": d[system][key]
        for system in ("pbft", "norep", "pbft_nofsync", "norep_durable") if system in d
        for key in ("seq2000_ms", "latency_us_p50", "latency_us_p99", "peak_ops_per_s") if key in d[system]}),
}


def run_once(bench: str, build: Path, out_dir: Path) -> dict:
    script, result, pick = BENCHES[bench]
    env = dict(os.environ, BFTFS_BUILD=str(build), QUICK="1", BENCH_RESULTS_DIR=str(out_dir))
    env.setdefault("BENCH_SYSTEMS", "pbft,norep")
    subprocess.run([sys.executable, str(HERE / script)], env=env, check=True)
    return pick(json.loads((out_dir / result).read_text()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", choices=sorted(BENCHES), required=True)
    ap.add_argument("--build", action="append", required=True, metavar="NAME=DIR",
                    help="a build directory to compare, named (give two or more)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--output", required=True, help="result file name under bench-results/")
    args = ap.parse_args()
    builds = []
    for spec in args.build:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"--build {spec!r}: expected NAME=DIR")
        builds.append((name, Path(path).resolve()))
    if len(builds) < 2:
        raise SystemExit("--build: give at least two builds to compare")
    runs: dict[str, list[dict]] = {name: [] for name, _ in builds}
    with tempfile.TemporaryDirectory(prefix="bftfs-ab-") as scratch:
        for r in range(args.rounds):
            order = builds[r % len(builds):] + builds[:r % len(builds)]
            for name, path in order:
                out_dir = Path(scratch) / f"{name}-{r}"
                out_dir.mkdir()
                print(f"== round {r + 1}/{args.rounds}: {name} ({path})", flush=True)
                runs[name].append(run_once(args.bench, path, out_dir))
    medians = {name: {key: statistics.median(run[key] for run in rs if key in run) for key in rs[0]}
               for name, rs in runs.items()}
    result = {"meta": reporting.run_metadata(benchmark=f"ab_builds {args.bench}"), "builds": {n: str(p) for n, p in builds},
              "rounds": args.rounds, "medians": medians, "runs": runs}
    reporting.write_json(reporting.RESULTS_DIR / args.output, result)
    for key in medians[builds[0][0]]:
        print(f"  {key:32s} " + "  ".join(f"{name} {medians[name].get(key, float('nan')):10.4g}" for name, _ in builds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
