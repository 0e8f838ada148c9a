#!/usr/bin/env python3
"""`bftfs run` (docs/SPECULATION.md §15, issue "Must show"): a real build and an unpack on a 4-replica cluster,
with and without speculation, with a primary lying in 1% of its early replies, and on a LAN.

Clusters (harness.spec_run.spec_cluster: 4 replicas, f = 1, the PBFT-CS shim and early replies, the relay trusting
the primary always, `--distrust-window 0`, as in the paper's fault experiment; replicas fdatasync their logs
unless BENCH_NO_FSYNC=1), all up at once, each with one `bftfs mount --relay`:
  wan       primary-local 15 ms: the relay (and so the mount) at the primary's site, 15 ms one-way between
            sites (emulated in user space by the transport, harness.cluster.wan_args); `--batch-window 4`, as
            bench_counter_wan.py gives WAN clusters
  faulty    the same, the primary corrupting 1% of its early replies (`--corrupt-early-replies 0.01`)
  lan       no delay

Runs (each in a fresh directory on its mount; the build's sources are copied there first and the mount is
remounted before the build so it starts cold; neither is timed):
  build_s_nospec            wan: `make -j2 linux` of the Andrew benchmark's Lua 5.4 tree (harness.andrew, cached
                            by `make deps` in /opt/bftfs/src/lua5.4), plainly: every request waits for agreement
  build_s_spec              wan: the same under `bftfs run`
  build_s_spec_faulty_1pct  faulty: the same under `bftfs run`; every rollback listed
  build_s_lan_plain, build_s_lan_run   lan: the build plainly and under `bftfs run`
  untar_s_nospec, untar_s_spec         lan: `tar -xf` of Apache httpd 2.4's source tarball (3,119 files; cached by
                            `make deps` in /opt/bftfs/src/httpd2.4, scripts/fetch-httpd-source.sh) plainly and under
                            `bftfs run`; the tree is then read through a fresh mount (from the replicas) and must
                            equal the tarball unpacked on the local disk (untar_tree_identical)
The mounts lie under /tmp (short paths), so
`bftfs run` gives the tree a private tmpfs as /tmp (the compiler's temporary files), copied at every checkpoint.
Times are wall seconds of the command (bftfs run included: its exit waits for the last commit), the median over
rounds; the rounds interleave every run above (the order reversed every other round), so a busy minute on the
shared machine hits each alike; the machine's load is recorded before the benchmark and at each run's start.

outputs_identical: every build (wan, faulty, lan; plain and under bftfs run) left the same tree (every file of the
build directory hashed, read through a fresh mount) and printed the same stdout and stderr (hashed after the run's
own directory is replaced by a placeholder: make prints the directories it enters) with the same exit status.

From `bftfs run --stats-json`: rollbacks (every rollback of the faulty runs: round, epoch, cause, detail,
restore_ms, discarded_ms; rollbacks_fault_free lists those of the runs on fault-free clusters), checkpoints (median per fault-free speculative build), checkpoint_ms_p50 (the dumps'
wall time over every speculative WAN build), restore_ms_p50 (over the rollbacks), checkpoint_time_fraction
(checkpoint wall time / run wall time, the fault-free speculative builds' median). A mount whose daemon does not
serve `bftfs run` runs the commands plainly: then `speculated` is false and the spec numbers are plain ones.

Output: bench-results/spec-run.json (keys above, `targets`, `runs`, `meta`). Environment: BUILD/BFTFS_BUILD,
QUICK=1 (one round instead of 3), BENCH_ROUNDS, BENCH_PARTS (comma list of wan,faulty,lan,untar; default all),
BENCH_NO_FSYNC=1, BENCH_KEEP=1 (keep the scratch directory), BENCH_RESULTS_DIR, BFTFS_SRC_CACHE. Needs root and
CRIU (`make deps`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the harness package

import reporting  # noqa: E402
from harness.andrew import COMPILE_JOBS, COMPILE_TARGET, build_env, hash_tree, lua_source, tree_digest, write_tree  # noqa: E402
from harness.binaries import bftfs_binary  # noqa: E402
from harness.cli_cluster import CliCluster  # noqa: E402
from harness.log import progress  # noqa: E402
from harness.mount import Mount  # noqa: E402
from harness.procs import exit_cleanly_on_sigterm  # noqa: E402
from harness.spec_run import (RunResult, criu_missing, run_argv, run_command, run_needs_root,  # noqa: E402
                              spec_cluster, stats_summary)

RESULT_NAME = "spec-run.json"
WAN_DELAY_MS = 15.0
FAULTY_LIES = 0.01
WAN_CLUSTER_ARGS = ["--batch-window", "4"]
# One run's command: a build takes about a minute at 15 ms here; one that takes 15 is hung (a tree task waiting
# for ever in a request of the spec session) and is killed, with `bftfs run`, and recorded as failed.
STEP_TIMEOUT_S = 900.0
PARTS = ("wan", "faulty", "lan", "untar")
SITES = {"wan": (WAN_DELAY_MS, 0.0), "faulty": (WAN_DELAY_MS, FAULTY_LIES), "lan": (0.0, 0.0)}
# Every run: its name, its site, what it does, and whether under bftfs run; the part that asks for it.
RUNS = (("build_nospec", "wan", "build", False, "wan"), ("build_spec", "wan", "build", True, "wan"),
        ("build_spec_faulty_1pct", "faulty", "build", True, "faulty"),
        ("build_lan_plain", "lan", "build", False, "lan"), ("build_lan_run", "lan", "build", True, "lan"),
        ("untar_nospec", "lan", "untar", False, "untar"), ("untar_spec", "lan", "untar", True, "untar"))


def plan() -> dict:
    rounds = int(os.environ.get("BENCH_ROUNDS") or (1 if reporting.quick_mode() else 3))
    parts = [p for p in os.environ.get("BENCH_PARTS", ",".join(PARTS)).split(",") if p]
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise SystemExit(f"BENCH_PARTS: unknown parts {sorted(unknown)} (known: {', '.join(PARTS)})")
    return {"rounds": rounds, "parts": parts, "durable": os.environ.get("BENCH_NO_FSYNC") != "1"}


def httpd_tarball() -> tuple[Path, dict]:
    """The httpd tarball `make deps` cached and its SOURCE record; SystemExit saying how to fetch it."""
    cache = Path(os.environ.get("BFTFS_SRC_CACHE", "/opt/bftfs/src")) / "httpd2.4"
    record = cache / "SOURCE"
    info = dict(line.split(" ", 1) for line in record.read_text().splitlines() if " " in line) \
        if record.is_file() else {}
    tarball = cache / info.get("orig", "-")
    if not tarball.is_file():
        raise SystemExit(f"{cache} has no httpd tarball: run `make deps` (or bash scripts/fetch-httpd-source.sh)")
    if hashlib.sha256(tarball.read_bytes()).hexdigest() != info.get("sha256"):
        raise SystemExit(f"{tarball} does not match the sha256 in {record}: run `BFTFS_SRC_FORCE=1 bash "
                         "scripts/fetch-httpd-source.sh`")
    return tarball, info


class Site:
    """One cluster and its mount, in a short directory (FUSE mount points and the control socket's path must
    stay short)."""

    def __init__(self, bftfs: Path, top: Path, name: str, delay_ms: float, lies: float, durable: bool) -> None:
        self.bftfs = bftfs
        self.name = name
        self.top = top / name
        self.cluster: CliCluster = spec_cluster(bftfs, self.top / "c", wan_delay_ms=delay_ms,
                                                corrupt_early_replies=lies, durable=durable,
                                                args=WAN_CLUSTER_ARGS if delay_ms > 0 else [])
        self.mount: Mount | None = None
        self.fresh_mounts = 0

    def start(self) -> None:
        progress(f"{self.name}: bftfs cluster start {' '.join(self.cluster.args)}")
        self.cluster.start()
        self.mount = Mount(self.bftfs, self.top / "m", self.top / "mount.log", ["--relay", self.cluster.relay_sock])
        self.mount.start()

    def remount(self) -> None:
        assert self.mount is not None
        self.mount.restart()

    def stop(self) -> None:
        try:
            if self.mount is not None:
                self.mount.stop()
        finally:
            self.cluster.stop()

    def fresh_hashes(self, rel: str) -> dict[str, str]:
        """hash_tree of `rel` through a second mount made now: nothing cached, every byte from the replicas."""
        self.fresh_mounts += 1
        with Mount(self.bftfs, self.top / f"f{self.fresh_mounts}", self.top / f"fresh-{self.fresh_mounts}.log",
                   ["--relay", self.cluster.relay_sock]) as m:
            return hash_tree(m.mountpoint / rel)


@contextlib.contextmanager
def sites_up(bftfs: Path, top: Path, parts: list[str], durable: bool) -> Iterator[dict[str, Site]]:
    wanted = {"wan": "wan" in parts, "faulty": "faulty" in parts, "lan": "lan" in parts or "untar" in parts}
    sites = {name: Site(bftfs, top, name, *SITES[name], durable) for name, on in wanted.items() if on}
    try:
        for s in sites.values():
            s.start()
        yield sites
    finally:
        for s in sites.values():
            with contextlib.suppress(Exception):
                s.stop()


# ---------------------------------------------------------------------------------------------------------
# One run


def output_digest(result: RunResult, workdir: Path) -> str:
    """SHA-256 over the exit status, stdout and stderr, with the run's own directory replaced by a placeholder."""
    h = hashlib.sha256()
    for part in (str(result.returncode).encode(), result.stdout, result.stderr):
        h.update(part.replace(os.fsencode(workdir), b"<run-dir>") + b"\0")
    return h.hexdigest()


