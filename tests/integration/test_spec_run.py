"""`bftfs run` end to end on a real cluster (docs/SPECULATION.md §15, issue "Must show"): real programs on a mount
of 4 replicas at primary-local 15 ms (the relay beside the primary, 15 ms one-way between sites), whose primary
lies in 1%, 10% or 100% of its early replies (`--corrupt-early-replies`, the relay trusting it always:
`--distrust-window 0`), each compared with the same program run without `bftfs run` on a fault-free cluster:

  equivalent     a program that creates, reads, renames, links, truncates and removes files: the same files (every
                 one hashed through the mount and through a second, fresh mount of the relay, i.e. read from the
                 replicas), the same stdout, stderr and exit status
  append_once    a program appending numbered lines to a log on the mount: every line exactly once, in order
  output_timing  each output line read as it appears, checked against the commit times in `--trace`: no line
                 reaches the terminal before the epoch it depends on committed (§8.6)
  outside_write  a write outside the mount, then work on the mount: EROFS as with `--no-speculate`, the same
                 stderr and exit status, the host file never created (§8.2)
  stdin_once     lines fed through a pipe while the program works on the mount: each seen once (§8.7)
  getcwd         a working directory on the mount keeps its path while the spec session drops cached names

These hold with or without speculation (a mount whose daemon does not serve `bftfs run` runs the command plainly);
what they are for is the speculating mount, where the lying primary forces rollbacks. Two more tests check that
speculation happens: committed epochs and checkpoints in `--stats-json` on the fault-free cluster, and rollbacks
with their restore times when every early reply is a lie (a program reading files made before the run: each read
is a FETCH whose first reply, the lying primary's, is a 1-reply prediction). Timings are not asserted
(`make bench-spec-run` measures).

Needs root, and CRIU for checkpoints (`make deps`); the module is skipped with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from harness.andrew import hash_tree
from harness.spec_run import (RunResult, cluster_mount, committed_by, criu_missing, epoch_of_output,
                              run_argv, run_command, run_needs_root, spec_cluster, stats_summary)

pytestmark = pytest.mark.criu

WAN_DELAY_MS = 15.0
LIE_RATES = (0.01, 0.1, 1.0)
RUN_TIMEOUT_S = 180.0
# Short epochs: the programs are small, and several epochs per run give the lying primary more to break.
RUN_OPTIONS = ["--max-epoch-ms", "300"]


class SpecSite:
    """A running cluster (fault-free or lying) with one mount, in a short directory under /tmp (FUSE mount
    points and the control socket's path must stay short). Each program runs in a fresh directory of the
    mount named after the test, so a run and its reference leave their files under the same relative names."""

    def __init__(self, bftfs: Path, top: Path, corrupt: float) -> None:
        self.bftfs = bftfs
        self.top = top
        self.corrupt = corrupt
        self.cluster = spec_cluster(bftfs, top / "c", wan_delay_ms=WAN_DELAY_MS, corrupt_early_replies=corrupt)
        self.mounts = 0

    @contextlib.contextmanager
    def up(self) -> Iterator["SpecSite"]:
        self.cluster.start()
        try:
            with cluster_mount(self.bftfs, self.cluster, self.top / "m", self.top / "mount.log") as m:
                self.mount = m
                yield self
        finally:
            self.cluster.stop()

    def workdir(self, name: str) -> Path:
        d = self.mount.mountpoint / name
        d.mkdir()
        return d

    def fresh_hashes(self, name: str) -> dict[str, str]:
        """hash_tree of directory `name` through a second mount of the relay made now: nothing cached, every
        byte read from the replicas."""
        self.mounts += 1
        with cluster_mount(self.bftfs, self.cluster, self.top / f"f{self.mounts}",
                           self.top / f"fresh-{self.mounts}.log") as m:
            return hash_tree(m.mountpoint / name)

    def run(self, name: str, command: list[str], *, under_run: bool, no_speculate: bool = False,
            stdin_lines: list[bytes] | None = None, stdin_gap_s: float = 0.0) -> RunResult:
        """`command` in a new directory `name` on the mount, under `bftfs run` (with --stats-json and --trace in
        the cluster's directory) or plainly."""
        cwd = self.workdir(name)
        stats = self.top / f"{name}.stats.json"
        trace = self.top / f"{name}.trace"
        argv = run_argv(self.bftfs, command, stats_json=stats, trace=trace, no_speculate=no_speculate,
                        extra=RUN_OPTIONS) if under_run else command
        return run_command(argv, cwd, stdin_lines=stdin_lines, stdin_gap_s=stdin_gap_s, timeout_s=RUN_TIMEOUT_S,
                           stats_json=stats if under_run else None, trace=trace if under_run else None)


@pytest.fixture(scope="module")
def spec_ready(bftfs_bin: Path) -> Path:
    why = run_needs_root() or criu_missing(bftfs_bin)
    if why:
        pytest.skip(why)
    return bftfs_bin


@contextlib.contextmanager
def site(bftfs: Path, corrupt: float, session: pytest.Session | None = None) -> Iterator[SpecSite]:
    """A SpecSite up for the `with` block. Its directory (cluster and mount logs, each run's --trace and
    --stats-json) is removed afterwards unless the block failed or, with `session`, a test failed meanwhile."""
    top = Path(tempfile.mkdtemp(prefix="bftfs-spec-", dir="/tmp"))
    failures_before = session.testsfailed if session is not None else 0
    failed = True
    try:
        with SpecSite(bftfs, top, corrupt).up() as s:
            yield s
        failed = session is not None and session.testsfailed > failures_before
    finally:
        if failed:
            print(f"kept {top} (cluster and mount logs, traces and stats)")
        else:
            shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def reference(spec_ready: Path, request) -> Iterator[SpecSite]:
    """The fault-free cluster (same topology, no lies) the programs' reference runs use."""
    with site(spec_ready, 0.0, request.session) as s:
        yield s


@pytest.fixture(scope="module", params=LIE_RATES, ids=[f"lies{r:g}" for r in LIE_RATES])
def lying(spec_ready: Path, request) -> Iterator[SpecSite]:
    with site(spec_ready, request.param, request.session) as s:
        yield s


@pytest.fixture(scope="module")
def outside_dir(build_dir: Path) -> Iterator[Path]:
    """A directory on the host outside every mount, writable by root (not under /tmp, /var/tmp or /dev/shm,
    which bftfs run gives the tree privately): a program under bftfs run must not be able to write into it."""
    # bftfs run gives the tree private /tmp, /var/tmp and /dev/shm: a build directory under one of them (a
    # fresh clone in /tmp) is invisible to the tree, so the programs then live in root's home instead.
    base = build_dir
    if any(str(build_dir.resolve()).startswith(p) for p in ("/tmp/", "/var/tmp/", "/dev/shm/")):
        base = Path.home() / ".cache" / "bftfs-tests"
        base.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix="spec-run-outside-", dir=base))
    yield d
    shutil.rmtree(d, ignore_errors=True)


