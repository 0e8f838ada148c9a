#!/usr/bin/env python3
"""Interleaved A/B of the CPU the bftfs processes spend per request, for frozen binary copies.

Wall time on this shared 2-core machine moves with everyone else's compiles; the CPU time a process was
charged for a fixed workload moves much less. So this script runs the SAME fixed workload against each
configuration in turn (A, B, A, B, ...: interleaved, so a change in the machine's load hits both), each on a
fresh cluster, and reports for every run:

  cpu_s        user+sys of every bftfs daemon of the run (replicas or NO-REP server, relay and FUSE daemon), from
               /proc/<pid>/stat just before and just after the workload (all threads, so the log's sync thread
               is included)
  client_cpu_s the workload's own bftfs client (counter workloads), from its rusage
  ops          requests the workload made (counter: increments; fs: requests the relay completed, ordered and
               read-only)
  cpu_us_per_op 1e6 * cpu_s / ops
  wall_s       the workload's wall time (noisy; read it only next to the other configuration's)

Workloads (--workload):
  counter-seq   N sequential increments by one client (default 2000)
  counter-load  K closed-loop clients (default 32) for S seconds; ops = completed increments
  fs            `cluster start --service fs`, `bftfs mount`, then: copy the Lua 5.4 tree (the Andrew source,
                `make deps` caches it) onto the mount, `make -j2 linux` in it (gcc's CPU is not counted), read
                every file back, remove the tree

Configurations: --config LABEL=BINARY[,extra cluster-start args...], at least one; an argument written
`client:ARG` goes to the workload's `bftfs counter` instead (PBFT-CS: `,--shim,--early-replies,client:--spec`). The binary must be a copy
named `bftfs` (daemons are found by their command line), e.g. cp build/cli/bftfs /tmp/ab/new/bftfs.
Example:
  benchmarks/ab_cpu.py --workload counter-load --rounds 3 \
      --config old=/tmp/ab/old/bftfs --config new=/tmp/ab/new/bftfs --config norep=/tmp/ab/new/bftfs,--norep
Output: one line per run on stdout, a summary (medians per configuration) at the end, and with --json FILE
every run and the medians as JSON. This is a benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the harness package

from harness.andrew import build_env, lua_source  # noqa: E402
from harness.cli_cluster import CliCluster  # noqa: E402
from harness.mount import Mount  # noqa: E402
from harness.procs import bftfs_pids, process_cpu_s  # noqa: E402
from harness.procs import run_checked as run_cmd  # noqa: E402


def parse_config(text: str) -> tuple[str, Path, list[str]]:
    label, _, rest = text.partition("=")
    parts = rest.split(",")
    binary = Path(parts[0]).resolve()
    if not label or not binary.is_file() or binary.name != "bftfs":
        raise SystemExit(f"--config {text}: want LABEL=/path/to/bftfs[,args] (a file named bftfs)")
    return label, binary, [p for p in parts[1:] if p]


def split_client_args(extra: list[str]) -> tuple[list[str], list[str]]:
    """`client:ARG` entries of a --config go to the workload's `bftfs counter`; the rest to `cluster start`."""
    cluster = [a for a in extra if not a.startswith("client:")]
    client = [a[len("client:"):] for a in extra if a.startswith("client:")]
    return cluster, client


def daemons_cpu_s(pids: list[int]) -> float:
    return sum(process_cpu_s(p) for p in pids)


