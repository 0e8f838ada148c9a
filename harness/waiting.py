"""Waiting by polling with a deadline: the only way the harness waits for another process."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

POLL_S = 0.02

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str, interval_s: float = POLL_S) -> T:
    """Polls `predicate` until it returns a truthy value (which is returned) or `timeout_s` passes, then raises
    TimeoutError naming `what`. An exception from the predicate propagates at once (fail fast)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.1f}s waiting for {what}")
        time.sleep(interval_s)
