"""A backup killed, and later the primary killed, while a client copies a source tree onto a bftfs mount of
four PBFT replicas: every write completes and the tree read back after a remount is byte-identical to the
source (the short form of `make bench-fs-faults`, which does the same in the middle of the Andrew benchmark).

Uses benchmarks/bench_fs.py's pieces (the mount and cluster wrapper, the replica killer, the tree hashing),
so the benchmark's fault mode and this test exercise one implementation. Needs /dev/fuse, a build whose
`bftfs` has `mount`, and the Lua tree from `make deps`; each missing piece is a skip with its reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_fs  # noqa: E402

pytestmark = [pytest.mark.fuse, pytest.mark.slow]


def _require_mount_support(bftfs: Path) -> None:
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse is missing")
    done = subprocess.run([str(bftfs), "mount", "--help"], capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        pytest.skip("this build's bftfs has no `mount` subcommand")


def _lua_tree() -> bench_fs.SourceTree:
    try:
        tree, _info = bench_fs.lua_source()
    except SystemExit as exc:
        pytest.skip(str(exc))
    return tree


def test_backup_then_primary_killed_during_a_tree_copy_loses_nothing(bftfs_bin, tmp_path):
    _require_mount_support(bftfs_bin)
    lua = _lua_tree()
    expected_dir = tmp_path / "expected"
    expected_dir.mkdir()
    for k in range(2):
        os.mkdir(expected_dir / f"c{k}")
        bench_fs.write_tree(lua, expected_dir / f"c{k}")
    expected = bench_fs.hash_tree(expected_dir)

    system = bench_fs.MountedSystem(tmp_path / "run", "pbft", bftfs_bin, tmp_path / "mnt")
    (tmp_path / "run").mkdir()
    replicas = None
    try:
        root = system.start()
        assert system.cluster_dir is not None
        replicas = bench_fs.ClusterReplicas(system.cluster_dir)
        half = len(lua.files) // 2

        def copy(k: int, files) -> None:
            for rel, mode, data in files:
                bench_fs.write_file(root / f"c{k}" / rel, data, mode)

        # Copy 0: the directories and half the files with all four replicas, the rest with a backup dead.
        for k in range(2):
            os.mkdir(root / f"c{k}")
            for d in lua.dirs:
                os.mkdir(root / f"c{k}" / d)
        copy(0, lua.files[:half])
        first_primary = replicas.primary()
        backup = (first_primary + replicas.n - 1) % replicas.n
        argv = replicas.kill(backup)
        copy(0, lua.files[half:])

        # The backup comes back and catches up; then the primary dies in the middle of copy 1.
        replicas.restart(backup, argv)
        copy(1, lua.files[:half])
        replicas.wait_ready(backup, 60)
        target = max(replicas.last_executed(i) for i in range(replicas.n) if i != backup)
        bench_fs.common.wait_until(lambda: replicas.last_executed(backup) >= target, 60,
                                   f"replica {backup} to execute up to {target}")
        replicas.kill(first_primary)
        copy(1, lua.files[half:])
        # The writes after its death completed, so a view change happened (status.json lags by up to 0.5 s).
        bench_fs.common.wait_until(lambda: (v := replicas.agreed_view()) is not None and v % replicas.n != first_primary,
                                   10, "a quorum in a view with a new primary (status.json)")

        system.cold(None)  # read back from the replicas, not from the kernel's or the client's cache
        got = bench_fs.hash_tree(root)
    finally:
        system.stop()
        if replicas is not None:
            replicas.close()
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    differ = sorted(k for k in set(expected) & set(got) if expected[k] != got[k])
    assert (missing, extra, differ) == ([], [], []), f"missing {missing[:5]} extra {extra[:5]} differ {differ[:5]}"