class Cluster(CliCluster):
    """One configuration's cluster, made afresh by start() in root/cluster (`bftfs cluster start` with this
    binary, fixed port, --clients, --log-level warn and the configuration's cluster arguments)."""

    def __init__(self, binary: Path, args: list[str], root: Path, service: str, port: int,
                 clients: int = 64) -> None:
        cluster_args, self.client_args = split_client_args(args)
        super().__init__(binary, root / "cluster", service=service, norep="--norep" in cluster_args,
                         base_port=port, args=["--clients", clients, "--log-level", "warn",
                                               *[a for a in cluster_args if a != "--norep"]])
        self.binary = binary

    def start(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        super().start(120)

    def stop(self) -> None:
        super().stop(120)

    def pids(self) -> list[int]:
        return bftfs_pids([str(self.dir)])

    def roles(self) -> dict[str, list[int]]:
        """The daemons' pids by role: replicas (or the NO-REP server) and the relay."""
        out: dict[str, list[int]] = {}
        for f in sorted(self.dir.glob("*.pid")):
            role = "relay" if f.stem == "relay" else "server"
            out.setdefault(role, []).append(int(f.read_text().split()[0]))
        return out

    def relay_retransmissions(self) -> int:
        return int(json.loads((self.dir / "relay.status.json").read_text())["retransmissions"])

    def wal_sync_ms_max(self) -> float:
        """The slowest log write of any replica (0 for NO-REP): a retransmission usually follows one."""
        worst = 0.0
        for status in self.dir.glob("r*/status.json"):
            worst = max(worst, float(json.loads(status.read_text())["log"]["wal_sync_us_max"]) / 1e3)
        return worst

    def ops_completed(self) -> int:
        """Requests the relay completed (ordered and read-only, PBFT or NO-REP alike), from its status file."""
        return int(json.loads((self.dir / "relay.status.json").read_text())["completed"])


def cpu_of_children() -> float:
    """user+sys of every waited-for child so far: the difference around run_cmd() is that command's CPU."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def counter_workload(cl: Cluster, args: argparse.Namespace) -> dict:
    conf = cl.dir / "cluster.conf"
    norep = ["--norep"] if cl.norep else []
    # A short warm-up on another client id: connections, the first log segment, caches.
    run_cmd([cl.binary, "counter", "--config", conf, "--id", 4, "--requests", 50, "--warmup", 0, "--json", *norep,
             *cl.client_args],
            60, "warm-up")
    pids = cl.pids()
    if args.workload == "counter-seq":
        argv = [cl.binary, "counter", "--config", conf, "--id", 5, "--requests", args.requests, "--warmup", 10,
                "--json", *norep, *cl.client_args]
    else:
        argv = [cl.binary, "counter", "--config", conf, "--id", 5, "--clients", args.clients, "--duration-s",
                args.duration_s, "--warmup-s", 0, "--json", *norep, *cl.client_args]
    c0 = daemons_cpu_s(pids)
    k0 = cpu_of_children()
    t0 = time.monotonic()
    out = run_cmd(argv, 600, "counter")
    wall = time.monotonic() - t0
    client = cpu_of_children() - k0
    cpu = daemons_cpu_s(pids) - c0
    res = json.loads(out)
    ops = int(res["requests"]) if args.workload == "counter-seq" else int(res["ops"])
    return {"cpu_s": cpu, "client_cpu_s": client, "ops": ops, "wall_s": wall, "p50_us": res.get("p50_us"),
            "ops_per_s": res.get("ops_per_s", ops / wall)}


def fs_workload(cl: Cluster, args: argparse.Namespace, mnt: Path, tree) -> dict:
    mount = Mount(cl.binary, mnt, cl.dir / "mount.log", ["--relay", cl.relay_sock]).start(timeout_s=30)
    try:
        roles = {**cl.roles(), "mount": [mount.pid]}
        pids = [p for ps in roles.values() for p in ps]
        ops0 = cl.ops_completed()
        r0 = {k: daemons_cpu_s(v) for k, v in roles.items()}
        c0 = daemons_cpu_s(pids)
        t0 = time.monotonic()
        phases = {}
        root = mnt / "lua"
        # copy: written from memory, like the Andrew benchmark's phase 2
        root.mkdir()
        for d in tree.dirs:
            (root / d).mkdir()
        for rel, mode, data in tree.files:
            p = root / rel
            p.write_bytes(data)
            p.chmod(mode)
        phases["copy_s"] = time.monotonic() - t0
        t1 = time.monotonic()
        subprocess.run(["make", "-j2", "linux"], cwd=root, env=build_env(), check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=1800)
        phases["compile_s"] = time.monotonic() - t1
        t2 = time.monotonic()
        nbytes = 0
        for dirpath, _, files in os.walk(root):
            for name in files:
                nbytes += len((Path(dirpath) / name).read_bytes())
        phases["read_s"] = time.monotonic() - t2
        shutil.rmtree(root)
        wall = time.monotonic() - t0
        cpu = daemons_cpu_s(pids) - c0
        for k, v in roles.items():
            phases[f"cpu_{k}_s"] = daemons_cpu_s(v) - r0[k]
    finally:
        mount.stop()
    time.sleep(1.2)  # status.json is rewritten every second
    ops = cl.ops_completed() - ops0
    return {"cpu_s": cpu, "client_cpu_s": 0.0, "ops": ops, "wall_s": wall, "retransmissions": cl.relay_retransmissions(),
            "wal_sync_ms_max": cl.wal_sync_ms_max(), **phases}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=["counter-seq", "counter-load", "fs"], required=True)
    ap.add_argument("--config", action="append", required=True, help="LABEL=BINARY[,cluster-start args]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--duration-s", type=float, default=3.0)
    ap.add_argument("--port", type=int, default=7640)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    configs = [parse_config(c) for c in args.config]
    service = "fs" if args.workload == "fs" else "counter"
    tree = lua_source()[0] if service == "fs" else None
    root = Path(tempfile.mkdtemp(prefix="ab-cpu."))
    mnt = root / "mnt"
    mnt.mkdir()
    runs = []
    current: list[Cluster] = []

    def on_signal(signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        for rnd in range(1, args.rounds + 1):
            for label, binary, extra in configs:
                # Client ids 4 and 5.. are used by the workload: room for --clients of them.
                cl = Cluster(binary, extra, root, service, args.port, max(64, args.clients + 8))
                current[:] = [cl]
                cl.start()
                try:
                    if service == "fs":
                        r = fs_workload(cl, args, mnt, tree)
                    else:
                        r = counter_workload(cl, args)
                finally:
                    cl.stop()
                    current.clear()
                r.update(round=rnd, config=label, cpu_us_per_op=1e6 * r["cpu_s"] / max(1, r["ops"]),
                         loadavg=os.getloadavg()[0])
                runs.append(r)
                extra_txt = " ".join(f"{k}={r[k]:.2f}" for k in ("copy_s", "compile_s", "read_s", "cpu_server_s",
                                                                   "cpu_relay_s", "cpu_mount_s", "retransmissions",
                                                                   "wal_sync_ms_max") if k in r)
                print(f"round {rnd} {label:>10}: cpu_s={r['cpu_s']:.2f} client_cpu_s={r['client_cpu_s']:.2f} "
                      f"ops={r['ops']} cpu_us_per_op={r['cpu_us_per_op']:.1f} wall_s={r['wall_s']:.2f} "
                      f"{'p50_us=%.0f ' % r['p50_us'] if r.get('p50_us') else ''}"
                      f"{'ops_per_s=%.0f ' % r['ops_per_s'] if r.get('ops_per_s') else ''}{extra_txt} "
                      f"load={r['loadavg']:.1f}", flush=True)
    except KeyboardInterrupt:
        for cl in current:
            cl.stop()
        return 130
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
    summary = {}
    for label, _, _ in configs:
        mine = [r for r in runs if r["config"] == label]
        summary[label] = {k: statistics.median(r[k] for r in mine)
                          for k in ("cpu_us_per_op", "cpu_s", "client_cpu_s", "wall_s", "ops_per_s", "p50_us")
                          if all(r.get(k) is not None for r in mine)}
        print(f"median {label:>10}: " + " ".join(f"{k}={v:.1f}" for k, v in summary[label].items()))
    if args.json:
        args.json.write_text(json.dumps({"workload": args.workload, "configs": args.config, "runs": runs,
                                         "medians": summary, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                    time.gmtime())}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
