"""A backup killed, and later the primary killed, while a client copies a source tree onto a bftfs mount of
four PBFT replicas: every write completes and the tree read back after a remount is byte-identical to the
source (the short form of `make bench-fs-faults`, which does the same in the middle of the Andrew benchmark).

Uses the pieces the benchmark's fault mode uses (harness: the cluster of `bftfs cluster start` and the killing
and restarting of its replicas, the mount, the Lua tree and the tree hashing), so both exercise one
implementation. Needs /dev/fuse, a build whose `bftfs` has `mount`, and the Lua tree from `make deps`; each
missing piece is a skip with its reason.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harness.andrew import SourceTree, hash_tree, lua_source, write_file, write_tree
from harness.cli_cluster import CliCluster
from harness.mount import Mount
from harness.waiting import wait_until

pytestmark = [pytest.mark.fuse, pytest.mark.slow]


def _require_mount_support(bftfs: Path) -> None:
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse is missing")
    done = subprocess.run([str(bftfs), "mount", "--help"], capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        pytest.skip("this build's bftfs has no `mount` subcommand")


def _lua_tree() -> SourceTree:
    try:
        tree, _info = lua_source()
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
        write_tree(lua, expected_dir / f"c{k}")
    expected = hash_tree(expected_dir)

    (tmp_path / "run").mkdir()
    replicas = CliCluster(bftfs_bin, tmp_path / "run" / "cluster-pbft", service="fs",
                          args=["--log-level", "warn"])
    mount = Mount(bftfs_bin, tmp_path / "mnt", tmp_path / "run" / "mount-pbft.log",
                  ["--relay", replicas.relay_sock])
    try:
        replicas.start()
        mount.start()
        root = mount.mountpoint
        half = len(lua.files) // 2

        def copy(k: int, files) -> None:
            for rel, mode, data in files:
                write_file(root / f"c{k}" / rel, data, mode)

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
        wait_until(lambda: replicas.last_executed(backup) >= target, 60, f"replica {backup} to execute up to {target}")
        replicas.kill(first_primary)
        copy(1, lua.files[half:])
        # The writes after its death completed, so a view change happened (status.json lags by up to 0.5 s).
        wait_until(lambda: (v := replicas.agreed_view()) is not None and v % replicas.n != first_primary, 10,
                   "a quorum in a view with a new primary (status.json)")

        mount.restart()  # read back from the replicas, not from the kernel's or the client's cache
        got = hash_tree(root)
    finally:
        mount.stop()
        replicas.stop()
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    differ = sorted(k for k in set(expected) & set(got) if expected[k] != got[k])
    assert (missing, extra, differ) == ([], [], []), f"missing {missing[:5]} extra {extra[:5]} differ {differ[:5]}"