_references: dict[tuple, RunResult] = {}


def reference_run(ref: SpecSite, name: str, command: list[str], **kwargs) -> tuple[RunResult, dict[str, str]]:
    """The fault-free run of `command` (once per module; the later callers get the same result) and the tree it
    left, hashed through a fresh mount."""
    key = (name, tuple(command), tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
    if key not in _references:
        result = ref.run(name, command, **kwargs)
        _references[key] = (result, ref.fresh_hashes(name))
    return _references[key]


def equal_runs(got: RunResult, want: RunResult) -> None:
    assert got.returncode == want.returncode, got.err()
    assert got.stdout == want.stdout, got.err()
    assert got.stderr == want.stderr


def same_tree(lying: SpecSite, name: str, want: dict[str, str]) -> None:
    """The tree `name` left, through the run's own mount and through a fresh mount, equals `want`."""
    assert hash_tree(lying.mount.mountpoint / name) == want
    assert lying.fresh_hashes(name) == want


def script(directory: Path, name: str, text: str) -> list[str]:
    """`text` as an executable script in `directory` (the host's: bftfs run's tree can read it) and the argv
    that runs it."""
    path = directory / name
    path.write_text(text)
    path.chmod(0o755)
    return [str(path)]


# ---------------------------------------------------------------------------------------------------------
# (a) files, stdout, stderr and exit status as a fault-free run without bftfs run

EQUIVALENT = r"""#!/bin/sh
# Creates, reads, renames, links, truncates, chmods and removes files; prints what it sees; exits 5.
mkdir -p d/sub d/gone
i=0
while [ $i -lt 8 ]; do
  echo "content $i" > d/f$i
  cat d/f$i >> d/all
  case $((i % 4)) in
    0) mv d/f$i d/sub/r$i ;;
    1) ln -s f$i d/l$i; cat d/l$i ;;
    2) truncate -s 3 d/f$i; chmod 600 d/f$i ;;
    3) rm d/f$i ;;
  esac
  test -e d/f$i && echo "f$i exists" || echo "f$i gone"
  i=$((i + 1))
done
rmdir d/gone
ls -R d
wc -c d/all d/sub/r4
cat d/no-such-file
echo "to stderr" >&2
exit 5
"""


def test_spec_run_equivalent_to_a_fault_free_run(reference, lying, outside_dir):
    prog = script(outside_dir, "equivalent.sh", EQUIVALENT)
    want, want_tree = reference_run(reference, "equivalent", prog, under_run=False)
    assert want.returncode == 5 and b"No such file or directory" in want.stderr, want.err()
    got = lying.run("equivalent", prog, under_run=True)
    equal_runs(got, want)
    same_tree(lying, "equivalent", want_tree)


# ---------------------------------------------------------------------------------------------------------
# (b) a log appended to on the mount: every line exactly once

APPEND = r"""#!/bin/sh
# Appends numbered lines to a log on the mount, with other work on the mount between them.
i=0
while [ $i -lt 24 ]; do
  echo "line $i" >> log
  touch "t$((i % 5))"
  test -e "t$(((i + 1) % 5))" && echo "t$(((i + 1) % 5)) there"
  i=$((i + 1))
done
wc -l log
"""


def test_spec_run_appended_log_has_every_line_once(reference, lying, outside_dir):
    prog = script(outside_dir, "append.sh", APPEND)
    want, want_tree = reference_run(reference, "append", prog, under_run=False)
    got = lying.run("append", prog, under_run=True)
    equal_runs(got, want)
    lines = (lying.mount.mountpoint / "append" / "log").read_text().splitlines()
    assert lines == [f"line {i}" for i in range(24)]
    same_tree(lying, "append", want_tree)


# ---------------------------------------------------------------------------------------------------------
# (c) no output line before the epoch it depends on committed

TICKER = r"""#!/usr/bin/env python3
# Prints numbered lines, each with the monotonic time it was printed at (the clock of bftfs run --trace), with
# work on the mount between them.
import os, sys, time
for i in range(20):
    with open(f"n{i}", "w") as f:
        f.write(f"{i}\n")
    os.rename(f"n{i}", f"m{i}")
    os.stat(f"m{i}")
    print(f"{i} {time.monotonic():.6f}", flush=True)
print("done", flush=True)
"""


def test_spec_run_output_waits_for_its_commit(reference, lying, outside_dir):
    prog = script(outside_dir, "ticker.py", TICKER)
    want, want_tree = reference_run(reference, "ticker", prog, under_run=False)
    got = lying.run("ticker", prog, under_run=True)
    assert got.returncode == 0, got.err()
    texts = [text.decode() for _, text in got.lines]
    assert [t.split()[0] for t in texts] == [str(i) for i in range(20)] + ["done"], got.err()
    assert [t.split()[0] for t in texts] == [t.decode().split()[0] for _, t in want.lines]
    assert [ev.kind for ev in got.trace][:1] == ["start"] and got.trace[-1].kind == "exit", got.trace
    for arrived, raw in got.lines[:-1]:
        printed = float(raw.split()[1])
        epoch = epoch_of_output(got.trace, printed)
        if epoch is not None:
            assert committed_by(got.trace, epoch, arrived), \
                f"line {raw!r} arrived at {arrived:.6f}, before epoch {epoch} (which it depends on) committed"
    same_tree(lying, "ticker", want_tree)


# ---------------------------------------------------------------------------------------------------------
# (d) a write outside the mount: as without speculation

OUTSIDE = r"""#!/bin/sh
# Writes on the mount, tries to write a file outside it, reports, and works on the mount again.
echo before > a
echo secret > "{outside}/written-by-the-tree"
echo "outside write: $?"
cat a
echo after > b
mv b c
ls
test -e "{outside}/written-by-the-tree" && echo "outside file exists" || echo "outside file absent"
exit 9
"""


def test_spec_run_write_outside_the_mount_as_without_speculation(reference, lying, outside_dir):
    prog = script(outside_dir, "outside.sh", OUTSIDE.format(outside=outside_dir))
    want, want_tree = reference_run(reference, "outside", prog, under_run=True, no_speculate=True)
    assert want.returncode == 9 and b"Read-only file system" in want.stderr, want.err()
    assert b"outside file absent" in want.stdout
    got = lying.run("outside", prog, under_run=True)
    equal_runs(got, want)
    assert not (outside_dir / "written-by-the-tree").exists()
    same_tree(lying, "outside", want_tree)


# ---------------------------------------------------------------------------------------------------------
# (e) lines through a pipe: each seen once

STDIN_READER = r"""#!/bin/sh
# Reads lines from stdin; for each, works on the mount and echoes it; at the end prints the log it kept.
while IFS= read -r l; do
  echo "$l" >> in.log
  touch "seen-$l"
  echo "got $l"
done
echo "--- log"
cat in.log
ls
"""


def test_spec_run_stdin_lines_seen_once(reference, lying, outside_dir):
    prog = script(outside_dir, "stdin-reader.sh", STDIN_READER)
    lines = [f"in{i}\n".encode() for i in range(10)]
    want, want_tree = reference_run(reference, "stdin", prog, under_run=False, stdin_lines=lines, stdin_gap_s=0.1)
    got = lying.run("stdin", prog, under_run=True, stdin_lines=lines, stdin_gap_s=0.1)
    equal_runs(got, want)
    expected = [f"got in{i}" for i in range(10)] + ["--- log"] + [f"in{i}" for i in range(10)]
    assert got.text().splitlines()[:len(expected)] == expected
    same_tree(lying, "stdin", want_tree)


# ---------------------------------------------------------------------------------------------------------
# getcwd() on the mount while speculating

GETCWD = r"""#!/bin/sh
# Works on the mount (so that speculation starts), asking for its working directory as it goes, in the top
# directory and in a subdirectory: make's `cd src && $(MAKE)` does the same.
mkdir -p sub/deeper
i=0
while [ $i -lt 20 ]; do
  echo "$i" > "n$i"
  mv "n$i" "sub/m$i"
  /bin/pwd -P > /dev/null || echo "pwd failed at $i"
  (cd sub/deeper && /bin/pwd -P > /dev/null) || echo "pwd in sub/deeper failed at $i"
  i=$((i + 1))
done
ls sub | wc -l
"""


def test_spec_run_getcwd_works_while_speculating(reference, outside_dir):
    """A directory on the mount stays a working directory whose path the kernel can give (getcwd) across the
    spec session's cache invalidations (when speculation starts, the names cached before are expired: invalidated,
    a working directory's entry would be unhashed and getcwd() fail ENOENT, as the Lua build's `cd src && make`
    did)."""
    prog = script(outside_dir, "getcwd.sh", GETCWD)
    want, want_tree = reference_run(reference, "getcwd", prog, under_run=False)
    assert want.returncode == 0 and not want.stderr, want.err()
    got = reference.run("getcwd-run", prog, under_run=True)
    equal_runs(got, want)
    assert hash_tree(reference.mount.mountpoint / "getcwd-run") == want_tree


# ---------------------------------------------------------------------------------------------------------
# Speculation happens (needs the daemon's spec session)

WORKER = r"""#!/bin/sh
# A few seconds of file creation and renaming on the mount: latency worth hiding at 15 ms.
i=0
while [ $i -lt 30 ]; do
  echo "$i" > "w$i"
  mv "w$i" "v$i"
  i=$((i + 1))
done
ls | wc -l
"""


def test_spec_run_speculates_on_the_wan_cluster(reference, outside_dir):
    """On the fault-free WAN cluster `bftfs run --stats` reports committed epochs and checkpoints, and the run
    ends with the same output and files as the plain one."""
    prog = script(outside_dir, "worker.sh", WORKER)
    want, want_tree = reference_run(reference, "worker", prog, under_run=False)
    cwd = reference.workdir("worker-run")
    stats = reference.top / "worker-run.stats.json"
    got = run_command(run_argv(reference.bftfs, prog, stats_json=stats, extra=["--stats", *RUN_OPTIONS]), cwd,
                      timeout_s=RUN_TIMEOUT_S, stats_json=stats)
    assert got.returncode == 0 and got.stdout == want.stdout, got.err()
    assert hash_tree(cwd) == want_tree
    s = stats_summary(got.stats)
    assert s["epochs_committed"] > 0 and s["checkpoints"] > 0, f"{s}\n{got.err()}"
    assert "epochs       " in got.err() and "checkpoints  " in got.err()


FILE_READER = r"""#!/bin/sh
# Reads files that existed before the run (unknown to the spec session's model: each read is a FETCH, and the
# primary's early reply to it, when the relay orders it, is a 1-reply prediction), logging each on the mount.
i=1
while [ $i -le 40 ]; do
  md5sum < "../inputs/s$i"
  echo "read $i" >> rlog.txt
  i=$((i + 1))
done
"""


def make_inputs(s: SpecSite) -> None:
    d = s.mount.mountpoint / "inputs"
    if d.exists():
        return
    d.mkdir()
    for i in range(1, 41):
        (d / f"s{i}").write_text(f"input {i} " + " ".join(str(k) for k in range(i)) + "\n")


def test_spec_run_rolls_back_when_the_primary_always_lies(reference, outside_dir):
    """With every early reply wrong, the 1-reply predictions that used one fail at their epoch's replay:
    `--stats-json` lists rollbacks with their restore times, and the result is still the fault-free one."""
    prog = script(outside_dir, "reader.sh", FILE_READER)
    make_inputs(reference)
    want, want_tree = reference_run(reference, "reader", prog, under_run=False)
    with site(reference.bftfs, 1.0) as liar:
        make_inputs(liar)
        got = liar.run("reader", prog, under_run=True)
        equal_runs(got, want)
        same_tree(liar, "reader", want_tree)
    s = stats_summary(got.stats)
    assert s["rollbacks"], f"{s}\n{got.err()}"
    assert all(r["restore_ms"] > 0 for r in s["rollbacks"])
