"""`bftfs run`: a command's process tree run ahead of agreement, checkpointed by CRIU (docs/SPECULATION.md §8-§10).

The mount daemon's side of the control protocol (§9) is not built yet, so these tests run the supervisor against
harness.fake_spec_daemon: `--test-control SOCKET` makes the working directory play the mount, and the fake daemon
answers as §9 says, reports latency to hide (so the policy speculates) and decides each sealed epoch's fate by a
script (commit after a delay, or fail chosen ones). What is checked is what the supervisor must guarantee: output
released only once its epoch committed, each line exactly once across rollbacks, the private /tmp put back, the
stdin the tree had consumed fed again exactly once, the exit status reported after the last commit; a policy that
does not speculate where it does not pay and says why; and a daemon that does not speak §9 making `bftfs run` run
the command plainly. Timings are not asserted (see `bftfs run --stats`).

Needs root (mount and pid namespaces) and, for checkpoints, CRIU (`bftfs-criu` and libcriu, from `make deps`);
the tests say so when they skip.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pty
import select
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from harness.fake_spec_daemon import FakeSpecDaemon
from harness.mount import Mount, mount_supported
from harness.waiting import wait_until

pytestmark = pytest.mark.criu

RUN_TIMEOUT_S = 120


@contextlib.contextmanager
def fake_daemon(cwd: Path, **kwargs) -> Iterator[FakeSpecDaemon]:
    with FakeSpecDaemon(cwd, cwd / "ctl.sock", **kwargs) as daemon:
        yield daemon
    assert not daemon.errors, daemon.errors


def run_args(daemon: FakeSpecDaemon, args: list[str]) -> list[str]:
    return ["run", "--test-control", str(daemon.socket_path), *args]


def run(bftfs: Path, daemon: FakeSpecDaemon, args: list[str], cwd: Path, input_bytes: bytes | None = None,
        timeout_s: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([str(bftfs), *run_args(daemon, args)], cwd=cwd, input=input_bytes, capture_output=True,
                          timeout=timeout_s, stdin=None if input_bytes is not None else subprocess.DEVNULL)


def script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def root_only() -> None:
    if os.geteuid() != 0:
        pytest.skip("bftfs run needs root (it creates mount and pid namespaces)")


@pytest.fixture(scope="module")
def criu_ready(bftfs_bin: Path, root_only, tmp_path_factory) -> None:
    """Skips the test unless this machine can checkpoint: bftfs-criu installed and bftfs built with libcriu."""
    binary = os.environ.get("BFTFS_CRIU", "bftfs-criu")
    if shutil.which(binary) is None:
        pytest.skip(f"{binary} is not installed: `make deps` installs CRIU 4.1.1 (scripts/install-criu.sh)")
    work = tmp_path_factory.mktemp("criu-probe")
    stats = work / "stats.json"
    with fake_daemon(work) as daemon:
        done = run(bftfs_bin, daemon, ["--stats-json", str(stats), "--", "sleep", "2"], work)
    if b"without libcriu" in done.stderr:
        pytest.skip("bftfs was built without libcriu: `make deps`, then rebuild")
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    probe = json.loads(stats.read_text())
    assert probe["checkpoints"], f"no checkpoint succeeded:\n{done.stderr.decode(errors='replace')}"


def stats_of(path: Path) -> dict:
    return json.loads(path.read_text())


# ---------------------------------------------------------------------------------------------------------
# Without checkpoints: a daemon that does not speak §9, --no-speculate, a policy that finds nothing to hide


def test_run_without_a_control_daemon_runs_plainly_and_says_why(bftfs_bin, root_only, tmp_path):
    """A mount whose daemon does not serve `bftfs run` (no control socket): the command runs in the same boundary
    without speculation, with its own output and exit status; -v says why it did not speculate."""
    done = subprocess.run([str(bftfs_bin), "run", "-v", "--test-control", str(tmp_path / "nobody.sock"), "--",
                           "sh", "-c", "echo out; echo err >&2; test ! -t 1 && echo pipes; touch /etc/bftfs-x; "
                           "echo kept > here; exit 7"],
                          cwd=tmp_path, capture_output=True, stdin=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S)
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 7, err
    assert done.stdout == b"out\npipes\n"
    assert "bftfs run: not speculating: the mount's daemon does not serve bftfs run" in err
    assert "err\n" in err
    assert "Read-only file system" in err  # outside the mount nothing is writable, speculating or not
    assert not Path("/etc/bftfs-x").exists()
    assert (tmp_path / "here").read_text() == "kept\n"  # the mount is written as it is


def test_run_on_a_real_mount_whose_daemon_does_not_serve_it(bftfs_bin, root_only, tmp_path):
    """`bftfs run` in a directory on a bftfs mount (the local backend) whose daemon has no control socket: the
    command runs plainly on the mount, its writes there land, /tmp is private, and -v says why."""
    ok, why = mount_supported(bftfs_bin)
    if not ok:
        pytest.skip(why)
    with Mount(bftfs_bin, tmp_path / "mnt", tmp_path / "mount.log", ["--local", tmp_path / "backing"]) as m:
        (m.mountpoint / "a").write_text("hi\n")
        done = subprocess.run([str(bftfs_bin), "run", "-v", "--", "sh", "-c",
                               "cat a; echo more >> a; echo scratch > /tmp/t; cat /tmp/t; exit 4"],
                              cwd=m.mountpoint, capture_output=True, stdin=subprocess.DEVNULL,
                              timeout=RUN_TIMEOUT_S)
        err = done.stderr.decode(errors="replace")
        assert done.returncode == 4, err
        assert done.stdout == b"hi\nscratch\n"
        assert (m.mountpoint / "a").read_text() == "hi\nmore\n"
        assert "bftfs run: not speculating: the mount's daemon does not serve bftfs run" in err
        assert f"  {m.mountpoint}: writable, no spec session" in err
    # Outside a mount there is nothing to run on.
    done = subprocess.run([str(bftfs_bin), "run", "--", "true"], cwd=tmp_path, capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 125
    assert b"is not on a bftfs mount" in done.stderr


def test_run_passes_output_and_exit_status_through(bftfs_bin, root_only, tmp_path):
    with fake_daemon(tmp_path) as daemon:
        done = run(bftfs_bin, daemon, ["--no-speculate", "--", "sh", "-c",
                                       "echo out; echo err >&2; test ! -t 1 && echo pipes; exit 7"], tmp_path)
    assert done.returncode == 7
    assert done.stdout == b"out\npipes\n"
    assert done.stderr == b"err\n"
    # --no-speculate: no PREPARE, and ATTACH told the daemon not to expect one.
    assert "PREPARE" not in daemon.names("request")
    assert daemon.times("ATTACH", "request")[0][1]["speculate_allowed"] == 0
    assert daemon.names("request")[-2:] == ["STATS", "DETACH"]


def test_run_reports_a_command_that_cannot_be_executed(bftfs_bin, root_only, tmp_path):
    with fake_daemon(tmp_path) as daemon:
        done = run(bftfs_bin, daemon, ["--no-speculate", "--", "no-such-command-here"], tmp_path)
    assert done.returncode == 127
    assert b"no-such-command-here: No such file or directory" in done.stderr


def test_run_gives_the_tree_its_own_namespaces_and_temporary_directories(bftfs_bin, root_only, tmp_path):
    marker = tmp_path / "marker"
    marker.write_text("outside\n")
    with fake_daemon(tmp_path) as daemon:
        done = run(bftfs_bin, daemon, ["--no-speculate", "--", "sh", "-c",
                                       "echo $$; ls -A /tmp | grep -c . || true; cat marker; "
                                       "touch /tmp/private-file /var/tmp/on-the-mount"], tmp_path)
    assert done.returncode == 0, done.stderr
    pid, tmp_entries, marker_text = done.stdout.decode().splitlines()
    assert pid == "2"  # the init is pid 1
    # The mount lies under /tmp, so /tmp is a private tmpfs holding only the path down to it.
    assert int(tmp_entries) <= 1
    assert marker_text == "outside"
    assert not Path("/tmp/private-file").exists()
    # /var/tmp is the run directory's var-tmp on the mount (§8.2).
    assert (tmp_path / daemon.run_dir.lstrip("/") / "var-tmp" / "on-the-mount").exists()


def test_run_exit_status_of_a_signal_and_forwarded_sigint(bftfs_bin, root_only, tmp_path):
    with fake_daemon(tmp_path) as daemon:
        done = run(bftfs_bin, daemon, ["--no-speculate", "--", "sh", "-c", "kill -TERM $$"], tmp_path)
    assert done.returncode == 128 + signal.SIGTERM
    (tmp_path / "ctl.sock").unlink(missing_ok=True)
    with fake_daemon(tmp_path) as daemon:
        proc = subprocess.Popen([str(bftfs_bin), *run_args(daemon, ["--", "sh", "-c", "echo started; exec sleep 60"])],
                                cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        try:
            assert proc.stdout.readline() == b"started\n"
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 128 + signal.SIGINT
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_run_does_not_speculate_where_checkpoints_cost_more_than_they_hide(bftfs_bin, criu_ready, tmp_path):
    """A LAN-like daemon (1 ms to hide per 100 ms): the policy never checkpoints, and -v gives its numbers."""
    stats = tmp_path / "stats.json"
    with fake_daemon(tmp_path, hideable_us_per_100ms=1000) as daemon:
        done = run(bftfs_bin, daemon, ["-v", "--stats", "--stats-json", str(stats), "--", "sh", "-c",
                                       "sleep 1; echo done"], tmp_path)
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 0, err
    assert done.stdout == b"done\n"
    assert "PREPARE" not in daemon.names("request")
    assert "bftfs run: not speculating: 10.0 ms/s hidden x 1000.0 ms = 10.0 ms per epoch, against" in err, err
    assert "checkpoints  0 (0 failed)" in err
    assert "daemon       fake daemon" in err
    assert stats_of(stats)["checkpoints"] == []


# ---------------------------------------------------------------------------------------------------------
# Checkpoints, commits and rollbacks

TICKER = """#!/usr/bin/env python3
# Prints a numbered line with the monotonic time it was printed at, every 20 ms, flushing each.
import sys, time
for i in range({lines}):
    print(f"{{i}} {{time.monotonic():.6f}}", flush=True)
    time.sleep(0.02)
