"""Attacks on the in-process probe and on its root reader by a real unprivileged user
(issue 23, items 2, 3 and 9).

The attacker is uid 65534 (nobody), the victim uid 65533, both run through ``setpriv``; the
reader is root, as the agent is. The attacker takes ``/tmp/hangdoc-probe-<victim uid>``
first and plants a probe of its own there under the victim's pid: the victim's probe still
starts and is the one read. The attacker's own probes drip their answers a byte a second
(eight read at once, as eight ``Flight`` calls would) or answer with countless values inside
the size cap: each is dropped within seconds, or refused within its memory bound.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.paths import REPO, TESTS

from hangdoc.capture.read.probe_client import MAX_ANSWER_BYTES, PEAK_ANSWER_BYTES, probe_state
from hangdoc.model import ProbeStatus

pytestmark = [
    pytest.mark.live,
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to act as other users"
    ),
]

NOBODY, VICTIM = 65534, 65533
FAKE = TESTS / "support" / "fake_probe.py"
PROBE = REPO / "hangdoc" / "probe.py"
NOT_INITIALISED = "its probe says: torch.distributed is not initialised in this process"
# the victim's job: hangdoc's probe loaded by its path (standard library only), as `hangdoc run` loads it
VICTIM_JOB = f"""
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("_hangdoc_probe", {str(PROBE)!r})
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)
print("ready", probe.start(), flush=True)
time.sleep(120)
"""
READER = r"""
import json, resource, sys
from concurrent.futures import ThreadPoolExecutor
from hangdoc.capture.read.probe_client import probe_state
pids = [int(p) for p in sys.argv[1:]]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with ThreadPoolExecutor(len(pids)) as pool:
    answers = list(pool.map(lambda pid: probe_state(pid, timeout=30.0), pids))
added = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
print(json.dumps({"added": added, "reasons": [a.reason for a in answers]}))
"""


def _python() -> str:
    """An interpreter other users may run (this venv's may live in root's home)."""
    for python in (sys.executable, "/usr/bin/python3"):
        if (
            subprocess.run(
                ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, "-c", ""],
                capture_output=True,
                check=False,
                timeout=30,
            ).returncode
            == 0
        ):
            return python
    pytest.skip("no Python that uid 65534 may run")


class Users:
    """Processes started as other users, each in a session of its own: killed with their
    descendants at the end, and the directories they made removed."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.paths: list[Path] = []
        self.python = _python()

    def start(self, uid: int, argv: list[str]) -> tuple[int, str]:
        """Start ``argv`` (after the interpreter) as ``uid``; its pid and what it said
        after ``ready``."""
        proc = subprocess.Popen(
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", self.python, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            start_new_session=True,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:1] == ["ready"], proc.communicate(timeout=10)[1][-2000:]
        return proc.pid, line[1]

    def fake(self, answer: str, size: int = 1000, drip: float = 0.0, directory: str = "", name: str = "") -> int:
        """A fake probe of the attacker's, in a directory of its own."""
        directory = directory or f"/tmp/hangdoc-probe-{NOBODY}-{uuid.uuid4().hex[:12]}"
        self.paths.append(Path(directory))
        argv = [str(FAKE), "--dir", directory, "--answer", answer, "--size", str(size), "--drip", str(drip)]
        return self.start(NOBODY, argv + (["--name", name] if name else []))[0]

    def end(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate(timeout=10)
        for path in self.paths:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def users() -> Iterator[Users]:
    made = Users()
    try:
        yield made
    finally:
        made.end()


def test_a_squatted_probe_directory_neither_stops_nor_steers_the_victim_s_probe(users: Users) -> None:
    squatted = Path(f"/tmp/hangdoc-probe-{VICTIM}")
    assert not squatted.exists(), f"{squatted} is left from elsewhere"
    users.paths.append(squatted)
    subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            users.python,
            "-c",
            f"import os; os.mkdir({str(squatted)!r}); os.chmod({str(squatted)!r}, 0o777)",
        ],
        check=True,
        timeout=30,
    )
    pid, path = users.start(VICTIM, ["-c", VICTIM_JOB])
    users.paths.append(Path(path).parent)
    directory = os.lstat(Path(path).parent)
    assert Path(path).parent.name.startswith(f"hangdoc-probe-{VICTIM}-") and path.endswith(f"/{pid}.sock")
    assert (directory.st_uid, directory.st_mode & 0o777) == (VICTIM, 0o700)
    # the squatter plants a probe of its own under the victim's pid, in the name it took
    users.fake("entries", size=10_000, directory=str(squatted), name=f"{pid}.sock")
    answer = probe_state(pid)
    assert (answer.status, answer.reason, answer.flight) == (ProbeStatus.ANSWERED, NOT_INITIALISED, None)


def test_an_attacker_s_probes_that_drip_are_dropped_within_seconds(users: Users) -> None:
    pids = [users.fake("quiet", drip=1.0) for _ in range(8)]
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda pid: probe_state(pid, timeout=30.0), pids))
    took = time.monotonic() - started
    assert took < 5, f"eight dripping probes held their readers {took:.1f} s"
    for answer in answers:
        assert answer.status is ProbeStatus.FAILED
        assert "bytes of its answer in 2.0 s, slower than hangdoc reads" in answer.reason, answer.reason


def test_an_attacker_s_answers_of_countless_values_are_refused_in_bounded_memory(users: Users) -> None:
    kinds = ("entries", "exceptions", "astral")
    pids = [users.fake(kind, size=MAX_ANSWER_BYTES - 1000) for kind in kinds]
    done = subprocess.run(
        [sys.executable, "-c", READER, *map(str, pids)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=REPO,
    )
    read = json.loads(done.stdout)
    assert read["reasons"][0].startswith(
        "its probe sent a flight recorder dump hangdoc cannot read: JSON of more than 524,288 objects"
    )
    assert read["reasons"][1] == "its probe sent an answer hangdoc cannot read: more than 4,096 values"
    assert read["reasons"][2].startswith("its probe sent a flight recorder dump hangdoc cannot read: not a flight")
    # before issue 23, one Flight call over three such ranks added 2-3.6 GB
    assert read["added"] < len(kinds) * PEAK_ANSWER_BYTES, read
