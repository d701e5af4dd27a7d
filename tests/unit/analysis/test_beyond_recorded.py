"""The waits past the ranks in real captures, replayed: each ``tests/snapshots/beyond/<job>
.json.gz`` was saved by ``hangdoc diagnose --save`` on the live job
``tests/jobs/beyond/<job>.py`` (record again with ``HANGDOC_RECORD_DIR=tests/snapshots
pytest tests/live/test_beyond_live.py``). The verdict, the culprits and the root cause (its
command line holds the header's word, its thread is the header's, it is no rank) come from
the job's header; and what the recordings must not make the analysis do."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from support.harness import load_meta
from support.paths import TESTS

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot
from hangdoc.model import JobSnapshot, Verdict

RECORDED = sorted((TESTS / "snapshots" / "beyond").glob("*.json.gz"))
JOBS = TESTS / "jobs" / "beyond"
_ROOT = "# hangdoc-root:"


def _name(path: Path) -> str:
    return path.name.removesuffix(".json.gz")


def _root(name: str) -> dict[str, str] | None:
    for line in (JOBS / f"{name}.py").read_text().splitlines()[:5]:
        if line.startswith(_ROOT):
            words = line[len(_ROOT) :].split()
            return None if words == ["none"] else dict(w.split("=", 1) for w in words)
    raise AssertionError(f"{name}: no {_ROOT} line")


def test_every_job_past_the_ranks_is_recorded() -> None:
    assert {_name(p) for p in RECORDED} == {p.stem for p in JOBS.glob("*.py") if p.stem != "_ready"}


@pytest.mark.parametrize("path", RECORDED, ids=_name)
def test_the_recorded_wait_ends_where_the_job_hangs(path: Path) -> None:
    meta = load_meta(JOBS / f"{_name(path)}.py")
    snapshot = load_snapshot(path)
    diagnosis = analyse(snapshot)
    assert diagnosis.verdict.value == meta.verdict, diagnosis.summary
    assert list(diagnosis.culprit_ranks) == sorted(meta.culprits), diagnosis.summary
    expected = _root(_name(path))
    root = diagnosis.root_cause
    if expected is None:
        assert root is None
        return
    assert root is not None, diagnosis.summary
    assert root.rank is None and root.pid not in {r.process.pid for r in snapshot.ranks}
    assert expected["cmd"] in " ".join(root.chain[-1].command) and root.thread == expected["thread"]


def _without_beyond(snapshot: JobSnapshot) -> JobSnapshot:
    return dataclasses.replace(snapshot, beyond=())


@pytest.mark.parametrize("path", RECORDED, ids=_name)
def test_without_the_processes_followed_the_verdict_stands_and_no_process_is_named(path: Path) -> None:
    """Waits read but the processes at their ends not sampled (an agent that could not,
    a caller who may not read them): the verdict is the stacks', no root past the ranks."""
    snapshot = load_snapshot(path)
    diagnosis = analyse(_without_beyond(snapshot))
    whole = analyse(snapshot)
    if whole.verdict is Verdict.EXTERNAL_WAIT:
        assert diagnosis.verdict is Verdict.EXTERNAL_WAIT or diagnosis.verdict is Verdict.UNKNOWN
    else:
        assert diagnosis.verdict is whole.verdict and diagnosis.culprit_ranks == whole.culprit_ranks
    ranks = {r.process.pid for r in snapshot.ranks}
    assert diagnosis.root_cause is None or diagnosis.root_cause.pid in ranks


@pytest.mark.parametrize("path", RECORDED, ids=_name)
def test_one_rank_alone_never_says_external_wait(path: Path) -> None:
    """A verdict about every rank needs every rank: one rank's capture of a job whose size
    its environment says is unknown at most, whatever its wait."""
    snapshot = load_snapshot(path)
    for kept in snapshot.ranks:
        alone = dataclasses.replace(snapshot, ranks=(kept,))
        assert analyse(alone).verdict is not Verdict.EXTERNAL_WAIT
