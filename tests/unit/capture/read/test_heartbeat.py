"""Step heartbeats written by a real training-like process, read back by a watcher."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support.paths import REPO

from hangdoc.capture.read.heartbeat_files import read_dir as read_heartbeats


def run_loop(tmp_path: Path, body: str) -> subprocess.Popen:
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(body))
    env = dict(os.environ, HANGDOC_HEARTBEAT_DIR=str(tmp_path / "hb"), PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, str(script)], env=env)


def wait_for(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def test_steps_advance_then_stall(tmp_path) -> None:
    proc = run_loop(
        tmp_path,
        """
        import time, hangdoc
        for i in range(30):
            with hangdoc.step(i):
                time.sleep(0.01)
        with hangdoc.step(30):
            time.sleep(60)   # the hang: inside step 30
    """,
    )
    try:
        beat = wait_for(lambda: (h := read_heartbeats(tmp_path / "hb").get(proc.pid)) and h.step == 30 and h)
        assert beat.in_step and beat.beats == 61
        time.sleep(0.5)
        later = read_heartbeats(tmp_path / "hb")[proc.pid]
        assert later.beats == beat.beats and later.age_seconds >= 0.5
    finally:
        proc.kill()
        proc.wait()


def test_forked_child_writes_its_own_record(tmp_path) -> None:
    proc = run_loop(
        tmp_path,
        """
        import os, time, hangdoc
        hangdoc.heartbeat(5)
        pid = os.fork()
        if pid == 0:
            hangdoc.heartbeat(99)
            os._exit(0)
        os.waitpid(pid, 0)
        print(pid, flush=True)
        time.sleep(60)
    """,
    )
    try:
        beats = wait_for(lambda: len(read_heartbeats(tmp_path / "hb")) == 2 and read_heartbeats(tmp_path / "hb"))
        assert beats[proc.pid].step == 5  # the child's beat did not overwrite the parent's record
        assert sorted(b.step for b in beats.values()) == [5, 99]
    finally:
        proc.kill()
        proc.wait()


def test_unwritable_directory_drops_beats_silently(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = dict(os.environ, HANGDOC_HEARTBEAT_DIR=str(blocker / "sub"), PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-c", "import hangdoc; hangdoc.heartbeat(1); print('ok')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok" and out.stderr == ""


def _beating(env: dict[str, str], argv_prefix: list[str] = ()) -> subprocess.Popen:
    code = "import hangdoc, os, sys, time; hangdoc.heartbeat(42); print(os.getpid(), flush=True); time.sleep(60)"
    return subprocess.Popen(
        [*argv_prefix, sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=str(REPO), **env),
        stdout=subprocess.PIPE,
        text=True,
    )


def test_read_process_finds_the_record_by_the_process_own_view(tmp_path) -> None:
    from hangdoc.capture.read.heartbeat_files import read_process

    own_dir = _beating({"HANGDOC_HEARTBEAT_DIR": str(tmp_path / "own")})
    # its own PID namespace: it writes hb-1.bin under /dev/shm/hangdoc, we know it by another pid
    namespaced = _beating({}, ["unshare", "--pid", "--fork", "--mount-proc"])
    try:
        assert int(own_dir.stdout.readline()) == own_dir.pid
        assert int(namespaced.stdout.readline()) == 1
        beat = wait_for(lambda: read_process(own_dir.pid))
        assert beat.pid == own_dir.pid and beat.step == 42 and beat.beats == 1
        inner = wait_for(lambda: [c.pid for c in __import__("psutil").Process(namespaced.pid).children()])[0]
        beat = wait_for(lambda: read_process(inner))
        assert beat.pid == inner and beat.step == 42
        assert read_process(namespaced.pid) is None  # unshare itself never beat
    finally:
        for proc in (own_dir, namespaced):
            proc.kill()
            proc.wait()
            proc.stdout.close()
        for leftover in Path("/dev/shm/hangdoc").glob("hb-1-*.bin"):
            leftover.unlink(missing_ok=True)


def test_read_process_does_not_follow_a_planted_link(tmp_path) -> None:
    from hangdoc.capture.read.heartbeat_files import read_process
    from hangdoc.heartbeat import MAGIC, RECORD, VERSION

    target = tmp_path / "elsewhere.bin"  # a valid record: only the link itself may be refused
    target.write_bytes(RECORD.pack(MAGIC, VERSION, 1, 0, 7, 1, time.monotonic_ns()))
    sleeper = subprocess.Popen(["sleep", "60"], env=dict(os.environ, HANGDOC_HEARTBEAT_DIR=str(tmp_path)))
    try:
        (tmp_path / f"hb-{sleeper.pid}.bin").symlink_to(target)
        assert read_process(sleeper.pid) is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_fifo_named_like_a_record_does_not_block_the_reader(tmp_path) -> None:
    from hangdoc.capture.read.heartbeat_files import read_dir, read_process
    from hangdoc.heartbeat import pid_namespace, record_name

    sleeper = subprocess.Popen(["sleep", "60"], env=dict(os.environ, HANGDOC_HEARTBEAT_DIR=str(tmp_path)))
    try:
        os.mkfifo(tmp_path / record_name(sleeper.pid, pid_namespace(str(sleeper.pid))))
        t0 = time.monotonic()
        assert read_process(sleeper.pid) is None
        assert read_dir(tmp_path) == {}
        assert time.monotonic() - t0 < 2
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act for another user")
def test_a_heartbeat_directory_named_by_the_process_is_read_only_as_it_could(tmp_path) -> None:
    """The directory comes from the process's environment: no link in it is followed, `..`
    does not climb out of its root, and a record it may not read itself is not read."""
    import tempfile

    from hangdoc.capture.read.heartbeat_files import read_process
    from hangdoc.heartbeat import MAGIC, RECORD, VERSION

    record = RECORD.pack(MAGIC, VERSION, 1, 0, 7, 1, time.monotonic_ns())
    private = Path(tempfile.mkdtemp(prefix="hb-private-"))  # root's, 0700
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "via-link").symlink_to(real)
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    cases = [
        (str(tmp_path / "via-link"), real, []),  # root could read it, but not via a link
        (f"/proc/self/../..{private}", private, []),  # nor by climbing with ..
        (str(private), private, as_nobody),
    ]  # nobody may not read root's 0700 directory
    try:
        for directory, holder, user in cases:
            sleeper = subprocess.Popen(
                [*user, "sleep", "60"], env={"HANGDOC_HEARTBEAT_DIR": directory, "PATH": os.environ["PATH"]}
            )
            try:
                wait_for(lambda p=sleeper.pid: Path(f"/proc/{p}/exe").resolve().name == "sleep")  # setpriv is done
                (holder / f"hb-{sleeper.pid}.bin").write_bytes(record)
                assert read_process(sleeper.pid) is None, directory
            finally:
                sleeper.kill()
                sleeper.wait()
        readable = subprocess.Popen(["sleep", "60"], env={"HANGDOC_HEARTBEAT_DIR": str(real)})
        try:
            # its environment is the one it was started with only once it has exec'd
            wait_for(lambda p=readable.pid: Path(f"/proc/{p}/exe").resolve().name == "sleep")
            (real / f"hb-{readable.pid}.bin").write_bytes(record)
            # the same record, read the proper way (waited for: on a loaded machine the first
            # read has come back empty, once in about a hundred runs)
            beat = wait_for(lambda p=readable.pid: read_process(p))
            assert beat.step == 7
        finally:
            readable.kill()
            readable.wait()
    finally:
        shutil.rmtree(private)
