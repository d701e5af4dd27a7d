"""The in-process probe on a real hung gloo job, with nothing of hangdoc in the script: three
ranks with torch's flight recorder on (``TORCH_FR_BUFFER_SIZE``) launched as ``hangdoc run --
torchrun ...`` hang in a collective mismatch while rank 0 handles an exception. ``hangdoc
diagnose`` reads their stacks and, through each rank's probe, its flight recorder dump and
rank 0's live exception; both name rank 0 (``tests/jobs/probe/``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from support.harness import free_port, kill_tagged, tagged_pids
from support.paths import REPO, TESTS
from support.probes import remove_probe_files

from hangdoc.bundle import load_snapshot

pytestmark = [pytest.mark.live, pytest.mark.timeout(120)]
JOB = TESTS / "jobs" / "probe" / "fr_probe_mismatch.py"
RANKS = 3
_SCRUB = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "PYTHONPATH",
)


def _line(text: str) -> int:
    """The line of JOB that holds ``text``."""
    return next(i for i, line in enumerate(JOB.read_text().splitlines(), 1) if text in line)


def test_hangdoc_run_brings_flight_recorder_and_exceptions_into_the_diagnosis(tmp_path: Path) -> None:
    tag, ready = uuid.uuid4().hex, tmp_path / "ready"
    ready.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith("HANGDOC_")}
    env.update(
        HANGDOC_TEST_TAG=tag,
        HANGDOC_READY_DIR=str(ready),
        TORCH_FR_BUFFER_SIZE="2000",
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
    )
    torchrun = str(Path(sys.executable).parent / "torchrun")
    argv = [
        sys.executable,
        "-m",
        "hangdoc",
        "run",
        "--",
        torchrun,
        "--nproc-per-node",
        str(RANKS),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(JOB),
    ]
    log = tmp_path / "output.log"
    with open(log, "wb") as out:
        launcher = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=JOB.parent
        )
    try:
        deadline = time.monotonic() + 90
        while len(list(ready.glob("ready.*"))) < RANKS:
            assert launcher.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"not ready:\n{log.read_text()[-3000:]}"
            time.sleep(0.1)
        time.sleep(1.0)
        saved = tmp_path / "snap.json"
        done = subprocess.run(
            [sys.executable, "-m", "hangdoc", "diagnose", f"pid:{launcher.pid}", "--json", "--save", str(saved)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
        )
    finally:
        job = tagged_pids(tag) | {launcher.pid}
        kill_tagged(tag)
        launcher.kill()
        launcher.wait()
        remove_probe_files(job)  # SIGKILL runs no atexit: the probes' sockets stay behind
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert (report["verdict"], report["culprit_ranks"]) == ("collective_mismatch", [0])
    assert report["confidence"] == "high"
    assert report["basis"][0] == "flight recorder: collective #8 of default_pg (0) differs between ranks"
    assert "rank 0 recorded broadcast Float[1] as collective #8 of default_pg (0)" in report["evidence"]
    raised, waits = _line('raise LossDiverged("'), _line("dist.broadcast(")
    assert (
        f"rank 0's main thread is handling __main__.LossDiverged raised at fr_probe_mismatch.py:{raised} "
        f"while in broadcast (fr_probe_mismatch.py:{waits}) (its probe)"
    ) in report["evidence"]
    snapshot = load_snapshot(saved)
    assert all(r.flight is not None and r.flight.entries for r in snapshot.ranks)
    assert [r.rank for r in snapshot.ranks if r.exceptions] == [0]
    assert any(n.words().startswith(f"flight recorder dumps of {RANKS} of {RANKS} ranks") for n in snapshot.notes)
    assert "hangdoc.probe" not in log.read_text()  # hangdoc run said nothing of its own in the job's output
