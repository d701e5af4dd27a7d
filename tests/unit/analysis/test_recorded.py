"""Analysis-only replay of snapshots recorded from the real corpus jobs (no live processes).

Each ``tests/snapshots/<job>.json.gz`` was saved by ``hangdoc diagnose --save`` on the live
job ``tests/jobs/<job>.py`` (record again with ``HANGDOC_RECORD_DIR=tests/snapshots make
test``). The expected verdict and culprits come from the job's own header, so a change to
the analysis that breaks a real case fails here in milliseconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.harness import JOBS_DIR, load_meta
from support.paths import TESTS

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot
from hangdoc.report.json_report import to_json_dict

SNAPSHOTS = TESTS / "snapshots"
RECORDED = sorted(SNAPSHOTS.glob("*.json.gz"))


def _name(path: Path) -> str:
    return path.name.removesuffix(".json.gz")


@pytest.mark.parametrize("path", RECORDED, ids=_name)
def test_recorded_snapshot_verdict(path: Path) -> None:
    meta = load_meta(JOBS_DIR / f"{_name(path)}.py")
    snapshot = load_snapshot(path)
    diagnosis = analyse(snapshot)
    assert diagnosis.verdict.value == meta.verdict, diagnosis.summary
    assert list(diagnosis.culprit_ranks) == sorted(meta.culprits), diagnosis.summary
    report = to_json_dict(diagnosis, snapshot)
    assert report["verdict"] == meta.verdict


def test_every_verdict_is_recorded() -> None:
    verdicts = {load_meta(JOBS_DIR / f"{_name(p)}.py").verdict for p in RECORDED}
    expected = {
        "not_hung",
        "cleanup_deadlock",
        "collective_mismatch",
        "nccl_timeout",
        "straggler",
        "rank_missing",
        "init_deadlock",
    }
    assert expected <= verdicts, f"no recorded snapshot for {sorted(expected - verdicts)}"
