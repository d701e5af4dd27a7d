"""The in-process probe on a real hung gloo job: three ranks with torch's flight recorder
on call ``hangdoc.probe.start()``; ``hangdoc diagnose`` reads their stacks and, through each
rank's probe, its flight recorder dump, and both name rank 0 (``tests/jobs/probe/``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.harness import launch, load_meta
from support.paths import REPO, TESTS

from hangdoc.bundle import load_snapshot

pytestmark = pytest.mark.timeout(300)
JOB = TESTS / "jobs" / "probe" / "fr_probe_mismatch.py"


def test_diagnose_reads_the_flight_recorder_through_the_probe(tmp_path: Path) -> None:
    meta = load_meta(JOB)
    with launch(meta, tmp_path) as job:
        job.wait_ready(150)
        saved = tmp_path / "snap.json"
        done = subprocess.run([sys.executable, "-m", "hangdoc", "diagnose", job.job_spec(), "--json",
                               "--save", str(saved)], check=False, capture_output=True, text=True,
                              timeout=120, cwd=REPO, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert (report["verdict"], report["culprit_ranks"]) == ("collective_mismatch", [0])
    assert report["confidence"] == "high"
    assert report["basis"][0] == "flight recorder: collective #8 of default_pg (0) differs between ranks"
    assert "rank 0 recorded broadcast Float[1] as collective #8 of default_pg (0)" in report["evidence"]
    snapshot = load_snapshot(saved)
    assert all(r.flight is not None and r.flight.entries for r in snapshot.ranks)
    assert any(n.startswith("flight recorder dumps of 3 of 3 rank(s)") for n in snapshot.notes)
