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

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import common  # noqa: E402
from common import progress, wait_until  # noqa: E402
from harness.durability import run_round, run_total_crash_round  # noqa: E402

N = 4  # f = 1


def read_pid(path: Path) -> int:
    return int(path.read_text().split()[0])


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def spawn(argv: list[str], log: Path, pid_file: Path) -> subprocess.Popen:
    """Starts argv in its own session, appending to `log`, and records its pid where `cluster stop` looks."""
    with open(log, "ab") as out:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True)
    pid_file.write_text(f"{p.pid}\n")
    return p


def ready(status: Path, pid: int) -> bool:
    try:
        value = json.loads(status.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(value, dict) and value.get("pid") == pid and value.get("running") is True


class Bench:
    def __init__(self, bftfs: Path, root: Path) -> None:
        self.bftfs, self.root = bftfs, root
        self.dir = root / "c"
        self.work = root / "work"
        self.work.mkdir(parents=True)
        self.mounts = 0
        self.mount_proc: subprocess.Popen | None = None
        self.mnt: Path | None = None
        self.children: list[subprocess.Popen] = []  # restarted daemons, reaped at the end

    def start(self) -> None:
        port = common.free_port_range(N + 1)
        done = subprocess.run([str(self.bftfs), "cluster", "start", "--dir", str(self.dir), "--base-port", str(port),
                               "--service", "fs", "--log-level", "warn"], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"cluster start failed: {done.stderr}")
        self.mount()

    def mount(self) -> Path:
        self.mnt = self.root / f"mnt{self.mounts}"
        self.mnt.mkdir()
        self.mounts += 1
        self.mount_proc = subprocess.Popen([str(self.bftfs), "mount", "--relay", str(self.dir / "relay.sock"),
                                            str(self.mnt), "-f", "--log", str(self.root / f"{self.mnt.name}.log")],
                                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, start_new_session=True)
        wait_until(lambda: os.path.ismount(self.mnt) or self.mount_proc.poll() is not None, 30, "the mount")
        if self.mount_proc.poll() is not None:
            raise RuntimeError(f"bftfs mount exited with {self.mount_proc.returncode}")
        return self.mnt

    # ---- kills and restarts ----
    def _targets(self, relay: bool) -> list[tuple[str, int, list[str]]]:
        names = [f"r{i}" for i in range(N)] + (["relay"] if relay else [])
        out = []
        for name in names:
            pid = read_pid(self.dir / f"{name}.pid")
            out.append((name, pid, cmdline(pid)))
        return out

    def kill_replicas(self, relay: bool = False) -> None:
        self._killed = self._targets(relay)
        extra = [self.mount_proc.pid] if relay and self.mount_proc is not None else []
        for _, pid, _ in self._killed:
            os.kill(pid, signal.SIGKILL)
        for pid in extra:
            os.killpg(pid, signal.SIGKILL)
        for _, pid, _ in self._killed:
            wait_until(lambda: not Path(f"/proc/{pid}").exists() or
                       Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", 10, f"pid {pid} to die")
        for p in self.children:
            p.poll()  # reap restarted daemons that were just killed
        if extra:
            self.mount_proc.wait()
            self.mount_proc = None
            subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True, timeout=30)

    def restart(self) -> None:
        started = []
        for name, _, argv in self._killed:
            status = self.dir / (f"{name}/status.json" if name != "relay" else "relay.status.json")
            with contextlib.suppress(FileNotFoundError):
                status.unlink()
            p = spawn(argv, self.dir / f"{name}.log", self.dir / f"{name}.pid")
            self.children.append(p)
            started.append((status, p))
        for status, p in started:
            wait_until(lambda: ready(status, p.pid) or p.poll() is not None, 60, f"{status} to be ready")
            if p.poll() is not None:
                raise RuntimeError(f"{' '.join(p.args)} exited with {p.returncode}")

    def kill_everything(self) -> None:
        self.kill_replicas(relay=True)

    def restart_everything(self) -> Path:
        self.restart()
        return self.mount()

    def close(self) -> None:
        if self.mount_proc is not None and self.mnt is not None:
            subprocess.run([str(self.bftfs), "umount", "--lazy", str(self.mnt)], capture_output=True, timeout=30)
            try:
                self.mount_proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.mount_proc.pid, signal.SIGKILL)
                self.mount_proc.wait()
        subprocess.run([str(self.bftfs), "cluster", "stop", "--dir", str(self.dir)], capture_output=True, timeout=60)
        for p in self.children:
            with contextlib.suppress(ProcessLookupError):
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def main() -> int:
    common.exit_cleanly_on_sigterm()
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        raise SystemExit("needs root and /dev/fuse (FUSE mounts)")
    quick = common.quick_mode()
    bftfs = common.bftfs_binary()
    busy = common.machine_busy_before()
    root = Path(tempfile.mkdtemp(prefix="bftfs-bench-dur-"))
    kills = (3, 30, 60) if quick else (3, 20, 35, 50, 70, 90)
    total_kills = (25,) if quick else (8, 25, 45)
    b = Bench(bftfs, root)
    rounds, total = [], []
    t0 = time.monotonic()
    try:
        b.start()
        progress(f"cluster up in {b.dir}, mounted on {b.mnt}")
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
        if common.keep_scratch():
            progress(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    everything = rounds + total
    result = {
        "meta": common.run_metadata(machine_before=busy, wall_s=round(time.monotonic() - t0, 1)),
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
    out = common.RESULTS_DIR / "fs-durability.json"
    common.write_json(out, result)
    progress(f"wrote {out}: {result['records_found']}/{result['records_fsynced']} records, "
             f"{result['problems']} problems")
    return 0 if result["problems"] == 0 and result["records_found"] == result["records_fsynced"] else 1


if __name__ == "__main__":
    sys.exit(main())
