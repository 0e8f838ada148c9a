"""Ranges of ports that are free now, for clusters on this machine."""

from __future__ import annotations

import os
import random
import socket
import time


class PortAllocator:
    """Hands out ranges of ports that are free now (TCP and UDP, checked by binding on every address) and were
    not handed out before by this allocator. Ranges are random so that concurrent runs rarely collide."""

    LOW, HIGH = 20000, 60000

    def __init__(self) -> None:
        self._taken: list[tuple[int, int]] = []
        self._rng = random.Random(os.getpid() ^ time.monotonic_ns())

    @staticmethod
    def _free(port: int) -> bool:
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            with socket.socket(socket.AF_INET, kind) as s:
                try:
                    s.bind(("0.0.0.0", port))
                except OSError:
                    return False
        return True

    def alloc(self, count: int) -> int:
        """The first of `count` consecutive free ports; RuntimeError if none are found."""
        assert 0 < count < 1000
        for _ in range(500):
            base = self._rng.randrange(self.LOW, self.HIGH - count)
            if any(base < hi and lo < base + count for lo, hi in self._taken):
                continue
            if all(self._free(p) for p in range(base, base + count)):
                self._taken.append((base, base + count))
                return base
        raise RuntimeError(f"no {count} consecutive free ports found")


PORTS = PortAllocator()


def free_port_range(count: int) -> int:
    """The first of `count` consecutive ports free now and not handed out before in this process."""
    return PORTS.alloc(count)
