"""Helpers for the cluster integration tests (test_cluster_*.py) that conftest.py does not provide.

  CounterStream      a background stream of short `bftfs counter --requests R` runs, one fresh client id per
                     run, recording every run's outcome (the values clients saw acknowledged)
  LoadProcess        one closed-loop `bftfs counter --clients K` process in the background
  kill_all           SIGKILL several daemons at (nearly) the same instant, then reap them
  wait_caught_up     polls until replicas' status.json last_executed reach a target
  wait_converged     polls until replicas report one and the same last_executed
  status_value       reads a key of a (possibly nested) status.json object

Everything here is bounded: a stream stops when told to, when its client ids run out, or at its deadline;
every process it starts is in its own process group and is killed by stop()/close().
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from conftest import Cluster, Daemon, parse_json_output, wait_until


def status_value(status: dict | None, key: str):
    """`key` from a status.json object, searching nested objects (keys are unique across the nesting)."""
    if not isinstance(status, dict):
        return None
    if key in status:
        return status[key]
    for v in status.values():
        if isinstance(v, dict):
            found = status_value(v, key)
            if found is not None:
                return found
    return None


def last_executed(cluster: Cluster, i: int) -> int | None:
    return status_value(cluster.status(i), "last_executed")


def wait_caught_up(cluster: Cluster, ids: Iterable[int], target: int, timeout_s: float, what: str) -> None:
    """Polls until every replica in `ids` reports last_executed >= `target`."""
    ids = list(ids)

    def done() -> bool:
        return all((last_executed(cluster, i) or 0) >= target for i in ids)

    try:
        wait_until(done, timeout_s, what)
    except TimeoutError as e:
        seen = {i: last_executed(cluster, i) for i in ids}
        raise AssertionError(f"{e}: last_executed {seen}, target {target}") from None


def wait_converged(cluster: Cluster, ids: Iterable[int], timeout_s: float, above: int = 0) -> int:
    """Polls until every replica in `ids` reports the same last_executed, greater than `above`, and returns it.
    Status files are refreshed about every 500 ms, so a read may be stale: pass in `above` what must already be
    covered (e.g. a value read before the last requests were sent)."""
    ids = list(ids)

    def same():
        seen = {last_executed(cluster, i) for i in ids}
        if len(seen) != 1 or None in seen:
            return None
        value = seen.pop()
        return value if value > above else None

    try:
        return wait_until(same, timeout_s, f"replicas {ids} to report the same last_executed")
    except TimeoutError as e:
        raise AssertionError(f"{e}: {[cluster.status(i) for i in ids]}") from None


def kill_all(daemons: Sequence[Daemon]) -> None:
    """SIGKILL every daemon's process group first, then reap them all, so the crashes are near-simultaneous."""
    for d in daemons:
        if d.proc is not None and d.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(d.proc.pid, signal.SIGKILL)
    for d in daemons:
        d.kill()  # reaps (and re-signals harmlessly)