sys.exit(5)
"""


def read_lines_with_arrival(proc: subprocess.Popen) -> list[tuple[float, str]]:
    got = []
    for raw in iter(proc.stdout.readline, b""):
        got.append((time.monotonic(), raw.decode().rstrip("\n")))
    return got


@pytest.mark.parametrize("fail_seals", [set(), {2, 5}], ids=["commits", "rollbacks"])
def test_run_output_waits_for_the_commit_of_its_epoch(bftfs_bin, criu_ready, tmp_path, fail_seals):
    """Each line reaches bftfs run's stdout only after the daemon committed an epoch sealed after the line was
    printed (lines printed before the first checkpoint pass at once), each line exactly once, and the exit status
    comes after the last commit."""
    lines = 120
    prog = script(tmp_path / "ticker.py", TICKER.format(lines=lines))
    stats = tmp_path / "stats.json"
    with fake_daemon(tmp_path, commit_delay_s=0.25, fail_seals=fail_seals) as daemon:
        proc = subprocess.Popen([str(bftfs_bin), *run_args(daemon, ["--max-epoch-ms", "200", "--stats-json",
                                                                    str(stats), "--", str(prog)])],
                                cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        got = read_lines_with_arrival(proc)
        code = proc.wait(timeout=RUN_TIMEOUT_S)
        exited_at = time.monotonic()
        err = proc.stderr.read().decode(errors="replace")
    assert code == 5, err
    assert [int(text.split()[0]) for _, text in got] == list(range(lines)), err
    # Which epoch each line's release depends on (§8.6): printed in a speculative epoch, that epoch; printed in a
    # non-speculative stretch after sealed epochs, the last of them; before the first checkpoint, none.
    modes = sorted([(t, f["next"]) for t, f in daemon.times("SEAL", "request")] +
                   [(t, f["next"]) for t, f in daemon.times("RESTORED", "request")] +
                   [(t, 1) for t, _ in daemon.times("FINISH", "request")])
    sealed = sorted((t, f["epoch"]) for t, f in daemon.times("sealed", "internal"))
    commits = [(t, f["epoch"]) for t, f in daemon.times("COMMITTED")]
    held = 0
    for arrived, text in got:
        printed = float(text.split()[1])
        before = [m for t, m in modes if t <= printed]
        if not before:
            continue  # the non-speculative stretch before the first checkpoint
        if before[-1] == 0:
            needed = next(e for t, e in sealed if t >= printed)
        else:
            earlier = [e for t, e in sealed if t <= printed]
            if not earlier:
                continue
            needed = earlier[-1]
        held += 1
        assert any(c <= arrived and e >= needed for c, e in commits), \
            f"line {text!r} arrived before epoch {needed}, which it depends on, committed"
    assert held > lines // 4
    assert commits and commits[-1][0] <= exited_at
    s = stats_of(stats)
    # Every failure the daemon reported was rolled back (how many happen before the program ends depends on the
    # machine's speed: the failures name seal ordinals).
    assert len(s["rollbacks"]) == len(daemon.times("FAILED")) == daemon.names("request").count("ROLLBACK"), err
    if fail_seals:
        assert s["rollbacks"], err
        assert s["output_bytes_dropped"] > 0


PRINTER = """#!/bin/sh
# Prints numbered lines and appends each to a log in the private /tmp, then prints the log.
i=0
while [ $i -lt {lines} ]; do
  echo "line $i"
  echo "logged $i" >> /tmp/log
  i=$((i + 1))
  sleep 0.02
