#!/usr/bin/env python3
"""File-system benchmarks: the PBFT-CS paper's NFS micro-benchmarks (NSDI 2009, section 6.2) and the BFT
paper's modified Andrew benchmark (TOCS 2002 / OSDI 2000, "Andrew100"), on four systems:

  native   a directory on this machine's own disk (ext4 or whatever /tmp is on), no FUSE
  local    `bftfs mount --local`: our FUSE client with the file service in-process (no network, no agreement)
  norep    `bftfs cluster start --norep` + `bftfs mount --relay`: one unreplicated server behind the relay
  pbft     `bftfs cluster start --f 1` + `bftfs mount --relay`: 4 replicas (PBFT, the shim) behind the relay

Workloads (each measured on a fresh service state, in this order):
  grep        `grep -r -c -F struct` over ~9.1 MB of C headers from /usr/include (the Linux UAPI headers first,
              as in the paper), copied onto the file system in untimed setup and read cold (after a remount)
  write       one file of 3.9 MB (3,900,000 bytes) in 8 KiB write() calls; the time covers open, the writes,
              fsync and close (the paper's client blocks at close; fsync makes native pay for its disk too)
  create100   100 files of 4 KB in a new directory: open(O_CREAT|O_EXCL), one 4096-byte write, close
  andrew      the modified Andrew benchmark over n copies of a real C tree (Lua 5.4 from Debian's source package,
              `make deps` caches it in /opt/bftfs/src/lua5.4): phase 1 creates the directories of n copies,
              2 copies the files (sources preloaded into memory, so only the writes touch the file system),
              3 lstat()s every file and directory, 4 reads every byte, 5 compiles each copy with Lua's own
              makefile (`make -j2 linux`, gcc -O2; two jobs for the machine's two cores) one copy after another

Caches. Between the phases of Andrew (before 3, 4 and 5) and before grep the client's caches are emptied: the
FUSE systems are unmounted and mounted again (kernel dentries, attributes and pages, and the client's own
cache, all go); for native the tree is synced and every file's pages are dropped with
posix_fadvise(DONTNEED) (its dentries and inodes stay cached: dropping those needs a machine-wide
drop_caches, which would disturb everyone else on a shared machine). Without this, phases 3 and 4 would
mostly measure the kernel's caches, filled by phase 2. Remount time is not counted. The BFT paper ran the
phases back to back over NFS with attribute and write-back caching: BENCH_REMOUNT=0 does that.

Durability is recorded in meta: PBFT replicas fdatasync their logs; the NO-REP server runs the same file
service on the same disk store and, started with `--norep-durable`, fdatasyncs its log before each reply (the
promise of a PBFT reply); native is the page cache (only the write benchmark fsyncs).

Checks (a benchmark that measures a broken file system is worthless): the grep total must equal grep's on the
original headers; the 3.9 MB file and every Andrew file are read back after a remount and compared; the
compiled `lua` must run a one-line script.

Fault mode (`--faults`, pbft only; bench-results/fs-faults.json): Andrew once fault-free and once with a backup
killed (SIGKILL) in the middle of phase 2, restarted at the start of phase 4, and the primary killed during
phase 5 (once the restarted backup has caught up, since f = 1 tolerates one fault at a time); the run must
complete and the two resulting trees (every file hashed, read back after a remount) must be byte-identical.

Demo mode (`--demo`, used by `make demo`): Andrew at a small scale on pbft and norep, phase times side by side
on stdout; no result file.

Files: this script is the plan (what runs where, in which order) and the modes; fs_systems.py the systems and
the watchdog, fs_workloads.py what is timed and checked, fs_report.py the summaries, plot and tables,
fs_faults.py the fault mode; the Andrew workload and the processes are the harness's (harness/andrew.py,
harness/cli_cluster.py, harness/mount.py).

Environment: BUILD/BFTFS_BUILD, QUICK=1 (one repeat at n = 1), BENCH_SYSTEMS=native,local,norep,pbft,
ANDREW_N (copies; default 1 quick, 5 full), BENCH_REPEATS (default 1 quick, 3 full: medians reported),
BENCH_REMOUNT=0, BENCH_KEEP=1 (keep the scratch directory), BENCH_MOUNT_ARGS (extra `bftfs mount` arguments,
recorded in meta), BENCH_CLUSTER_ARGS (extra `cluster start`
arguments), BFTFS_SRC_CACHE (default /opt/bftfs/src). Progress on stderr. Every process started and every
mount made is stopped on exit, also on SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the harness package

import reporting  # noqa: E402
from fs_faults import run_fault_mode  # noqa: E402
from fs_report import print_demo_table, print_table, plot, ratios, summarize  # noqa: E402
from fs_systems import (ALL_SYSTEMS, DURABILITY, BenchError, MountedSystem, Watchdog,  # noqa: E402
                        check_binary_supports, make_system, run_deadline_s)
from fs_workloads import (CREATE_BYTES, CREATE_FILES, GREP_PATTERN, GREP_ROOTS, WRITE_BYTES,  # noqa: E402
                          WRITE_CHUNK, check_andrew_tree, expected_grep, grep_corpus, micro_create, micro_grep,
                          micro_write, run_andrew)
from harness.andrew import COMPILE_JOBS, COMPILE_TARGET, PHASES, Andrew, SourceTree, lua_source  # noqa: E402
from harness.binaries import bftfs_binary  # noqa: E402
from harness.log import progress  # noqa: E402
from harness.procs import HarnessError, exit_cleanly_on_sigterm  # noqa: E402


# ---------------------------------------------------------------------------------------------------------
# The measurement plan


def plan() -> dict:
    quick = reporting.quick_mode()
    systems = [s.strip() for s in os.environ.get("BENCH_SYSTEMS", ",".join(ALL_SYSTEMS)).split(",") if s.strip()]
    for s in systems:
        if s not in ALL_SYSTEMS:
            raise SystemExit(f"BENCH_SYSTEMS: unknown system {s!r} (known: {', '.join(ALL_SYSTEMS)})")
    return {
        "systems": systems,
        "andrew_n": int(os.environ.get("ANDREW_N", "1" if quick else "5")),  # Andrew100: ANDREW_N=100
        "repeats": int(os.environ.get("BENCH_REPEATS", "1" if quick else "3")),
        "remount": os.environ.get("BENCH_REMOUNT", "1") != "0",
        "cluster_args": shlex.split(os.environ.get("BENCH_CLUSTER_ARGS", "")),
    }


def one_run(kind: str, run_dir: Path, bftfs: Path | None, p: dict, corpus: SourceTree, grep_expected: int,
            lua: SourceTree) -> dict:
    """All workloads once on a fresh instance of system `kind`; returns the seconds of each."""
    run_dir.mkdir(parents=True)
    system = make_system(kind, run_dir, bftfs, p["cluster_args"])
    result: dict = {}
    try:
        with Watchdog(system, run_deadline_s(p["andrew_n"])) as dog:
            root = system.start()
            result["grep_s"] = micro_grep(system, root, corpus, grep_expected)
            result["write_s"] = micro_write(system, root)
            result["create100_s"] = micro_create(system, root)
            andrew = Andrew(system.name, root, lua, p["andrew_n"], run_dir)
            a = run_andrew(system, andrew, p["remount"])
            check_andrew_tree(system, andrew)
            progress(f"{kind}: Andrew{p['andrew_n']} tree reads back identical; the built lua runs")
            if dog.fired:
                raise BenchError(f"{kind}: the watchdog fired")
        for phase in PHASES:
            result[f"andrew_{phase}_s"] = a.phases_s[phase]
        result["andrew_total_s"] = sum(a.phases_s.values())
        result["andrew_service_cpu_s"] = {k: round(v, 3) for k, v in a.service_cpu_s.items()}
        if a.requests:
            result["andrew_requests"] = a.requests
        result["system"] = system.describe()
    finally:
        system.stop()
    return result


def bench(args) -> None:
    """The measurement: every workload on every system, `repeats` times; writes fs.json and fs.png."""
    p = plan()
    if args.andrew_n:
        p["andrew_n"] = args.andrew_n
    bftfs = bftfs_binary() if any(s != "native" for s in p["systems"]) else None
    if bftfs is not None:
        check_binary_supports(bftfs, p["systems"])
    lua, lua_info = lua_source()
    corpus = grep_corpus()
    grep_expected = expected_grep(corpus)
    busy = reporting.machine_busy_before()
    progress(f"systems {', '.join(p['systems'])}; Andrew{p['andrew_n']} on Lua {lua_info.get('version')} "
             f"({len(lua.files)} files, {lua.bytes / 1e6:.2f} MB per copy); {p['repeats']} repeat(s); "
             f"grep corpus {len(corpus.files)} files {corpus.bytes / 1e6:.2f} MB")
    scratch = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix="bftfs-fs-bench-"))
    ok = False
    try:
        runs: dict[str, list[dict]] = {s: [] for s in p["systems"]}
        # Repeats interleave the systems, so a slow minute on the shared machine hits all of them alike.
        for rep in range(p["repeats"]):
            for kind in p["systems"]:
                progress(f"== {kind}, repeat {rep + 1}/{p['repeats']}")
                runs[kind].append(one_run(kind, scratch / f"{kind}-{rep}", bftfs, p, corpus, grep_expected, lua))
        systems = {k: summarize(v) for k, v in runs.items()}
        result = {
            "meta": bench_meta(p, busy, corpus, grep_expected, lua, lua_info),
            "systems": systems,
            "ratios": ratios(systems),
        }
        if "pbft" in systems and "norep" in systems:
            r = systems["pbft"]["andrew_total_s"] / systems["norep"]["andrew_total_s"]
            result["andrew_pbft_over_norep"] = round(r, 3)
            result["andrew_pbft_within_1_3x_norep"] = r <= 1.3
        out = reporting.RESULTS_DIR / (args.output or "fs.json")
        reporting.write_json(out, result)
        plot(out.with_suffix(".png"), systems, f"Andrew{p['andrew_n']} (Lua 5.4) phases")
        progress(f"wrote {out} and {out.with_suffix('.png')}")
        print_table(systems, f"Andrew{p['andrew_n']}")
        ok = True
    finally:
        if ok and not reporting.keep_scratch() and not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            progress(f"kept {scratch} (logs and data)")


def bench_meta(p: dict, busy: dict, corpus: SourceTree, grep_expected: int, lua: SourceTree, lua_info: dict) -> dict:
    """fs.json's `meta`: the plan, the inputs and how each figure was taken."""
    return reporting.run_metadata(
        benchmark="bench_fs", machine_before=busy, systems=p["systems"], andrew_n=p["andrew_n"],
        repeats=p["repeats"], statistic="median over repeats (runs lists each)",
        cache_policy=("remount (FUSE) / sync + fadvise DONTNEED (native) before grep and before "
                      "Andrew phases 3, 4, 5; not timed") if p["remount"] else "warm: phases back to back",
        grep={"pattern": GREP_PATTERN, "command": "grep -r -c -F", "files": len(corpus.files),
              "bytes": corpus.bytes, "source": "/usr/include (" + ", ".join(GREP_ROOTS) + ")",
              "matching_lines": grep_expected},
        write={"bytes": WRITE_BYTES, "write_call_bytes": WRITE_CHUNK, "timed": "open+write+fsync+close"},
        create100={"files": CREATE_FILES, "bytes_each": CREATE_BYTES, "timed": "open+write+close each"},
        andrew={"source": lua_info, "files_per_copy": len(lua.files), "dirs_per_copy": len(lua.dirs),
                "bytes_per_copy": lua.bytes,
                "compile": f"make -j{COMPILE_JOBS} {COMPILE_TARGET} per copy, one copy after another "
                           "(Lua's own makefile: gcc -std=gnu99 -O2)"},
        durability=DURABILITY,
        requests=("andrew_requests per phase: the relay's STATUS counters before and after each phase "
                  "(docs/RELAY.md): sent_read_only, sent_ordered, sent_compound, lookups_enoent, ops_<op>; "
                  "system.client_counters_per_mount: `bftfs mount --status` at each unmount"),
        mount_args=shlex.split(os.environ.get("BENCH_MOUNT_ARGS", "")),
        cluster_args=p["cluster_args"])


