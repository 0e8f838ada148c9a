"""`bftfs run`: a command's process tree under checkpoint control (criu-hooks/supervisor.h).

Without speculation (not built yet) the hidden --test-* options drive the mechanism: a checkpoint every N ms,
one epoch kept uncommitted behind the open one, and a rollback to it after chosen checkpoints. What is checked is
what a rollback must guarantee: the program's output reaches bftfs run's stdout exactly once and in order
(nothing printed after a rolled-back checkpoint twice, nothing lost), its private /tmp is put back, the stdin it
had consumed after the checkpoint is fed to it again, and its exit status is its own. Timings are not asserted
(see `bftfs run --stats`).

Needs root (mount and pid namespaces) and, for checkpoints, CRIU (`bftfs-criu` and libcriu, from `make deps`);
the tests say so when they skip.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from harness.waiting import wait_until

pytestmark = pytest.mark.criu

RUN_TIMEOUT_S = 120


def run(bftfs: Path, args: list[str], cwd: Path, input_bytes: bytes | None = None,
        timeout_s: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([str(bftfs), "run", *args], cwd=cwd, input=input_bytes, capture_output=True,
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
    done = run(bftfs_bin, ["--test-checkpoint-ms", "20", "--test-stats-json", str(stats), "--", "sleep", "2"],
               work)
    if b"without libcriu" in done.stderr:
        pytest.skip("bftfs was built without libcriu: `make deps`, then rebuild")
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    probe = json.loads(stats.read_text())
    assert probe["checkpoints"], f"no checkpoint succeeded:\n{done.stderr.decode(errors='replace')}"


def stats_of(path: Path) -> dict:
    return json.loads(path.read_text())


# ---------------------------------------------------------------------------------------------------------
# Supervision without checkpoints


def test_run_passes_output_and_exit_status_through(bftfs_bin, root_only, tmp_path):
    done = run(bftfs_bin, ["--", "sh", "-c", "echo out; echo err >&2; test ! -t 1 && echo pipes; exit 7"], tmp_path)
    assert done.returncode == 7
    assert done.stdout == b"out\npipes\n"
    assert done.stderr == b"err\n"


def test_run_reports_a_command_that_cannot_be_executed(bftfs_bin, root_only, tmp_path):
    done = run(bftfs_bin, ["--", "no-such-command-here"], tmp_path)
    assert done.returncode == 127
    assert b"no-such-command-here: No such file or directory" in done.stderr


def test_run_gives_the_tree_its_own_pid_namespace_and_tmp(bftfs_bin, root_only, tmp_path):
    marker = tmp_path / "marker"
    marker.write_text("outside\n")
    done = run(bftfs_bin, ["--", "sh", "-c", "echo $$; ls -A /tmp | grep -c . || true; cat marker; "
                                             "touch /tmp/private-file"], tmp_path)
    assert done.returncode == 0, done.stderr
    pid, tmp_entries, marker_text = done.stdout.decode().splitlines()
    assert pid == "2"  # the init is pid 1
    # The private /tmp holds only the directories leading to the working directory (kept at its path).
    assert int(tmp_entries) <= 1
    assert marker_text == "outside"
    assert not Path("/tmp/private-file").exists()


def test_run_exit_status_of_a_signal_and_forwarded_sigint(bftfs_bin, root_only, tmp_path):
    done = run(bftfs_bin, ["--", "sh", "-c", "kill -TERM $$"], tmp_path)
    assert done.returncode == 128 + signal.SIGTERM
    proc = subprocess.Popen([str(bftfs_bin), "run", "--", "sh", "-c", "echo started; exec sleep 60"], cwd=tmp_path,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"started\n"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 128 + signal.SIGINT
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------------------------------------------------
# Checkpoints and rollbacks

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
    done = run(bftfs_bin, ["--stats", "--test-checkpoint-ms", "100", "--test-rollback-after", "2,4,6",
                           "--test-stats-json", str(stats), "--", str(prog)], tmp_path)
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 3, err
    expected = [f"line {i}" for i in range(lines)] + ["--- log"] + [f"logged {i}" for i in range(lines)]
    assert done.stdout.decode().splitlines() == expected, err
    assert err.splitlines()[0] == "to stderr"
    assert "bftfs run: checkpoints" in err and "bftfs run: rollbacks 3" in err
    s = stats_of(stats)
    assert len(s["restores"]) == 3
    assert s["epochs_discarded"] == 3
    # The rolled-back epochs had printed lines that were dropped and printed again by the restored tree.
    assert s["output_bytes_dropped"] > 0
    assert s["exit_code"] == 3


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
    with open(errors, "wb") as err_file:
        proc = subprocess.Popen([str(bftfs_bin), "run", "--test-checkpoint-ms", "100", "--test-rollback-after",
                                 "2,4", "--test-stats-json", str(stats), "--", str(prog)], cwd=tmp_path,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err_file)

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
    expected = [f"got input {i}" for i in range(count)] + ["--- log"] + [f"input {i}" for i in range(count)]
    assert out.decode().splitlines() == expected, errors.read_text()
    s = stats_of(stats)
    assert len(s["restores"]) == 2, errors.read_text()
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
    inner = (f"{bftfs_bin} run --test-checkpoint-ms 100 --test-rollback-after 2,3 --test-stats-json {stats} "
             f"-- {prog}")
    done = subprocess.run(["script", "-qec", inner, "/dev/null"], cwd=tmp_path, capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S)
    text = done.stdout.decode(errors="replace").replace("\r\n", "\n")
    assert done.returncode == 0, text
    expected = ["stdout-is-a-tty", "no-controlling-terminal"] + [f"line {i}" for i in range(60)]
    expected.append("no-controlling-terminal")
    assert text.splitlines() == expected
    assert len(stats_of(stats)["restores"]) == 2


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
    done = run(bftfs_bin, ["--test-checkpoint-ms", "50", "--test-rollback-after", "2,3",
                           "--test-stats-json", str(stats), "--", str(build)], tmp_path)
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 0, err
    got = {}
    for line in done.stdout.decode().splitlines():
        digest, name = line.split()
        got[name] = digest
    assert got == want, err
    s = stats_of(stats)
    assert len(s["restores"]) == 2, f"the build ended before the forced rollbacks:\n{err}"
    # A dump that races with the tree's exit fails harmlessly and silently; any other failure is reported.
    assert "checkpoint failed" not in err, err


def test_run_supervisor_leaves_no_process_behind(bftfs_bin, criu_ready, tmp_path):
    """A run that is killed (SIGKILL, no cleanup) takes its tree with it: the init dies with the supervisor."""
    prog = script(tmp_path / "long.sh", "#!/bin/sh\necho started\nexec sleep 1000\n")
    proc = subprocess.Popen([str(bftfs_bin), "run", "--test-checkpoint-ms", "50", "--", str(prog)], cwd=tmp_path,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout.readline() == b"started\n"
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert children, "the supervisor has no child"
    proc.kill()
    proc.wait()

    def gone() -> bool:
        return not any(Path(f"/proc/{c}").exists() for c in children)

    wait_until(gone, 10, "the tree's init to die with the supervisor")
