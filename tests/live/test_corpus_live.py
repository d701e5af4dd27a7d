"""Diagnose every real hung job of the corpus (``tests/jobs/``) and check the verdict.

Each job really hangs (or, for healthy jobs, keeps running) under torch.distributed with
gloo. The test launches it through the harness, waits for its ready markers, runs
``python -m hangdoc diagnose JOB --json --save FILE`` against it as a user would, and
compares the report's verdict and culprit ranks with the job's header. Set
``HANGDOC_RECORD_DIR`` to keep each saved snapshot as ``<job name>.json.gz`` for offline
analysis tests.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.harness import JobMeta, RunningJob, corpus, launch
from support.paths import REPO

DIAGNOSE_TIMEOUT = 120


def _params() -> list:
    params = []
    for meta in corpus():
        marks = []
        if meta.mode == "netns":
            marks.append(pytest.mark.netns)
        params.append(pytest.param(meta, id=meta.name, marks=marks))
    return params


def _diagnose(job: RunningJob, snapshot: Path) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "hangdoc", "diagnose", job.job_spec(), "--json", "--save", str(snapshot)]
    return subprocess.run(
        argv, check=False, capture_output=True, text=True, timeout=DIAGNOSE_TIMEOUT, cwd=REPO, stdin=subprocess.DEVNULL
    )


def _record(meta: JobMeta, snapshot: Path) -> None:
    record_dir = os.environ.get("HANGDOC_RECORD_DIR")
    if record_dir and snapshot.exists():
        Path(record_dir).mkdir(parents=True, exist_ok=True)
        with snapshot.open("rb") as src, gzip.open(Path(record_dir) / f"{meta.name}.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)


def _report(result: subprocess.CompletedProcess, job_output: str) -> dict:
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(
            f"hangdoc diagnose exited {result.returncode} without one JSON object "
            f"on stdout\n--- stdout ---\n{result.stdout[:3000]}\n--- stderr ---\n"
            f"{result.stderr[-3000:]}\n--- job output ---\n{job_output[-3000:]}"
        )
    assert isinstance(report, dict), f"stdout JSON is not an object: {report!r}"
    return report


def _explain(meta: JobMeta, report: dict) -> str:
    evidence = "\n".join(f"  - {line}" for line in report.get("evidence", []))
    ranks = "\n".join(f"  {r.get('rank')}: {r.get('state')} {r.get('op')}" for r in report.get("ranks", []))
    return (
        f"{meta.name}: expected {meta.verdict} culprits={sorted(meta.culprits)}, got "
        f"{report.get('verdict')} culprits={report.get('culprit_ranks')}\n"
        f"summary: {report.get('summary')}\nevidence:\n{evidence}\nranks:\n{ranks}"
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("meta", _params())
def test_diagnosis_matches_the_job(meta: JobMeta, tmp_path: Path) -> None:
    snapshot = tmp_path / "snapshot.json"
    with launch(meta, tmp_path / "job") as job:
        job.wait_ready()
        result = _diagnose(job, snapshot)
        job_output = job.output()
    _record(meta, snapshot)
    report = _report(result, job_output)
    assert result.returncode == 0, f"exit {result.returncode}\n{_explain(meta, report)}"
    assert report["verdict"] == meta.verdict, _explain(meta, report)
    assert report["culprit_ranks"] == sorted(meta.culprits), _explain(meta, report)
