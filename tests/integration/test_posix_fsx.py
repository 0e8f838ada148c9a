"""The fsx-style exerciser (tests/tools/fsx.py) for a bounded number of operations, with fixed seeds so a
failure replays exactly (the command is in the failure message). Longer runs are by hand:
`python3 tests/tools/fsx.py MNT/file --ops 100000`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["posix_suite"]

FSX = Path(__file__).resolve().parents[1] / "tools" / "fsx.py"
OPS = 1500


def run_fsx(path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(FSX), str(path), "-q", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("seed", [11, 22])
def test_fsx_read_write_truncate(d, seed):
    out = run_fsx(d / "fsx.dat", "--seed", str(seed), "--ops", str(OPS), "--no-mmap")
    assert out.returncode == 0, f"{FSX} {d / 'fsx.dat'} --seed {seed} --ops {OPS} --no-mmap:\n{out.stdout}{out.stderr}"


@pytest.mark.parametrize("seed", [33])
def test_fsx_with_mmap(d, seed):
    out = run_fsx(d / "fsx.dat", "--seed", str(seed), "--ops", str(OPS))
    assert out.returncode == 0, f"{FSX} {d / 'fsx.dat'} --seed {seed} --ops {OPS}:\n{out.stdout}{out.stderr}"


def test_fsx_detects_a_byte_changed_behind_its_model(d):
    """The exerciser itself can fail: a byte changed behind its model after the last op is caught by the final
    full read and reported with the seed and the ops (an earlier change could be truncated away unseen)."""
    out = run_fsx(d / "fsx.dat", "--seed", "5", "--ops", "400", "--corrupt-at", "400", "--no-mmap")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "MISMATCH" in out.stdout
    assert "seed 5" in out.stdout
    assert "first difference at file offset" in out.stdout