# ---------------------------------------------------------------------------------------------------------
# Demo mode (make demo)


def demo(args) -> None:
    """Andrew at a small scale on PBFT then NO-REP; phase times side by side. Writes no result file."""
    n = args.andrew_n or 1
    p = {"systems": ["pbft", "norep"], "andrew_n": n, "repeats": 1, "remount": True,
         "cluster_args": shlex.split(os.environ.get("BENCH_CLUSTER_ARGS", ""))}
    bftfs = bftfs_binary()
    check_binary_supports(bftfs, p["systems"])
    lua, lua_info = lua_source()
    scratch = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix="bftfs-fs-demo-"))
    progress(f"Andrew{n}: {n} cop{'y' if n == 1 else 'ies'} of Lua {lua_info.get('version')} from Debian's source "
             f"package ({len(lua.files)} files, {lua.bytes / 1e6:.2f} MB each), compiled with make -j{COMPILE_JOBS}")
    systems: dict = {}
    for kind in p["systems"]:
        run_dir = scratch / kind
        run_dir.mkdir(parents=True)
        system = MountedSystem(run_dir, kind, bftfs, run_dir / "mnt", p["cluster_args"])
        try:
            with Watchdog(system, 600):
                root = system.start()
                progress(f"{kind}: mounted at {root}")
                andrew = Andrew(system.name, root, lua, n, run_dir)
                a = run_andrew(system, andrew, True)
                check_andrew_tree(system, andrew)
                progress(f"{kind}: every file reads back identical; the lua built on the mount runs")
        finally:
            system.stop()
        systems[kind] = {f"andrew_{ph}_s": a.phases_s[ph] for ph in PHASES}
        systems[kind]["andrew_total_s"] = sum(a.phases_s.values())
        systems[kind]["service_cpu_s"] = sum(a.service_cpu_s.values())
        systems[kind]["requests"] = {ph: (a.requests.get(ph, {}).get("sent_read_only", 0),
                                          a.requests.get(ph, {}).get("sent_ordered", 0)) for ph in PHASES}
    print_demo_table(systems, n)


def main() -> None:
    exit_cleanly_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--faults", action="store_true", help="fault mode (pbft): writes bench-results/fs-faults.json")
    mode.add_argument("--demo", action="store_true", help="make demo: Andrew on PBFT and NO-REP side by side")
    ap.add_argument("--output", help="result file name under bench-results/ (default fs.json / fs-faults.json)")
    ap.add_argument("--andrew-n", type=int, help="copies of the source tree (default: ANDREW_N, or 1 for --demo)")
    ap.add_argument("--scratch", help="use this (existing, empty) directory for mounts, clusters and logs; it "
                                      "is never removed (make demo's own directory)")
    args = ap.parse_args()
    if args.andrew_n is not None and args.andrew_n < 1:
        ap.error("--andrew-n must be at least 1")
    try:
        if args.faults:
            run_fault_mode(args, plan())
        elif args.demo:
            demo(args)
        else:
            bench(args)
    except HarnessError as exc:  # BenchError too: a step failed, the message says which
        raise SystemExit(f"bench_fs: FAILED: {exc}") from None
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: everything was unmounted and stopped on the way out
        print(f"bench_fs: interrupted ({exc or 'SIGINT'}); mounts and processes cleaned up", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
