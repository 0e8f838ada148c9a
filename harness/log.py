"""Progress lines on stderr (a benchmark's running commentary; pytest captures them in tests)."""

from __future__ import annotations

import sys
import time

_T0 = time.monotonic()


def progress(message: str) -> None:
    """One progress line on stderr, prefixed with the seconds since the program started."""
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)