def one_run(site: Site, name: str, what: str, under_run: bool, rnd: int, lua, tarball: Path, scratch: Path) -> dict:
    """Prepares (untimed), times and checks one run; returns its row."""
    assert site.mount is not None
    rel = f"{name}-r{rnd}"
    workdir = site.mount.mountpoint / rel
    workdir.mkdir()
    if what == "build":
        write_tree(lua, workdir)
        site.remount()
        command = ["make", f"-j{COMPILE_JOBS}", COMPILE_TARGET]
    else:
        command = ["tar", "-xf", str(tarball)]
    stats = scratch / f"{rel}.stats.json"
    trace = scratch / f"{rel}.trace"
    # --stats-json, not --stats: the printed report would go to stderr, which is compared between the runs.
    argv = run_argv(site.bftfs, command, stats_json=stats, trace=trace) if under_run else command
    load = reporting.load_average()
    result = run_command(argv, workdir, timeout_s=STEP_TIMEOUT_S, env=build_env(),
                         stats_json=stats if under_run else None, trace=trace if under_run else None)
    err = result.err()
    (scratch / f"{rel}.stdout").write_bytes(result.stdout)
    (scratch / f"{rel}.stderr").write_bytes(result.stderr)
    if result.returncode != 0:
        raise RunFailed(f"`{' '.join(argv)}` exited {result.returncode}: {err[-1500:]}")
    tree = site.fresh_hashes(rel)
    row = {"run": name, "round": rnd, "site": site.name, "seconds": round(result.wall_s, 3),
           "loadavg_1_5_15_at_start": load, "files": sum(1 for v in tree.values() if v.startswith("file")),
           "tree_sha256": tree_digest(tree), "output_sha256": output_digest(result, workdir)}
    if under_run:
        summary = stats_summary(result.stats)
        row["stats"] = summary
        row["checkpoint_wall_ms"] = [round(c["wall_us"] / 1000, 3) for c in (result.stats or {}).get("checkpoints", [])]
        row["speculated"] = summary["checkpoints"] > 0
    progress(f"{name} round {rnd}: {row['seconds']:.2f} s, {row['files']} files"
             + (f"; {row['stats']['checkpoints']} checkpoints, {len(row['stats']['rollbacks'])} rollbacks"
                if under_run else ""))
    return row


