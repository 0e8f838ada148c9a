"""A cluster started by the one user command, `bftfs cluster start --dir DIR` (cli/cli_cluster.cc), and the
crashes and restarts of its members.

Layout of DIR: cluster.conf and keys; per member a pid file <name>.pid and a log <name>.log, where the members
are the replicas r<i> (data directory r<i>/ with status.json), or one NO-REP server norep (norep/), and for the
file service the relay (relay.sock, relay.status.json). `bftfs cluster stop --dir DIR` stops the processes the
pid files name; a member restarted here gets its new pid written there, so cluster stop stops it too.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Sequence

from harness.log import progress
from harness.ports import free_port_range
from harness.procs import HarnessError, cmdline, pid_alive, run_checked
from harness.waiting import wait_until

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0


def member(name: str | int) -> str:
    """A member's name: replica i is "r<i>"; "norep" and "relay" name themselves."""
    return f"r{name}" if isinstance(name, int) else name


class CliCluster:
    """`bftfs cluster start --dir DIR --f F --base-port P --service S [--norep] ARGS` and its members.

    `ports` consecutive free ports are allocated unless `base_port` is given. start() raises HarnessError with
    the command's output if the cluster does not come up; stop() never raises (it reports a failure as a
    progress line and returns False) and also kills members this object restarted."""

    def __init__(self, bftfs: Path, directory: Path, *, service: str = "fs", f: int = 1, norep: bool = False,
                 ports: int = 8, base_port: int | None = None, args: Sequence[object] = ()) -> None:
        self.bftfs = bftfs
        self.dir = directory
        self.service = service
        self.f = f
        self.n = 3 * f + 1
        self.norep = norep
        self.base_port = free_port_range(ports) if base_port is None else base_port
        self.args = [str(a) for a in args]
        self.restarted: dict[str, subprocess.Popen] = {}

    @property
    def relay_sock(self) -> Path:
        return self.dir / "relay.sock"

    @property
    def config(self) -> Path:
        return self.dir / "cluster.conf"

    def start_argv(self) -> list[object]:
        return [self.bftfs, "cluster", "start", "--dir", self.dir, "--f", self.f, "--base-port", self.base_port,
                "--service", self.service, *(["--norep"] if self.norep else []), *self.args]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "CliCluster":
        """Runs `cluster start` (it returns once every member reports that it runs) and, for the file service,
        waits for the relay's socket."""
        run_checked(self.start_argv(), timeout_s, "cluster start")
        if self.service == "fs" and "--no-relay" not in self.args:
            wait_until(self.relay_sock.exists, 30, f"the relay socket {self.relay_sock}")
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """`cluster stop` (if the cluster was made), then SIGKILL to members restarted here that are still
        running. True if cluster stop succeeded."""
        ok = True
        if self.config.exists():
            try:
                run_checked([self.bftfs, "cluster", "stop", "--dir", self.dir], timeout_s, "cluster stop")
            except HarnessError as exc:
                progress(f"WARNING: {exc}")
                ok = False
        for proc in self.restarted.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return ok

    # ---- members ----
    def pid(self, name: str | int) -> int:
        return int((self.dir / f"{member(name)}.pid").read_text().split()[0])

    def alive(self, name: str | int) -> bool:
        try:
            return pid_alive(self.pid(name))
        except (OSError, ValueError):
            return False

    def status_path(self, name: str | int) -> Path:
        name = member(name)
        return self.dir / ("relay.status.json" if name == "relay" else f"{name}/status.json")

    def status(self, name: str | int) -> dict | None:
        try:
            value = json.loads(self.status_path(name).read_text())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def kill(self, name: str | int) -> list[str]:
        """SIGKILL to member `name`, as in a crash; waits until it is gone and returns the argv it ran with
        (read from /proc before the kill), for restart()."""
        return self.kill_together(name)[member(name)]

    def kill_together(self, *names: str | int) -> dict[str, list[str]]:
        """SIGKILL to every named member at (nearly) the same instant; waits until each is gone and returns the
        argv each ran with, by member name."""
        argvs: dict[str, list[str]] = {}
        pids: dict[str, int] = {}
        for name in map(member, names):
            pids[name] = self.pid(name)
            argvs[name] = cmdline(pids[name])
            role = "replica" if name.startswith("r") and name[1:].isdigit() else name
            if role not in argvs[name]:
                raise HarnessError(f"pid {pids[name]} in {self.dir}/{name}.pid is not the {role}: {argvs[name]}")
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
        for name, pid in pids.items():
            if name in self.restarted:
                self.restarted.pop(name).wait()
            wait_until(lambda: not pid_alive(pid), 10, f"{name} (pid {pid}) to die")
        return argvs

    def restart(self, name: str | int, argv: Sequence[str]) -> int:
        """Starts member `name` again with `argv` in the background (its own session, output appended to its
        log, its status file removed so readiness is the new incarnation's) and records its pid in its pid file;
        returns the pid. Readiness is the caller's to poll (wait_ready)."""
        name = member(name)
        with contextlib.suppress(FileNotFoundError):
            self.status_path(name).unlink()
        with open(self.dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.restarted[name] = proc
        (self.dir / f"{name}.pid").write_text(f"{proc.pid}\n")
        return proc.pid

    def wait_ready(self, name: str | int, timeout_s: float) -> None:
        """Polls until member `name`'s status file names its current pid and says it runs; HarnessError if
        the process exits first."""
        name = member(name)
        pid = self.pid(name)

        def ready() -> bool:
            if not self.alive(name):
                raise HarnessError(f"restarted {name} exited; see {self.dir}/{name}.log")
            st = self.status(name)
            return bool(st and st.get("pid") == pid and st.get("running") is True)

        wait_until(ready, timeout_s, f"restarted {name} to be ready")

    # ---- the replicas' view of the world ----
    def agreed_view(self) -> int | None:
        """The view that a quorum (2f+1) of live replicas report while not in a view change (status.json,
        refreshed about every 500 ms), or None. Not the highest view any replica reports: a replica that was
        just restarted may sit alone in a higher view whose new-view never comes."""
        views = collections.Counter(
            int(st["view"]) for i in range(self.n)
            if self.alive(i) and (st := self.status(i)) and "view" in st and not st.get("in_view_change"))
        if not views:
            return None
        view, count = views.most_common(1)[0]
        return view if count >= 2 * self.f + 1 else None

    def view(self) -> int:
        view = self.agreed_view()
        if view is None:
            raise HarnessError("no quorum of live replicas agrees on a view")
        return view

    def primary(self, timeout_s: float = 60.0) -> int:
        """The primary of the view a quorum agrees on, waiting up to `timeout_s` for one (after a view change
        the status files catch up within a second)."""
        view = wait_until(lambda: (v := self.agreed_view()) is not None and (v,), timeout_s,
                          "a quorum of replicas to agree on a view")[0]
        return view % self.n

    def last_executed(self, i: int) -> int:
        st = self.status(i)
        return int(st.get("last_executed", -1)) if st else -1

    def transfer_stats(self, i: int) -> dict:
        st = self.status(i) or {}
        stats = st.get("stats", {}) if isinstance(st.get("stats"), dict) else {}
        return {k: stats.get(k) for k in ("state_transfers", "state_transfer_bytes")}
