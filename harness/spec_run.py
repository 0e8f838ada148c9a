"""`bftfs run` on a real cluster (docs/SPECULATION.md §8, §15): a file-service cluster whose relay sits at the
primary's site behind an emulated WAN, with a primary that may lie in its early replies; one run of a command
under `bftfs run` (or plainly) with its output read as it appears; the supervisor's `--trace` and `--stats-json`
read back; and the checks' raw material (every file's hash, output with arrival times).

Topology "primary-local D ms" (NSDI'09 §6): replicas 0-3 each at a site of their own, D ms one-way between
sites; the relay (the mount's only path to the replicas) at replica 0's site, the primary of view 0. A mount
talks to the relay over its Unix socket, so the mount and the programs it serves are at that site too.

Nothing here asserts: tests assert, the benchmark measures. Nothing here skips either: criu_missing() and
run_needs_root() say why a run cannot checkpoint or cannot run at all, and the caller decides.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from harness.cli_cluster import CliCluster
from harness.cluster import wan_args
from harness.mount import Mount
from harness.procs import kill_group, run_checked

CLIENTS = 16
PRIMARY_SITE = 0  # replica 0 is the primary of view 0


def read_client_ids(config: Path) -> list[int]:
    """The client ids in a cluster.conf written by `bftfs keygen` (format: common/config.h)."""
    ids = []
    for line in config.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) >= 2 and words[0] == "client":
            ids.append(int(words[1]))
    return ids


def spec_cluster(bftfs: Path, directory: Path, *, wan_delay_ms: float = 0.0, corrupt_early_replies: float = 0.0,
                 durable: bool = False, args: Sequence[object] = ()) -> CliCluster:
    """A file-service cluster for `bftfs run` (not started: call start(), then stop()): 4 replicas with the
    PBFT-CS shim and early replies, the primary corrupting `corrupt_early_replies` of them (0 = fault-free), and
    the relay trusting the primary always (`--distrust-window 0`, the paper's fault experiment: without it the
    relay would stop using a primary that lies more than 1% of the time, and a lying primary would test
    nothing). With `wan_delay_ms` > 0 the topology is primary-local (module docstring). Without `durable` the
    replicas do not fsync their logs (measurements of agreement latency, not of the disk).

    The keys are made here first (`bftfs keygen`), so the relay's client id is known when its site is named."""
    directory.mkdir(parents=True, exist_ok=True)
    cluster = CliCluster(bftfs, directory, service="fs")
    run_checked([bftfs, "keygen", "--dir", directory, "--f", cluster.f, "--clients", CLIENTS, "--hosts", "127.0.0.1",
                 "--base-port", cluster.base_port], 120, "keygen")
    relay_id = read_client_ids(cluster.config)[0]
    cluster.args = [str(a) for a in [
        "--shim", "--early-replies", "--log-level", "warn", *([] if durable else ["--no-fsync"]),
        "--corrupt-early-replies", f"{corrupt_early_replies:g}", "--relay-id", relay_id, "--distrust-window", 0,
        *wan_args(wan_delay_ms, {relay_id: PRIMARY_SITE}), *args]]
    return cluster


@contextlib.contextmanager
def cluster_mount(bftfs: Path, cluster: CliCluster, mountpoint: Path, log: Path,
                  extra_args: Sequence[object] = ()) -> Iterator[Mount]:
    """`bftfs mount --relay` of `cluster` at `mountpoint` (keep it short: FUSE and the control socket), stopped
    on exit."""
    with Mount(bftfs, mountpoint, log, ["--relay", cluster.relay_sock], extra_args) as m:
        yield m


# ---------------------------------------------------------------------------------------------------------
# One run


@dataclass
class RunResult:
    """A finished run: exit status, stdout and stderr bytes, each stdout line with the monotonic time it
    arrived (CLOCK_MONOTONIC, the clock of `--trace`), the wall time, and for `bftfs run` its stats and trace."""
    returncode: int
    stdout: bytes
    stderr: bytes
    lines: list[tuple[float, bytes]]
    wall_s: float
    stats: dict | None = None
    trace: list["TraceEvent"] = field(default_factory=list)

    def text(self) -> str:
        return self.stdout.decode(errors="replace")

    def err(self) -> str:
        return self.stderr.decode(errors="replace")


