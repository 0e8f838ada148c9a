"""Where the build is, and the executables in it."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build_dir() -> Path:
    """$BFTFS_BUILD (the Makefile sets it), else $BUILD, else "build"; a relative path is taken from the
    repository root, so tests and benchmarks find the same build from any working directory."""
    value = os.environ.get("BFTFS_BUILD") or os.environ.get("BUILD") or "build"
    path = Path(value)
    return path if path.is_absolute() else REPO / path


def built(relative: str) -> Path | None:
    """The executable `relative` (e.g. "cli/bftfs") in the build directory, or None if it is not built."""
    path = build_dir() / relative
    return path if path.is_file() and os.access(path, os.X_OK) else None


def bftfs_binary() -> Path:
    """The `bftfs` executable, or SystemExit with a message saying how to build it (for scripts)."""
    path = built("cli/bftfs")
    if path is None:
        raise SystemExit(f"{build_dir() / 'cli' / 'bftfs'} is not built: run `make` (or set BFTFS_BUILD=<build dir>)")
    return path