done
echo "--- log"
cat /tmp/log
echo "to stderr" >&2
exit 3
"""


def test_run_rollback_releases_each_line_once_and_restores_tmp(bftfs_bin, criu_ready, tmp_path):
    lines = 60
    prog = script(tmp_path / "printer.sh", PRINTER.format(lines=lines))
    stats = tmp_path / "stats.json"
    with fake_daemon(tmp_path, fail_seals={2, 4, 6}, doom_first=True) as daemon:
        done = run(bftfs_bin, daemon, ["--stats", "--max-epoch-ms", "100", "--stats-json", str(stats), "--",
                                       str(prog)], tmp_path)
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 3, err
    expected = [f"line {i}" for i in range(lines)] + ["--- log"] + [f"logged {i}" for i in range(lines)]
    assert done.stdout.decode().splitlines() == expected, err
    assert err.splitlines()[0] == "to stderr"
    s = stats_of(stats)
    # How many of the scripted failures happen depends on the machine's speed (two in a row also make the policy
    # back off), but every one the daemon reported was rolled back.
    assert len(s["rollbacks"]) == len(daemon.times("FAILED")) >= 1, err
    assert f"rollbacks    {len(s['rollbacks'])}: epoch" in err
    assert len(daemon.times("DOOMED")) == len(s["rollbacks"])
    assert s["epochs_discarded"] >= len(s["rollbacks"])
    # The rolled-back epochs had printed lines that were dropped and printed again by the restored tree.
    assert s["output_bytes_dropped"] > 0
    assert s["exit_code"] == 3
    # Each re-run got the number the daemon named, above every number used before.
    reruns = [f["epoch"] for _, f in daemon.times("READY_FOR_RESTORE")]
    assert reruns == sorted(set(reruns)) and [r["rerun"] for r in s["rollbacks"]] == reruns


READER = """#!/bin/sh
# Echoes every line of stdin and appends it to a log in the private /tmp; at the end prints the log.
while IFS= read -r l; do
  echo "got $l"
  echo "$l" >> /tmp/in.log
