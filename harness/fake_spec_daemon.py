"""A stand-in for the mount daemon's side of `bftfs run`'s control protocol (docs/SPECULATION.md §9), so that the
supervisor (criu-hooks/) can be tested with real trees and real CRIU before the daemon's spec session exists.

It listens on a Unix socket that `bftfs run --test-control SOCKET` connects to (the working directory then plays
the mount), answers every request as §9 says, reports WAITS so that the supervisor's policy speculates, and decides
each sealed epoch's fate by a script: every speculative epoch commits `commit_delay_s` after its seal, except the
ones whose ordinal (1 for the first speculative seal of the run, re-runs counted too) is in `fail_seals`, which
fail (optionally DOOMED first). It serves one run, in a thread, and records what it saw with monotonic times, so
tests can compare output arrival with commit times.

It checks the supervisor's requests against the protocol's rules as it goes (a request out of place is recorded
in `errors`, and the connection is closed), and never decides anything the real daemon would not: COMMITTED(e) only
once every epoch <= e committed, FAILED only for the oldest uncommitted epoch.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

# Message types (spec/control_wire.h).
HELLO, ATTACH, PREPARE, SEAL, ABORT, ROLLBACK, RESTORED, FINISH, DETACH, STATS = range(1, 11)
HELLO_OK, ATTACHED, PREPARED, SEALED, COMMITTED, DOOMED, FAILED, READY_FOR_RESTORE = range(129, 137)
ADVICE, WAITS, STATS_REPLY, FATAL, WINDOW_CLOSED, DETACHED = range(137, 143)
VERSION = 1
SPECULATIVE, NOT_SPECULATIVE = 0, 1
CAUSE_ENTRY = 2


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<H", len(b)) + b


def frame(type_: int, fields: bytes = b"") -> bytes:
    body = bytes([type_]) + fields
    return struct.pack("<I", len(body)) + body


class _Reader:
    def __init__(self, body: bytes):
        self.body, self.pos = body, 0

    def take(self, fmt: str):
        v = struct.unpack_from("<" + fmt, self.body, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v


@dataclass
class Event:
    t: float          # time.monotonic()
    what: str         # "request", "sent"
    name: str
    fields: dict = field(default_factory=dict)


class FakeSpecDaemon:
    """One run's daemon. `mount` is the directory that plays the mount (the run's working directory)."""

    def __init__(self, mount: Path, socket_path: Path, *, fail_seals: set[int] | None = None,
                 commit_delay_s: float = 0.05, hideable_us_per_100ms: int = 500_000,
                 sealed_hidden_us: int = 30_000_000, doom_first: bool = False, stats_text: str = "fake daemon\n"):
        self.mount, self.socket_path = Path(mount), Path(socket_path)
        self.fail_seals = set(fail_seals or ())
        self.commit_delay_s, self.hideable = commit_delay_s, hideable_us_per_100ms
        # What SEALED says each speculative epoch hid: by default far more than any checkpoint costs, so that the
        # policy keeps speculating however slow the machine's dumps are.
        self.sealed_hidden_us = sealed_hidden_us
        self.doom_first, self.stats_text = doom_first, stats_text
        self.run_dir = "/.bftfs-run/1"
        self.events: list[Event] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()
        # Protocol state: the open stretch, whether it is speculative, the sealed epochs waiting for their fate.
        self.open, self.speculative = 0, False
        self.max_used = 0
        self.pending: list[tuple[int, float, bool]] = []  # (epoch, due time, fails), oldest first
        self.seals = 0  # speculative seals so far (the ordinal fail_seals names)
        self.awaiting_rollback: int | None = None
        self.rerun: int | None = None
        self.finished = False
        self.detached = False
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.socket_path))
        self._listener.listen(1)
        self._conn: socket.socket | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)

    # ---- life ----
    def __enter__(self) -> "FakeSpecDaemon":
        for name in ("tmp", "var-tmp", "shm"):
            d = self.mount / self.run_dir.lstrip("/") / name
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o1777)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop = True
        self._thread.join(timeout=10)
        self._listener.close()
        if self._conn is not None:
            self._conn.close()
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass

    # ---- what it saw ----
    def names(self, what: str | None = None) -> list[str]:
        with self.lock:
            return [e.name for e in self.events if what is None or e.what == what]

    def times(self, name: str, what: str = "sent") -> list[tuple[float, dict]]:
        with self.lock:
            return [(e.t, e.fields) for e in self.events if e.what == what and e.name == name]

    # ---- the connection ----
    def _record(self, what: str, name: str, **fields) -> None:
        with self.lock:
            self.events.append(Event(time.monotonic(), what, name, fields))

    def _send(self, type_: int, fields: bytes, name: str, **info) -> None:
        self._record("sent", name, **info)
        self._conn.sendall(frame(type_, fields))

    def _error(self, why: str) -> None:
        self.errors.append(why)
        self._stop = True

    def _serve(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop and self._conn is None:
            try:
                self._conn, _ = self._listener.accept()
            except socket.timeout:
                continue
        if self._conn is None:
            return
        buf = b""
        next_waits = time.monotonic() + 0.1
        while not self._stop:
            ready, _, _ = select.select([self._conn], [], [], 0.01)
            if ready:
                data = self._conn.recv(65536)
                if not data:
                    break
                buf += data
                while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from("<I", buf)[0]:
                    n = struct.unpack_from("<I", buf)[0]
                    body, buf = buf[4:4 + n], buf[4 + n:]
                    self._request(body)
            now = time.monotonic()
            if now >= next_waits and not self.speculative and not self.finished:
                next_waits = now + 0.1
                self._send(WAITS, struct.pack("<QQI", 0, self.hideable, 10), "WAITS")
            self._decide(now)

    # ---- fates ----
    def _decide(self, now: float) -> None:
        if self.awaiting_rollback is not None or not self.pending:
            return
        epoch, due, fails = self.pending[0]
        if now < due:
            return
        if fails:
            if self.doom_first:
                self._send(DOOMED, struct.pack("<Q", epoch), "DOOMED", epoch=epoch)
            self._send(FAILED, struct.pack("<QB", epoch, CAUSE_ENTRY) + _str("scripted failure"), "FAILED",
                       epoch=epoch)
            self.awaiting_rollback = epoch
            return
        self.pending.pop(0)
        self._send(COMMITTED, struct.pack("<Q", epoch), "COMMITTED", epoch=epoch)

    def _seal(self, epoch: int, next_: int) -> None:
        if epoch != self.open:
            self._error(f"SEAL {epoch} while the open stretch is {self.open}")
            return
        if self.speculative:
            self._record("internal", "sealed", epoch=epoch)  # by SEAL, or by FINISH
            self.seals += 1
            self.pending.append((epoch, time.monotonic() + self.commit_delay_s, self.seals in self.fail_seals))
        self.open = epoch + 1
        self.max_used = max(self.max_used, self.open)
        self.speculative = next_ == SPECULATIVE

    # ---- requests ----
    def _request(self, body: bytes) -> None:  # noqa: C901 (one branch per request type, as §9 lists them)
        r = _Reader(body)
        t = r.take("B")
        if t == HELLO:
            self._record("request", "HELLO")
            self._send(HELLO_OK, struct.pack("<HI", VERSION, 7) + _str("") + _str(self.run_dir) +
                       struct.pack("<Q", 1), "HELLO_OK")
        elif t == ATTACH:
            pidns, allowed, model_mb = r.take("QBI")
            self._record("request", "ATTACH", pidns=pidns, speculate_allowed=allowed, model_mb=model_mb)
            self._send(ATTACHED, b"", "ATTACHED")
        elif t == PREPARE:
            epoch, next_, hide = r.take("QBI")
            self._record("request", "PREPARE", epoch=epoch, hide_target_us=hide)
            self._send(PREPARED, b"\x01" + _str(""), "PREPARED")
        elif t == SEAL:
            epoch, next_, dump_ms, frozen_ms, image_kib = r.take("QBIII")
            self._record("request", "SEAL", epoch=epoch, next=next_, dump_ms=dump_ms)
            was_speculative = self.speculative
            self._seal(epoch, next_)
            hidden = self.sealed_hidden_us if was_speculative else 0
            self._send(SEALED, struct.pack("<QIIQQ", epoch, 10, 1, hidden, 100), "SEALED", epoch=epoch)
        elif t == ABORT:
            self._record("request", "ABORT", epoch=r.take("Q"))
        elif t == ROLLBACK:
            epoch = r.take("Q")
            self._record("request", "ROLLBACK", epoch=epoch)
            if epoch != self.awaiting_rollback:
                self._error(f"ROLLBACK {epoch} while {self.awaiting_rollback} failed")
                return
            self.rerun = self.max_used + 1
            self.max_used = self.rerun
            self._send(READY_FOR_RESTORE, struct.pack("<Q", self.rerun), "READY_FOR_RESTORE", epoch=self.rerun)
        elif t == RESTORED:
            pidns, next_, restore_ms = r.take("QBI")
            self._record("request", "RESTORED", next=next_, restore_ms=restore_ms)
            self.pending.clear()
            self.awaiting_rollback = None
            self.open, self.speculative, self.finished = self.rerun, next_ == SPECULATIVE, False
            self._send(WINDOW_CLOSED, struct.pack("<Q", self.rerun), "WINDOW_CLOSED", epoch=self.rerun)
        elif t == FINISH:
            how, value = r.take("BI")
            self._record("request", "FINISH", how=how, value=value)
            self.finished = True
            if self.speculative:
                self._seal(self.open, NOT_SPECULATIVE)
        elif t == STATS:
            self._record("request", "STATS")
            self._send(STATS_REPLY, _str(self.stats_text), "STATS_REPLY")
        elif t == DETACH:
            self._record("request", "DETACH")
            if self.pending:
                self._error("DETACH with epochs uncommitted")
                return
            self.detached = True
            self._send(DETACHED, b"", "DETACHED")
        else:
            self._error(f"unknown request type {t}")


def main() -> None:
    """`python3 -m harness.fake_spec_daemon DIR`: serves one `bftfs run --test-control DIR/ctl.sock` started in
    DIR, then prints what it saw. For trying the supervisor by hand (criu-hooks/README.md)."""
    import argparse
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("dir", type=Path)
    parser.add_argument("--fail-seals", default="", help="seal ordinals that fail, e.g. 2,5")
    parser.add_argument("--commit-delay-ms", type=int, default=50)
    parser.add_argument("--hideable-ms", type=int, default=500, help="latency to hide reported per 100 ms")
    a = parser.parse_args()
    fails = {int(x) for x in a.fail_seals.split(",") if x}
    with FakeSpecDaemon(a.dir, a.dir / "ctl.sock", fail_seals=fails, commit_delay_s=a.commit_delay_ms / 1000,
                        hideable_us_per_100ms=a.hideable_ms * 1000) as daemon:
        print(f"serving {daemon.socket_path}: run `bftfs run --test-control {daemon.socket_path} -- CMD` in "
              f"{a.dir}", flush=True)
        daemon._thread.join()
    for e in daemon.events:
        if e.name != "WAITS":
            print(f"{e.t:.3f} {e.what:8} {e.name} {e.fields or ''}")
    for why in daemon.errors:
        print(f"protocol error: {why}")


if __name__ == "__main__":
    main()