class RunFailed(Exception):
    """A run's command failed: the row records why and the benchmark goes on with the next run."""


def rounds(sites: dict[str, Site], p: dict, lua, tarball: Path, scratch: Path) -> list[dict]:
    """Every run of the plan, round by round. A run that fails is recorded as failed (and left out of the
    medians) and its site's mount is made anew, so one broken run does not cost the others."""
    runs = [r for r in RUNS if r[4] in p["parts"]]
    rows = []
    for rnd in range(1, p["rounds"] + 1):
        order = runs if rnd % 2 else list(reversed(runs))
        for name, site, what, under_run, _part in order:
            progress(f"== {name}, round {rnd}/{p['rounds']}")
            try:
                rows.append(one_run(sites[site], name, what, under_run, rnd, lua, tarball, scratch))
            except (RunFailed, OSError, TimeoutError) as exc:
                progress(f"{name} round {rnd} FAILED: {exc}")
                rows.append({"run": name, "round": rnd, "site": site, "failed": str(exc)[-2000:]})
                sites[site].remount()
    return rows


# ---------------------------------------------------------------------------------------------------------
# The result


def median(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    n = len(s)
    return round(s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2, 3)


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def summarize(rows: list[dict], local_tree: str | None) -> dict:
    """The issue's keys from the rows (module docstring)."""
    by: dict[str, list[dict]] = {}
    for row in rows:
        if "failed" not in row:
            by.setdefault(row["run"], []).append(row)
    out: dict = {}
    for name, _site, _what, _run, _part in RUNS:
        out[f"{name.split('_', 1)[0]}_s_{name.split('_', 1)[1]}"] = median([r["seconds"] for r in by.get(name, [])])
    out["failed_runs"] = [{"run": r["run"], "round": r["round"], "why": r["failed"]} for r in rows if "failed" in r]
    builds = [r for r in rows if r["run"].startswith("build") and "failed" not in r]
    out["outputs_identical"] = (len({(r["tree_sha256"], r["output_sha256"]) for r in builds}) == 1) if builds else None
    untars = by.get("untar_nospec", []) + by.get("untar_spec", [])
    out["untar_tree_identical"] = all(r["tree_sha256"] == local_tree for r in untars) if untars else None
    faulty = by.get("build_spec_faulty_1pct", [])
    out["rollbacks"] = [{"round": r["round"], **rb} for r in faulty for rb in r["stats"]["rollbacks"]]
    # Rollbacks where nobody lied (fault-free clusters): each one is a prediction the model got wrong.
    out["rollbacks_fault_free"] = [{"run": r["run"], "round": r["round"], **rb} for r in rows
                                   if "failed" not in r and r["site"] != "faulty" and r.get("stats")
                                   for rb in r["stats"]["rollbacks"]]
    clean = by.get("build_spec", [])
    out["checkpoints"] = median([r["stats"]["checkpoints"] for r in clean])
    out["checkpoint_ms_p50"] = median([ms for r in clean + faulty for ms in r["checkpoint_wall_ms"]])
    out["restore_ms_p50"] = median([rb["restore_ms"] for rb in out["rollbacks"]])
    out["checkpoint_time_fraction"] = median([round(sum(r["checkpoint_wall_ms"]) / 1000 / r["seconds"], 4)
                                             for r in clean if r["seconds"]])
    out["speculated"] = {name: [r["speculated"] for r in by.get(name, [])]
                         for name, _s, _w, under_run, _p in RUNS if under_run and by.get(name)}
    return out


def targets(s: dict) -> dict:
    """The issue's targets, evaluated on these numbers."""
    t = {"build_nospec_over_spec": ratio(s.get("build_s_nospec"), s.get("build_s_spec")),
         "untar_nospec_over_spec": ratio(s.get("untar_s_nospec"), s.get("untar_s_spec")),
         "build_lan_run_over_plain": ratio(s.get("build_s_lan_run"), s.get("build_s_lan_plain"))}
    t["met"] = {"build_spec_5x_faster": t["build_nospec_over_spec"] is not None and t["build_nospec_over_spec"] >= 5,
                "untar_spec_5x_faster": t["untar_nospec_over_spec"] is not None and t["untar_nospec_over_spec"] >= 5,
                "build_lan_run_within_5pct": t["build_lan_run_over_plain"] is not None
                and t["build_lan_run_over_plain"] <= 1.05,
                "outputs_identical": s.get("outputs_identical") is True,
                "no_failed_runs": not s.get("failed_runs"),
                "every_rollback_has_a_restore_time": all(r["restore_ms"] > 0 for r in s.get("rollbacks", []))}
    return t


def local_untar_digest(tarball: Path, scratch: Path) -> str:
    """The tarball unpacked on the local disk by the same command, hashed like the runs' trees."""
    d = scratch / "untar-local"
    d.mkdir()
    subprocess.run(["tar", "-xf", str(tarball)], cwd=d, check=True, timeout=600)
    digest = tree_digest(hash_tree(d))
    shutil.rmtree(d, ignore_errors=True)
    return digest


def main() -> None:
    exit_cleanly_on_sigterm()
    bftfs = bftfs_binary()
    why = run_needs_root() or criu_missing(bftfs)
    if why:
        raise SystemExit(f"bench_spec_run: {why}")
    p = plan()
    lua, lua_info = lua_source()
    tarball, httpd_info = httpd_tarball()
    with tarfile.open(tarball) as tf:
        tar_files = sum(1 for m in tf.getmembers() if m.isfile())
    busy = reporting.machine_busy_before()
    load_start = reporting.load_average()
    progress(f"parts {', '.join(p['parts'])}, {p['rounds']} round(s); Lua {lua_info.get('version')} "
             f"({len(lua.files)} files), httpd {httpd_info.get('version')} ({tar_files} files); machine {busy}")
    top = Path(tempfile.mkdtemp(prefix="bsr-", dir="/tmp"))
    ok = False
    try:
        scratch = top / "runs"
        scratch.mkdir()
        local_tree = local_untar_digest(tarball, scratch) if "untar" in p["parts"] else None
        with sites_up(bftfs, top, p["parts"], p["durable"]) as sites:
            rows = rounds(sites, p, lua, tarball, scratch)
        summary = summarize(rows, local_tree)
        meta = reporting.run_metadata(
            benchmark="bench_spec_run", machine_before=busy, loadavg_1_5_15_start=load_start, plan=p,
            statistic="median over rounds (runs lists each)",
            topology=f"primary-local {WAN_DELAY_MS:g} ms (wan, faulty): relay at replica 0's site; lan: no delay",
            clusters={name: site_args(s) for name, s in SITES.items()},
            durable=p["durable"], lua={"source": lua_info, "files": len(lua.files)},
            build=f"make -j{COMPILE_JOBS} {COMPILE_TARGET} in a fresh copy, mount remounted first (not timed)",
            tree_tmp="under bftfs run: a private tmpfs, copied at every checkpoint (the mounts lie under /tmp)",
            httpd={"source": httpd_info, "files": tar_files, "command": "tar -xf TARBALL"})
        result = {**summary, "targets": targets(summary), "runs": rows, "meta": meta}
        out = reporting.RESULTS_DIR / RESULT_NAME
        reporting.write_json(out, result)
        progress(f"wrote {out}")
        for key in ("build_s_nospec", "build_s_spec", "build_s_spec_faulty_1pct", "build_s_lan_plain",
                    "build_s_lan_run", "untar_s_nospec", "untar_s_spec", "outputs_identical", "untar_tree_identical",
                    "checkpoints", "checkpoint_ms_p50", "restore_ms_p50", "checkpoint_time_fraction"):
            print(f"{key:26s} {summary.get(key)}")
        print(f"{'rollbacks':26s} {len(summary['rollbacks'])}; failed runs {len(summary['failed_runs'])}; "
              f"targets {result['targets']['met']}")
        ok = True
    finally:
        if ok and not reporting.keep_scratch():
            shutil.rmtree(top, ignore_errors=True)
        else:
            progress(f"kept {top} (cluster logs, runs' output, stats and traces)")


def site_args(site: tuple[float, float]) -> dict:
    delay, lies = site
    return {"wan_delay_ms": delay, "corrupt_early_replies": lies, "distrust_window": 0,
            "extra": WAN_CLUSTER_ARGS if delay > 0 else []}


if __name__ == "__main__":
    main()