done
echo "--- log"
cat /tmp/in.log
"""


def test_run_rollback_replays_the_stdin_the_tree_had_consumed(bftfs_bin, criu_ready, tmp_path):
    prog = script(tmp_path / "reader.sh", READER)
    stats = tmp_path / "stats.json"
    errors = tmp_path / "stderr"
    count = 40
    with fake_daemon(tmp_path, fail_seals={2, 4}) as daemon, open(errors, "wb") as err_file:
        proc = subprocess.Popen([str(bftfs_bin), *run_args(daemon, ["--max-epoch-ms", "100", "--stats-json",
                                                                    str(stats), "--", str(prog)])],
                                cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err_file)

        def feed() -> None:
            for i in range(count):
                proc.stdin.write(f"input {i}\n".encode())
                proc.stdin.flush()
                time.sleep(0.05)
            proc.stdin.close()

        feeder = threading.Thread(target=feed)
        feeder.start()
        try:
            out = proc.stdout.read()
            assert proc.wait(timeout=RUN_TIMEOUT_S) == 0, errors.read_text()
        finally:
            feeder.join()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # Every line seen exactly once by the surviving execution, and logged once.
    expected = [f"got input {i}" for i in range(count)] + ["--- log"] + [f"input {i}" for i in range(count)]
    assert out.decode().splitlines() == expected, errors.read_text()
    s = stats_of(stats)
    assert len(s["rollbacks"]) == len(daemon.times("FAILED")) >= 1, errors.read_text()
    assert s["stdin_bytes_replayed"] > 0


def test_run_pty_output_survives_a_rollback(bftfs_bin, criu_ready, tmp_path):
    if shutil.which("script") is None or subprocess.run(["script", "-qec", "true", "/dev/null"],
                                                        stdin=subprocess.DEVNULL, capture_output=True).returncode:
        pytest.skip("script(1) (bsdutils) cannot give bftfs run a terminal here")
    # The pty is not a controlling terminal, before the rollbacks as after them.
    no_ctty = "(: > /dev/tty) 2>/dev/null || echo no-controlling-terminal\n"
    prog = script(tmp_path / "tty.sh", "#!/bin/sh\n"
                  "test -t 1 && test -t 2 && echo stdout-is-a-tty\n" + no_ctty +
                  "i=0; while [ $i -lt 60 ]; do echo \"line $i\"; i=$((i + 1)); sleep 0.02; done\n" + no_ctty)
    stats = tmp_path / "stats.json"
    with fake_daemon(tmp_path, fail_seals={2, 3}) as daemon:
        inner = " ".join([str(bftfs_bin), *run_args(daemon, ["--max-epoch-ms", "100", "--stats-json", str(stats),
                                                              "--", str(prog)])])
        # stdin from /dev/null: terminal input (a pty for stdin too) pauses speculation whenever input comes, and
        # script(1) types at its end of input; this test is about output through a pty.
        done = subprocess.run(["script", "-qec", inner + " < /dev/null", "/dev/null"], cwd=tmp_path, capture_output=True,
                              stdin=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S)
    text = done.stdout.decode(errors="replace").replace("\r\n", "\n")
    assert done.returncode == 0, text
    expected = ["stdout-is-a-tty", "no-controlling-terminal"] + [f"line {i}" for i in range(60)]
    expected.append("no-controlling-terminal")
    assert text.splitlines() == expected
    assert len(stats_of(stats)["rollbacks"]) == len(daemon.times("FAILED")) >= 1


def test_run_terminal_input_is_forwarded_only_outside_speculation(bftfs_bin, criu_ready, tmp_path):
    """stdin and stdout a terminal: keystrokes reach the tree only while nothing speculative is outstanding (the
    running epoch is sealed without a dump and committed first), so each typed line is read exactly once, also
    across a rollback (§8.7)."""
    reader = script(tmp_path / "reader.sh", "#!/bin/sh\nwhile IFS= read -r l; do echo \"got $l\"; done\necho end\n")
    stats = tmp_path / "stats.json"
    with fake_daemon(tmp_path, fail_seals={3}) as daemon:
        master, slave = pty.openpty()
        proc = subprocess.Popen([str(bftfs_bin), *run_args(daemon, ["--max-epoch-ms", "200", "--stats-json",
                                                                    str(stats), "--", str(reader)])],
                                cwd=tmp_path, stdin=slave, stdout=slave, stderr=subprocess.PIPE)
        os.close(slave)
        out = bytearray()

        def read_for(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                if select.select([master], [], [], 0.05)[0]:
                    try:
                        out.extend(os.read(master, 4096))
                    except OSError:  # the last holder of the terminal closed it
                        return

        try:
            read_for(0.8)  # speculation starts before anything is typed
            for i in range(6):
                os.write(master, f"line {i}\n".encode())
                read_for(0.4)
            os.write(master, b"\x04")  # end of input
            wait_until(lambda: (read_for(0.1), proc.poll() is not None)[1], RUN_TIMEOUT_S, "bftfs run to end")
            read_for(0.2)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            os.close(master)
        err = proc.stderr.read().decode(errors="replace")
    assert proc.returncode == 0, err
    text = out.decode(errors="replace").replace("\r\n", "\n")
    got = [line for line in text.splitlines() if line.startswith("got ") or line == "end"]
    assert got == [f"got line {i}" for i in range(6)] + ["end"], text
    # Speculation ran, and paused for the input with seals without a dump.
    assert daemon.times("PREPARE", "request"), err
    assert any(f["next"] == 1 for _, f in daemon.times("SEAL", "request")), err
    s = stats_of(stats)
    assert s["keystroke_bytes_forwarded"] > 0 and s["input_us"] > 0
    assert len(s["rollbacks"]) == len(daemon.times("FAILED"))


MAKEFILE = """CFLAGS = -O2 -pipe
OBJS = main.o {objs}
prog: $(OBJS)
\t$(CC) -o $@ $(OBJS)
%.o: %.c
\t$(CC) $(CFLAGS) -c -o $@ $<
"""


def write_c_tree(src: Path, files: int = 6, functions: int = 40) -> None:
    src.mkdir()
    for i in range(1, files + 1):
        body = [f"static int g{k}(int x) {{ int s = 0; for (int j = 0; j < x; j++) s += (j * {k + i}) ^ (s >> 3); "
                f"return s; }}" for k in range(functions)]
        total = " + ".join(f"g{k}(x + {k})" for k in range(functions))
        (src / f"f{i}.c").write_text("\n".join(body) + f"\nint f{i}(int x) {{ return {total}; }}\n")
    decls = " ".join(f"int f{i}(int);" for i in range(1, files + 1))
    calls = " + ".join(f"f{i}({i})" for i in range(1, files + 1))
    (src / "main.c").write_text(f"#include <stdio.h>\n{decls}\nint main(void) {{ printf(\"%d\\n\", {calls}); "
                                f"return 0; }}\n")
    (src / "Makefile").write_text(MAKEFILE.format(objs=" ".join(f"f{i}.o" for i in range(1, files + 1))))


def test_run_make_j2_with_rollbacks_builds_the_same_objects(bftfs_bin, criu_ready, tmp_path):
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.skip("make and cc are needed")
    src = tmp_path / "src"
    write_c_tree(src)
    # The plain build, in place.
    plain = tmp_path / "plain"
    shutil.copytree(src, plain)
    subprocess.run(["make", "-s", "-j2"], cwd=plain, check=True, capture_output=True, timeout=RUN_TIMEOUT_S)
    objects = sorted(p.name for p in plain.glob("*.o")) + ["prog"]
    want = {name: hashlib.sha256((plain / name).read_bytes()).hexdigest() for name in objects}
    # Under bftfs run the build happens in the private /tmp, which checkpoints cover (a rollback puts it back);
    # the tree prints the digests of what it built. Each compiler run first sleeps a little, so that the build
    # outlasts the forced rollbacks however fast the machine is.
    script(tmp_path / "slowcc", "#!/bin/sh\nsleep 0.3\nexec cc \"$@\"\n")
    build = script(tmp_path / "build.sh", f"#!/bin/sh\nset -e\ncp -r src /tmp/b\n"
                                          f"make -s -C /tmp/b -j2 CC={tmp_path / 'slowcc'}\n"
                                          "cd /tmp/b && sha256sum *.o prog\n")
    stats = tmp_path / "stats.json"
    with fake_daemon(tmp_path, fail_seals={2, 3}) as daemon:
        done = run(bftfs_bin, daemon, ["--max-epoch-ms", "300", "--stats-json", str(stats), "--", str(build)],
                   tmp_path)
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 0, err
    got = {}
    for line in done.stdout.decode().splitlines():
        digest, name = line.split()
        got[name] = digest
    assert got == want, err
    s = stats_of(stats)
    assert len(s["rollbacks"]) == len(daemon.times("FAILED")) >= 1, f"the build ended before the rollbacks:\n{err}"
    assert "checkpoint failed" not in err, err


def test_run_supervisor_leaves_no_process_behind(bftfs_bin, criu_ready, tmp_path):
    """A run that is killed (SIGKILL, no cleanup) takes its tree with it: the init dies with the supervisor."""
    prog = script(tmp_path / "long.sh", "#!/bin/sh\necho started\nexec sleep 1000\n")
    with fake_daemon(tmp_path) as daemon:
        proc = subprocess.Popen([str(bftfs_bin), *run_args(daemon, ["--", str(prog)])], cwd=tmp_path,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert proc.stdout.readline() == b"started\n"
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert children, "the supervisor has no child"
        proc.kill()
        proc.wait()

    def gone() -> bool:
        return not any(Path(f"/proc/{c}").exists() for c in children)

    wait_until(gone, 10, "the tree's init to die with the supervisor")