def run_argv(bftfs: Path, command: Sequence[object], *, stats_json: Path | None = None, trace: Path | None = None,
             verbose: bool = False, no_speculate: bool = False, extra: Sequence[object] = ()) -> list[str]:
    """`bftfs run [options] -- COMMAND`."""
    opts: list[object] = ["-v"] if verbose else []
    if no_speculate:
        opts.append("--no-speculate")
    if stats_json is not None:
        opts += ["--stats-json", stats_json]
    if trace is not None:
        opts += ["--trace", trace]
    return [str(a) for a in [bftfs, "run", *opts, *extra, "--", *command]]


def run_command(argv: Sequence[object], cwd: Path, *, stdin_lines: Sequence[bytes] | None = None,
                stdin_gap_s: float = 0.0, timeout_s: float = 300.0, stats_json: Path | None = None,
                trace: Path | None = None, env: dict | None = None) -> RunResult:
    """Runs `argv` in `cwd` to its end, reading stdout and stderr as they come (stdout line by line, each with
    its arrival time) and, with `stdin_lines`, writing them to its stdin one by one `stdin_gap_s` apart, then
    closing it (else stdin is /dev/null). Killed with its process group after `timeout_s` (TimeoutError).
    `stats_json` and `trace`, when given, are the files the run was told to write: they are read back."""
    start = time.monotonic()
    proc = subprocess.Popen([str(a) for a in argv], cwd=cwd, env=env, start_new_session=True,
                            stdin=subprocess.PIPE if stdin_lines is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err, lines = _pump(proc, stdin_lines or [], stdin_lines is not None, stdin_gap_s, start + timeout_s)
        code = proc.wait(timeout=max(1.0, start + timeout_s - time.monotonic()))
    except BaseException:
        kill_group(proc)
        raise
    wall = time.monotonic() - start
    result = RunResult(code, bytes(out), bytes(err), lines, wall)
    if stats_json is not None and stats_json.exists() and stats_json.stat().st_size:
        result.stats = json.loads(stats_json.read_text())
    if trace is not None and trace.exists():
        result.trace = parse_trace(trace.read_text())
    return result


def _pump(proc: subprocess.Popen, stdin_lines: Sequence[bytes], feed: bool, gap_s: float,
          deadline: float) -> tuple[bytearray, bytearray, list[tuple[float, bytes]]]:
    """run_command's loop: one thread, a selector over stdout and stderr, stdin fed on a schedule."""
    out, err, partial = bytearray(), bytearray(), bytearray()
    lines: list[tuple[float, bytes]] = []
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")
    pending = list(stdin_lines)
    next_feed = time.monotonic()
    open_streams = 2
    while open_streams:
        now = time.monotonic()
        if now >= deadline:
            raise TimeoutError(f"{proc.args} did not finish in time; output so far:\n{out[-2000:]!r}\n{err[-2000:]!r}")
        if feed and now >= next_feed:
            if pending:
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.write(pending.pop(0))
                    proc.stdin.flush()
                next_feed = now + gap_s
            else:
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.close()
                feed = False
        wait = min(0.1, deadline - now, max(0.0, next_feed - now) if feed else 0.1)
        for key, _ in sel.select(timeout=wait):
            chunk = os.read(key.fileobj.fileno(), 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                open_streams -= 1
                continue
            if key.data == "err":
                err += chunk
                continue
            arrived = time.monotonic()
            out += chunk
            partial += chunk
            while (eol := partial.find(b"\n")) >= 0:
                lines.append((arrived, bytes(partial[:eol])))
                del partial[:eol + 1]
    if partial:
        lines.append((time.monotonic(), bytes(partial)))
    return out, err, lines


# ---------------------------------------------------------------------------------------------------------
# --trace (criu-hooks/run_driver.cc: "<monotonic us> <event> <fields>", one line per event)


@dataclass
class TraceEvent:
    t: float        # seconds, CLOCK_MONOTONIC
    kind: str       # start, checkpoint, seal, commit, doomed, failed, rollback, release, finish, exit, fatal
    words: list[str]

    def num(self, i: int) -> int:
        return int(self.words[i])

    def field(self, key: str) -> str | None:
        for w in self.words:
            if w.startswith(key + "="):
                return w.split("=", 1)[1]
        return None


def parse_trace(text: str) -> list[TraceEvent]:
    events = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0].isdigit():
            events.append(TraceEvent(int(words[0]) / 1e6, words[1], words[2:]))
    return events


def epoch_of_output(trace: Sequence[TraceEvent], printed: float) -> int | None:
    """The epoch whose commit a line printed at monotonic time `printed` must wait for (§8.6), from the trace:
    printed while a speculative epoch ran, the first epoch sealed at or after `printed` (the line was read in
    that epoch or, if the tree printed it just before a freeze, in the one the freeze sealed); printed in a
    non-speculative stretch after sealed epochs, the last epoch sealed before it; before any checkpoint, None
    (such output passes at once). The trace's seals: "checkpoint NEXT seals K" (K sealed by a dump, NEXT
    speculative from then on), "seal K nodump" (K sealed, not speculative from then on), "rollback J rerun R
    speculative=S" (R runs from then on, speculative if S=1), "finish" (the root exited). The tree resumes just before its checkpoint's trace line is
written, so a line printed in between is taken for the epoch before: the check is weaker there, never wrong."""
    speculative = False
    last_sealed: int | None = None
    for ev in trace:
        if ev.t > printed:
            break
        if ev.kind == "checkpoint":
            speculative, last_sealed = True, ev.num(2)
        elif ev.kind == "seal":
            speculative, last_sealed = False, ev.num(0)
        elif ev.kind == "rollback":
            # FAILED(j) came first: every epoch before j committed, every later one is gone. Nothing older
            # is left for the re-run's output to wait for.
            speculative, last_sealed = ev.field("speculative") == "1", None
        elif ev.kind == "finish":
            speculative = False
    if speculative:
        for ev in trace:
            if ev.t >= printed and ev.kind == "checkpoint":
                return ev.num(2)
            if ev.t >= printed and ev.kind == "seal":
                return ev.num(0)
        # Sealed by FINISH: no trace line names it; the exit waits for every epoch, so the last commit covers it.
        commits = [ev.num(0) for ev in trace if ev.kind == "commit"]
        return max(commits) if commits else -1
    return last_sealed


def committed_by(trace: Sequence[TraceEvent], epoch: int, at: float) -> bool:
    """True if the trace shows a commit of `epoch` or a later one at or before monotonic time `at`."""
    return any(ev.kind == "commit" and ev.num(0) >= epoch and ev.t <= at for ev in trace)


# ---------------------------------------------------------------------------------------------------------
# What a run needs


def run_needs_root() -> str | None:
    """Why `bftfs run` cannot run here, or None."""
    if os.geteuid() != 0:
        return "bftfs run needs root (it creates mount and pid namespaces)"
    return None


def criu_missing(bftfs: Path) -> str | None:
    """Why `bftfs run` cannot checkpoint here (the private CRIU from `make deps`, a build with libcriu), or
    None. What the supervisor needs is looked up as it does: `bftfs-criu` in PATH or $BFTFS_CRIU, and libcriu
    linked in (`bftfs run --help` runs without it, so the build's CMake cache is asked)."""
    binary = os.environ.get("BFTFS_CRIU", "bftfs-criu")
    if shutil.which(binary) is None:
        return f"{binary} is not installed: `make deps` installs CRIU 4.1.1 (scripts/install-criu.sh)"
    cache = bftfs.parent.parent / "CMakeCache.txt"
    if cache.is_file() and "CRIU_FOUND:INTERNAL=1" not in cache.read_text(errors="replace"):
        return "bftfs was built without libcriu (criu-hooks/CMakeLists.txt): `make deps`, then rebuild"
    return None


def stats_summary(stats: dict | None) -> dict:
    """The numbers of a `--stats-json` that the tests and the benchmark report: epochs, checkpoints, rollbacks
    (each with epoch, cause, detail, restore_ms and discarded_ms), the latency hidden, how long the run
    speculated and how long the policy found it did not pay, entries, 1-reply predictions, and the daemon's own
    STATS lines."""
    if not stats:
        return {"epochs_committed": 0, "epochs_discarded": 0, "checkpoints": 0, "rollbacks": []}
    return {"epochs_committed": stats.get("epochs_committed", 0), "epochs_discarded": stats.get("epochs_discarded", 0),
            "checkpoints": len(stats.get("checkpoints", [])),
            "checkpoint_failures": stats.get("checkpoint_failures", 0),
            "rollbacks": [{"epoch": r["epoch"], "cause": r["cause"], "detail": r.get("detail", ""),
                           "restore_ms": round(r["restore_us"] / 1000, 3),
                           "discarded_ms": round(r["discarded_us"] / 1000, 3)} for r in stats.get("rollbacks", [])],
            "hidden_ms": round(stats.get("hidden_us", 0) / 1000, 3),
            "run_ms": round(stats.get("run_us", 0) / 1000, 3),
            "speculating_ms": round(stats.get("speculating_us", 0) / 1000, 3),
            "not_paying_ms": round(stats.get("policy_off_us", 0) / 1000, 3),
            "entries": stats.get("entries", 0), "one_reply": stats.get("one_reply", 0),
            "daemon": stats.get("daemon", "").splitlines()}
