"""SUBMIT dependencies through a real relay in front of a 4-replica file-service cluster whose primary lies in
every early reply (`--corrupt-early-replies 1`). A mount acts on FIRST(A) and submits B depending on A a few
milliseconds later; by then the relay may already have sent FINAL(A), which shows the FIRST was wrong. B must
not execute either way (docs/RELAY.md, "Dependencies"): otherwise a speculating mount that rolls back and
redoes B duplicates its effect.

The fs requests are the real encoder's: `bftfs fsop` is run once against a stand-in socket that answers HELLO
and keeps the SUBMIT's request bytes, which the test then sends to the real relay with its own tags, flags and
dependencies."""

from __future__ import annotations

import socket
import struct
import threading
from pathlib import Path

from harness.daemon import Daemon
from harness.relay import HELLO_BODY, frame, fsop, read_frame, short_dir, submit_frame

FIRST, FINAL = 130, 131
FLAG_REPORT_FIRST = 2
STATUS_COMMITTED, STATUS_ROLLED_BACK, STATUS_REFUSED = 0, 1, 2


def request_bytes(bftfs: Path, root: Path, op: str, path: str) -> bytes:
    """The fs request `bftfs fsop --op OP --path PATH` sends, caught on a stand-in relay socket."""
    sock_path = root / "capture.sock"
    sock_path.unlink(missing_ok=True)
    caught: list[bytes] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(sock_path))
        listener.listen(1)
        listener.settimeout(30)

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(30)
                assert read_frame(conn)[0] == 1  # HELLO
                conn.sendall(frame(b"\x81" + struct.pack("<HIII", 1, 1, 4, 1)))
                body = read_frame(conn)
                assert body[0] == 2  # SUBMIT: type, u64 tag, u8 flags, u16 ndeps, deps, u32 len, request
                (ndeps,) = struct.unpack("<H", body[10:12])
                at = 12 + 8 * ndeps
                (n,) = struct.unpack("<I", body[at:at + 4])
                caught.append(body[at + 4:at + 4 + n])

        server = threading.Thread(target=serve)
        server.start()
        fsop(bftfs, sock_path, "--op", op, "--path", path, "--timeout-s", "5", check=False)
        server.join(30)
    assert len(caught) == 1, f"fsop sent no SUBMIT for {op} {path}"
    return caught[0]


def final_for(s: socket.socket, tag: int) -> tuple[int, bytes]:
    """Reads frames until the FINAL for `tag`: (status, payload)."""
    while True:
        body = read_frame(s)
        if body[0] == FINAL and struct.unpack("<Q", body[1:9])[0] == tag:
            status, n = struct.unpack("<BI", body[9:14])
            return status, body[14:14 + n]


def test_a_request_on_a_wrong_first_reply_never_executes(cluster, bftfs_bin, tmp_path):
    c = cluster(service="fs", replica_args=["--shim", "--no-fsync", "--early-replies", "--corrupt-early-replies", "1"])
    root = short_dir(tmp_path)
    sock = root / "relay.sock"
    relay = Daemon("relay", [bftfs_bin, "relay", "--config", c.config, "--id", c.client_ids[-1], "--socket", sock,
                             "--status", root / "relay" / "status.json"], c.root / "relay.log", root / "relay")
    # Runs 0-2: B goes as soon as FIRST(A) arrives (FINAL(A) may or may not have been sent by then); run 3: B
    # goes after FINAL(A) arrived, so the relay certainly knows A's outcome.
    runs = [(f"/a{i}", f"/b{i}", i == 3) for i in range(4)]
    requests = {p: request_bytes(bftfs_bin, root, "create", p) for a, b, _ in runs for p in (a, b)}
    outcomes = []
    try:
        relay.start().wait_ready()
        for a, b, after_final in runs:
            # A fresh relay each run: it stops trusting a primary after two wrong early replies (NSDI'09 §3.4),
            # and then sends no FIRST to act on.
            relay.restart()
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(30)
                s.connect(str(sock))
                s.sendall(frame(HELLO_BODY))
                assert read_frame(s)[0] == 129
                s.sendall(submit_frame(1, requests[a], FLAG_REPORT_FIRST))
                body = read_frame(s)
                assert body[0] == FIRST, "no FIRST for A: nothing to depend on"
                final_a = final_for(s, 1) if after_final else None
                s.sendall(submit_frame(2, requests[b], FLAG_REPORT_FIRST, deps=(1,)))
                if final_a is None:
                    final_a = final_for(s, 1)
                status_b, payload_b = final_for(s, 2)
            assert final_a[0] == STATUS_ROLLED_BACK, f"A's FIRST was a lie, yet FINAL(A) says {final_a[0]}"
            executed = "errno 2" not in fsop(bftfs_bin, sock, "--op", "getattr", "--path", b, check=False).stdout
            outcomes.append((b, after_final, status_b, len(payload_b), executed))
    finally:
        relay.stop()
    assert not relay.error_lines(), "\n".join(relay.error_lines())
    print(f"(path, after FINAL(A), FINAL(B) status, payload bytes, executed): {outcomes}")  # pytest -s
    wrong = [o for o in outcomes if o[4] or o[2] != STATUS_ROLLED_BACK or o[3] != 0]
    assert not wrong, (f"B executed although A's FIRST was wrong in {len(wrong)} of {len(outcomes)} runs "
                       f"(path, after FINAL(A), FINAL(B) status, payload bytes, executed): {outcomes}")
