"""Untrusted bytes on a replica's TCP port (house style: peer input never crashes or throws; it is logged,
counted and dropped). An attacker who can reach the port but has no key sends random bytes, frames with a
valid-looking header but garbage inside, truncated headers, oversized length fields, and half frames it never
finishes. Afterwards the replica is alive, still serves, and its counters show that the garbage was seen."""

from __future__ import annotations

import contextlib
import random
import socket
import struct

import pytest

from harness.cluster import status_value
from harness.waiting import wait_until

MAGIC = 0x31544642
VERSION = 2  # protocol/wire.h kWireVersion (2: Request::prev_request_id)
HEADER = struct.Struct("<IBBHIIQQII32s")  # protocol/wire.h: 72 bytes
MAC_BYTES = 16
FRAME_BYTES_MAX = 32 << 20
assert HEADER.size == 72


def header(body_bytes: int, *, magic: int = MAGIC, version: int = VERSION, msg_type: int = 1, sender: int = 4,
           receiver: int = 0, view: int = 0, seq: int = 1, reserved: int = 0) -> bytes:
    return HEADER.pack(magic, version, msg_type, reserved, sender, receiver, view, seq, body_bytes & 0xFFFFFFFF,
                       0, bytes(32))


def send_and_close(addr: tuple[str, int], data: bytes, linger_s: float = 0.0) -> None:
    """Connects, sends `data` (the peer may close on us midway: that is a fine reaction), closes."""
    with socket.create_connection(addr, timeout=5) as s:
        with contextlib.suppress(OSError):
            s.sendall(data)
            if linger_s:
                s.settimeout(linger_s)
                with contextlib.suppress(socket.timeout, OSError):
                    s.recv(1 << 16)


def garbage_cases(rng: random.Random, receiver: int, client: int) -> list[tuple[str, bytes]]:
    body = 200
    bad_mac_frame = header(body, receiver=receiver, sender=client) + rng.randbytes(body + MAC_BYTES)
    return [
        ("random bytes", rng.randbytes(64 << 10)),
        ("zeros", bytes(4096)),
        ("bad magic", header(16, magic=0xDEADBEEF) + rng.randbytes(32)),
        ("bad version", header(16, version=99) + rng.randbytes(32)),
        ("nonzero reserved", header(16, reserved=7, receiver=receiver) + rng.randbytes(32)),
        ("unknown type", header(16, msg_type=250, receiver=receiver) + rng.randbytes(32)),
        ("oversized length 0xFFFFFFFF", header(0xFFFFFFFF, receiver=receiver)),
        ("length just over the frame limit", header(FRAME_BYTES_MAX, receiver=receiver) + rng.randbytes(1024)),
        ("truncated header", header(16, receiver=receiver)[:40]),
        ("one byte", b"B"),
        ("frame with bad MAC, from a client id", bad_mac_frame),
        ("many frames with bad MACs", bad_mac_frame * 100),
        ("frame claiming to come from a replica", header(body, sender=1, receiver=receiver, msg_type=3)
         + rng.randbytes(body + MAC_BYTES)),
        ("frame for another receiver", header(body, receiver=receiver + 1, sender=client)
         + rng.randbytes(body + MAC_BYTES)),
        ("unknown sender", header(body, receiver=receiver, sender=0xFFFFFFF0) + rng.randbytes(body + MAC_BYTES)),
        ("half of a 1 MiB frame, then close", header(1 << 20, receiver=receiver, sender=client)
         + rng.randbytes(1 << 19)),
        ("valid header, body a byte short, then close", header(body, receiver=receiver, sender=client)
         + rng.randbytes(body + MAC_BYTES - 1)),
    ]


@pytest.mark.parametrize("target", [0, 2], ids=["primary", "backup"])
def test_replica_survives_garbage_on_its_port_and_keeps_serving(cluster, target):
    c = cluster(clients=8)
    addr = c.addresses[target]
    victim = c.replicas[target]
    rng = random.Random(0xB1F7 + target)
    before = c.counter(client_id=c.client_ids[0], requests=5, extra=["--warmup", "0"], timeout_s=60)

    # Connections that stay open, idle or mid-frame, while everything else happens (slow-loris style).
    idle = []
    try:
        for i in range(8):
            s = socket.create_connection(addr, timeout=5)
            if i % 2:
                s.sendall(header(4096, receiver=target, sender=c.client_ids[1]) + rng.randbytes(100))
            idle.append(s)

        for name, data in garbage_cases(rng, target, c.client_ids[1]):
            send_and_close(addr, data, linger_s=0.05)
            assert victim.alive(), f"replica {target} died after: {name}"
        for _ in range(100):  # connection churn
            send_and_close(addr, rng.randbytes(rng.randrange(1, 300)))
        assert victim.alive(), f"replica {target} died after random short connections"

        # Still serving, with the idle connections still open.
        after = c.counter(client_id=c.client_ids[0], requests=20, extra=["--warmup", "0"], timeout_s=60)
        assert after["final_value"] == before["final_value"] + 20
    finally:
        for s in idle:
            s.close()

    # The garbage reached the replica's parser and was rejected there (not silently lost before it).
    def counted():
        st = victim.status()
        bad_headers = status_value(st, "closed_bad_header") or 0
        rejected = status_value(st, "frames_rejected") or 0
        return (bad_headers, rejected) if bad_headers > 0 and rejected > 0 else None
    try:
        wait_until(counted, 5, f"replica {target}'s status to count bad headers and rejected frames")
    except TimeoutError as e:
        raise AssertionError(f"{e}: net stats {status_value(victim.status(), 'net')}") from None
    assert victim.alive()