def _run_group(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess:
    """subprocess.run in a new process group that is killed whole on timeout."""
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return subprocess.CompletedProcess(proc.args, -9, out, err + "\n[killed: timeout or interrupt]")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@dataclass
class StreamRun:
    client_id: int
    requests: int
    started: float
    ended: float
    ok: bool
    result: dict = field(default_factory=dict)
    error: str = ""


class CounterStream:
    """A background thread running `bftfs counter --requests R --json` again and again, each run with the next
    unused client id, until stop(), until the ids run out, or until `deadline_s` passes.

    Each run either completes (its JSON gives final_value = the last value that client saw acknowledged, and
    resyncs = re-executions the service reported) or fails (the client gave up after --timeout-s)."""

    def __init__(self, bftfs: Path, config: Path, client_ids: Sequence[int], requests_per_run: int = 5,
                 cli_timeout_s: float = 30.0, deadline_s: float = 120.0, prefix: Sequence[str] = ()) -> None:
        self.bftfs = bftfs
        self.config = config
        self.client_ids = list(client_ids)
        self.requests_per_run = requests_per_run
        self.cli_timeout_s = cli_timeout_s
        self.deadline = time.monotonic() + deadline_s
        self.prefix = list(prefix)
        self.runs: list[StreamRun] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="counter-stream", daemon=True)

    def __enter__(self) -> "CounterStream":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _loop(self) -> None:
        for cid in self.client_ids:
            if self._stop.is_set() or time.monotonic() >= self.deadline:
                return
            argv = self.prefix + [str(self.bftfs), "counter", "--config", str(self.config), "--id", str(cid),
                                  "--requests", str(self.requests_per_run), "--warmup", "0",
                                  "--timeout-s", f"{self.cli_timeout_s:g}", "--json"]
            t0 = time.monotonic()
            done = _run_group(argv, self.cli_timeout_s + 30)
            run = StreamRun(cid, self.requests_per_run, t0, time.monotonic(), done.returncode == 0)
            if run.ok:
                try:
                    run.result = parse_json_output(done.stdout)
                except ValueError as e:
                    run.ok, run.error = False, f"unparsable output: {e}"
            else:
                run.error = f"exit {done.returncode}: {done.stderr.strip()[-1000:]}"
            with self._lock:
                self.runs.append(run)

    def stop(self, timeout_s: float | None = None) -> None:
        """Asks the thread to stop after its current run and waits for it (bounded by that run's timeout)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s if timeout_s is not None else self.cli_timeout_s + 60)
        assert not self._thread.is_alive(), "counter stream did not stop"

    def snapshot(self) -> list[StreamRun]:
        with self._lock:
            return list(self.runs)

    def ok_runs(self) -> list[StreamRun]:
        return [r for r in self.snapshot() if r.ok]

    def wait_acks(self, count: int, timeout_s: float, after: float = 0.0) -> None:
        """Waits until `count` runs that started at or after monotonic time `after` completed successfully."""
        def enough() -> bool:
            if not self._thread.is_alive() and len([r for r in self.ok_runs() if r.started >= after]) < count:
                raise AssertionError(f"counter stream ended early; runs: {self.describe()}")
            return len([r for r in self.ok_runs() if r.started >= after]) >= count
        wait_until(enough, timeout_s, f"{count} successful counter runs")

    def acked_values(self) -> list[int]:
        return [int(r.result["final_value"]) for r in self.ok_runs()]

    def describe(self) -> str:
        return "; ".join(f"id {r.client_id}: " + (f"value {r.result.get('final_value')}" if r.ok else r.error)
                         for r in self.snapshot()[-10:])


class LoadProcess:
    """One closed-loop `bftfs counter --clients K --duration-s S --json` run in the background."""

    def __init__(self, bftfs: Path, config: Path, first_client: int, clients: int, duration_s: float,
                 cli_timeout_s: float = 30.0, prefix: Sequence[str] = ()) -> None:
        self.argv = list(prefix) + [str(bftfs), "counter", "--config", str(config), "--id", str(first_client),
                                    "--clients", str(clients), "--duration-s", f"{duration_s:g}", "--warmup-s", "0",
                                    "--timeout-s", f"{cli_timeout_s:g}", "--json"]
        self.duration_s = duration_s
        self.cli_timeout_s = cli_timeout_s
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)

    def __enter__(self) -> "LoadProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()

    def finish(self) -> dict:
        """Waits for the run (bounded) and returns its JSON; AssertionError with stderr if it failed."""
        try:
            out, err = self.proc.communicate(timeout=self.duration_s + self.cli_timeout_s + 30)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{' '.join(self.argv)} did not finish") from None
        assert self.proc.returncode == 0, f"{' '.join(self.argv)} exited {self.proc.returncode}:\n{err[-3000:]}"
        return parse_json_output(out)

    def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.communicate()
