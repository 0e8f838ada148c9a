"""The relay (`bftfs relay`, docs/RELAY.md): a daemon in front of a Cluster, and its STATUS counters."""

from __future__ import annotations

import socket
import struct
import tempfile
from pathlib import Path

from harness.daemon import Daemon
from harness.procs import HarnessError


def short_dir(base: Path) -> Path:
    """`base`, or a new directory under /tmp when `base` is so long that a socket path in it would not fit
    sun_path (108 bytes), as pytest's tmp_path can be."""
    if len(str(base)) < 80:
        return base
    return Path(tempfile.mkdtemp(prefix="bftfs-relay-", dir="/tmp"))


class Relay:
    """A relay for `cluster` (a harness Cluster) on `root`/relay.sock, as the cluster's last client id, its
    status in `root`/relay/status.json and its log in the cluster's root (relay.log). `extra` are more
    `bftfs relay` arguments."""

    def __init__(self, bftfs: Path, cluster, root: Path, *extra: str) -> None:
        self.sock = root / "relay.sock"
        self.client_id = cluster.client_ids[-1]
        self.daemon = Daemon("relay", [bftfs, "relay", "--config", cluster.config, "--id", self.client_id,
                                       "--socket", self.sock, "--status", root / "relay" / "status.json", *extra],
                             cluster.root / "relay.log", root / "relay")

    def start(self) -> "Relay":
        self.daemon.start()
        self.daemon.wait_ready()
        return self

    def errors(self) -> list[str]:
        return self.daemon.error_lines()


def _frame(body: bytes) -> bytes:
    return struct.pack("<I", len(body)) + body


def _read_exactly(conn: socket.socket, n: int, sock: Path) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise HarnessError(f"the relay on {sock} closed the status connection")
        data += chunk
    return data


def relay_counters(sock: Path, timeout_s: float = 10.0) -> dict[str, int]:
    """Asks the relay on `sock` for its STATUS (docs/RELAY.md: HELLO, then STATUS; STATUS_REPLY is one
    `key value` per line) and returns the numeric facts. Exact at the moment of asking, unlike the status file
    the relay rewrites twice a second."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout_s)
        conn.connect(str(sock))
        conn.sendall(_frame(b"\x01" + struct.pack("<H", 1)) + _frame(b"\x04"))
        while True:
            (n,) = struct.unpack("<I", _read_exactly(conn, 4, sock))
            body = _read_exactly(conn, n, sock)
            if body[:1] == b"\x84":  # STATUS_REPLY: u32 len || text
                (n,) = struct.unpack("<I", body[1:5])
                text = body[5:5 + n].decode()
                break
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.isdigit():
            out[key] = int(value)
    return out
