"""The relay (`bftfs relay`, docs/RELAY.md): a daemon in front of a Cluster, and its STATUS counters."""

from __future__ import annotations

import socket
import struct
import subprocess
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


# The relay's socket protocol (docs/RELAY.md): a frame is u32 length || body, the body's first byte its type.
FRAME_BODY_MAX = 2 * 1024 * 1024 + 64
HELLO_BODY = b"\x01" + struct.pack("<H", 1)  # HELLO, protocol version 1
STATUS_BODY = b"\x04"


def frame(body: bytes) -> bytes:
    """`body` as one frame on the relay's socket."""
    return struct.pack("<I", len(body)) + body


def submit_frame(tag: int, request: bytes, flags: int = 0, deps: tuple[int, ...] = ()) -> bytes:
    """A SUBMIT frame: the mount's `tag`, `flags` (bit 1: report the first reply), the tags it depends on and
    the encoded fs request."""
    return frame(b"\x02" + struct.pack("<QBH", tag, flags, len(deps)) + b"".join(struct.pack("<Q", d) for d in deps)
                 + struct.pack("<I", len(request)) + request)


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError(f"the peer closed the connection ({len(data)} of {n} bytes read)")
        data += chunk
    return data


def read_frame(conn: socket.socket) -> bytes:
    """The next frame's body from `conn`; EOFError when the peer closes first. A length outside 1 ..
    FRAME_BODY_MAX is a protocol error of the peer (AssertionError)."""
    (n,) = struct.unpack("<I", _read_exactly(conn, 4))
    assert 1 <= n <= FRAME_BODY_MAX, f"frame length {n}"
    return _read_exactly(conn, n)


def relay_counters(sock: Path, timeout_s: float = 10.0) -> dict[str, int]:
    """Asks the relay on `sock` for its STATUS (docs/RELAY.md: HELLO, then STATUS; STATUS_REPLY is one
    `key value` per line) and returns the numeric facts. Exact at the moment of asking, unlike the status file
    the relay rewrites twice a second."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout_s)
        conn.connect(str(sock))
        conn.sendall(frame(HELLO_BODY) + frame(STATUS_BODY))
        while True:
            try:
                body = read_frame(conn)
            except EOFError as e:
                raise HarnessError(f"the relay on {sock} closed the status connection: {e}") from e
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


def fsop(bftfs: Path, sock: Path, *args: str, check: bool = True,
         timeout_s: float = 60) -> subprocess.CompletedProcess:
    """Runs `bftfs fsop --socket sock ARGS` (one file operation through the relay) and returns it; with `check`,
    a non-zero exit fails the caller with the command's output."""
    argv = [str(bftfs), "fsop", "--socket", str(sock), *map(str, args)]
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s)
    if check:
        assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done
