"""The counter client, `bftfs counter ... --json`: one run to completion, a background stream of short runs,
and a background closed-loop load. Every process runs in its own process group and is killed on a timeout."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from harness.procs import run_in_group
from harness.waiting import wait_until


def parse_json_output(text: str) -> dict:
    """The JSON object a `--json` command printed: the whole stdout, or else its last line that is an object
    (so a log line before it does not break parsing). ValueError if there is none."""
    text = text.strip()
    try:
        value = json.loads(text)
    except ValueError:
        value = None
        for line in reversed(text.splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    value = json.loads(line)
                    break
                except ValueError:
                    continue
    if not isinstance(value, dict):
        raise ValueError(f"no JSON object in output:\n{text[-2000:]}")
    return value


def counter_argv(bftfs: Path, config: Path, client_id: int, *, requests: int | None = None, norep: bool = False,
                 server: str | None = None, clients: int | None = None, duration_s: float | None = None,
                 extra: Iterable[object] = (), prefix: Sequence[str] = ()) -> list[str]:
    """`bftfs counter --config CONFIG --id CLIENT_ID --json ...` after `prefix`. With norep=True the client talks
    to the NO-REP server at `server` ("host:port"; the client's default is replica 0's address)."""
    argv = list(prefix) + [str(bftfs), "counter", "--config", str(config), "--id", str(client_id), "--json"]
    if requests is not None:
        argv += ["--requests", str(requests)]
    if norep:
        argv.append("--norep")
        if server is not None:
            argv += ["--server", server]
    if clients is not None:
        argv += ["--clients", str(clients)]
    if duration_s is not None:
        argv += ["--duration-s", f"{duration_s:g}"]
    return argv + [str(a) for a in extra]


def run_counter(argv: Sequence[str], timeout_s: float = 300.0) -> dict:
    """Runs one counter command line to completion and returns its JSON. RuntimeError with its stderr if it
    fails, does not finish within `timeout_s` (it is killed), or prints no JSON."""
    done = run_in_group(argv, timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}; stderr:\n{done.stderr.strip()[-4000:]}")
    try:
        return parse_json_output(done.stdout)
    except ValueError as e:
        raise RuntimeError(f"{' '.join(argv)}: {e}; stderr:\n{done.stderr.strip()[-2000:]}") from None


def counter(bftfs: Path, config: Path, client_id: int, *, timeout_s: float = 300.0, **options) -> dict:
    """run_counter(counter_argv(bftfs, config, client_id, **options), timeout_s)."""
    return run_counter(counter_argv(bftfs, config, client_id, **options), timeout_s)


def counter_help(bftfs: Path) -> str:
    """`bftfs counter --help` (to detect optional features such as --timeline-ms)."""
    done = subprocess.run([str(bftfs), "counter", "--help"], capture_output=True, text=True, timeout=10)
    return done.stdout + done.stderr


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
            done = run_in_group(argv, self.cli_timeout_s + 30)
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
