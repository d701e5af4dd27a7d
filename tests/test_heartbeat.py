"""Step heartbeats written by a real training-like process, read back by a watcher."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from hangdoc.heartbeat import read_heartbeats

REPO = Path(__file__).resolve().parent.parent


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
    proc = run_loop(tmp_path, """
        import time, hangdoc
        for i in range(30):
            with hangdoc.step(i):
                time.sleep(0.01)
        with hangdoc.step(30):
            time.sleep(60)   # the hang: inside step 30
    """)
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
    proc = run_loop(tmp_path, """
        import os, time, hangdoc
        hangdoc.heartbeat(5)
        pid = os.fork()
        if pid == 0:
            hangdoc.heartbeat(99)
            os._exit(0)
        os.waitpid(pid, 0)
        print(pid, flush=True)
        time.sleep(60)
    """)
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
    out = subprocess.run([sys.executable, "-c", "import hangdoc; hangdoc.heartbeat(1); print('ok')"],
                         env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok" and out.stderr == ""
