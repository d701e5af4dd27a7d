"""The fingerprint of a hang: the same bug gives the same key wherever and however the job
ran (its checkout, its Python, its line numbers, its rank numbers); different bugs of the
recorded corpus give different keys."""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest
from support.factories import make_diagnosis, make_op, make_rank, make_snapshot
from support.paths import TESTS

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot
from hangdoc.model import (
    Diagnosis,
    Frame,
    JobSnapshot,
    Origin,
    RankAnalysis,
    RankSnapshot,
    RankState,
    SourceFile,
    ThreadStack,
    Verdict,
    frame_origin,
)
from hangdoc.service.fingerprint import fingerprint

RECORDED = sorted((TESTS / "snapshots").glob("*.json.gz")) + sorted((TESTS / "snapshots" / "beyond").glob("*.json.gz"))
C10D = "torch/distributed/distributed_c10d.py"
SHIFT = 1000  # lines added to every frame: an edit above the code that hangs


def _name(path: Path) -> str:
    return path.name.removesuffix(".json.gz")


@cache
def _diagnosis(path: Path) -> Diagnosis:
    return analyse(load_snapshot(path))


# -- the same job elsewhere ---------------------------------------------------------------


def _moved(name: str) -> str:
    """Another checkout, another Python: the job's files under another prefix (their last
    two components kept), torch and libraries in dist-packages, the stdlib of 3.12."""
    origin = frame_origin(name)
    if origin.kind in (Origin.TORCH, Origin.LIBRARY):
        return f"/usr/lib/python3/dist-packages/{origin.module_path}"
    if origin.kind is Origin.STDLIB:
        return f"/opt/conda/lib/python3.12/{origin.module_path}"
    if origin.kind is Origin.USER and name.startswith("/"):
        return "/scratch/u7/run-42/" + "/".join(name.split("/")[-2:])
    return name


def _frame(frame: Frame) -> Frame:
    line = frame.line + SHIFT if frame.line is not None and not frame.native else frame.line
    return dataclasses.replace(frame, filename=_moved(frame.filename), line=line)


def _thread(thread: ThreadStack) -> ThreadStack:
    return dataclasses.replace(thread, frames=tuple(map(_frame, thread.frames)))


def _rank(snap: RankSnapshot) -> RankSnapshot:
    samples = tuple(dataclasses.replace(s, threads=tuple(map(_thread, s.threads))) for s in snap.samples)
    process = dataclasses.replace(snap.process, cmdline=tuple(map(_moved, snap.process.cmdline)))
    return dataclasses.replace(snap, process=process, samples=samples)


def _elsewhere(snapshot: JobSnapshot) -> JobSnapshot:
    sources = tuple(
        SourceFile(_moved(s.filename), tuple((n + SHIFT, text) for n, text in s.lines)) for s in snapshot.sources
    )
    return dataclasses.replace(
        snapshot,
        ranks=tuple(map(_rank, snapshot.ranks)),
        beyond=tuple(map(_rank, snapshot.beyond)),
        sources=sources,
    )


def _renumbered(d: Diagnosis) -> Diagnosis:
    """Every rank another number (the order reversed, from 100 on), on other pids and hosts."""
    top = max((r.rank for r in d.ranks if r.rank is not None), default=0)

    def new(rank: int) -> int:
        return 100 + top - rank

    ranks = tuple(
        dataclasses.replace(
            r,
            rank=new(r.rank) if r.rank is not None else None,
            pid=r.pid + 7 if r.pid is not None else None,
            host=f"other-{r.host}",
        )
        for r in d.ranks
    )
    groups = tuple(dataclasses.replace(g, ranks=tuple(map(new, g.ranks))) for g in d.groups)
    return dataclasses.replace(d, ranks=ranks, groups=groups, culprit_ranks=tuple(sorted(map(new, d.culprit_ranks))))


@pytest.mark.parametrize("path", RECORDED, ids=_name)
def test_the_same_hang_elsewhere_has_the_same_key(path: Path) -> None:
    here = _diagnosis(path)
    there = analyse(_elsewhere(load_snapshot(path)))
    assert not here.groups or [g.stack for g in there.groups] != [g.stack for g in here.groups]
    assert (there.verdict, there.culprit_ranks) == (here.verdict, here.culprit_ranks), there.summary
    assert fingerprint(_renumbered(there)) == fingerprint(here)


def test_every_bug_of_the_corpus_has_its_own_key() -> None:
    by_key: dict[str, list[str]] = defaultdict(list)
    for path in RECORDED:
        found = fingerprint(_diagnosis(path))
        assert re.fullmatch(r"[0-9a-f]{16}", found.key)
        by_key[found.key].append(_name(path))
    assert [names for names in by_key.values() if len(names) > 1] == []


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        (
            "mismatch_deepspeed_rank0_save_checkpoint",
            (
                "verdict collective_mismatch",
                "culprit barrier at jobs/mismatch_deepspeed_rank0_save_checkpoint.py:main",
                "waiter all_reduce at jobs/mismatch_deepspeed_rank0_save_checkpoint.py:main",
            ),
        ),
        (
            "straggler_dcp_mirror_queue_full",
            (
                "verdict straggler",
                "culprit - at jobs/straggler_dcp_mirror_queue_full.py:MirroringWriter.write_data in queue.py:Queue.put",
                "waiter all_reduce at jobs/straggler_dcp_mirror_queue_full.py:main",
            ),
        ),
        (
            "beyond/external_wait_reward_service",
            (
                "verdict external_wait",
                "culprit - at beyond/external_wait_reward_service.py:fetch_rewards"
                " in urllib/request.py:OpenerDirector.open",
                "root at beyond/external_wait_reward_service.py:RewardModel.score",
                "root runs python beyond/external_wait_reward_service.py",
            ),
        ),
        ("rank_missing_never_started", None),
    ],
)
def test_the_parts_say_the_roles_the_places_and_the_ops(name: str, parts: tuple[str, ...] | None) -> None:
    found = fingerprint(_diagnosis(TESTS / "snapshots" / f"{name}.json.gz"))
    if parts is None:  # a rank with no process has no place: its state says it
        assert "culprit missing" in found.parts
        assert not any(re.search(r"\d{2,}|:\d", p) for p in found.parts)  # no pid, no line
    else:
        assert found.parts == parts


# -- by hand: what enters the key and what does not ---------------------------------------------


def in_c10d(op: str, site: str) -> list[str]:
    return ["train.py:<module>:200", "train.py:main:150", site, f"{C10D}:{op}:2800"]


def _straggler(world: int, culprit: int, *, op: str = "all_reduce", where: str = "data.py:augment:77") -> Diagnosis:
    loop = ["train.py:<module>:200", "train.py:main:150", where]
    ranks = [
        make_rank(r, loop, active=True, cpu_per_sample=0.5)
        if r == culprit
        else make_rank(r, in_c10d(op, "train.py:step:40"))
        for r in range(world)
    ]
    d = analyse(make_snapshot(ranks))
    assert d.verdict is Verdict.STRAGGLER and d.culprit_ranks == (culprit,), d.summary
    return d


def test_other_culprit_ranks_in_a_larger_job_give_the_same_key() -> None:
    assert fingerprint(_straggler(4, 2)) == fingerprint(_straggler(8, 5))


def test_the_place_and_the_op_enter_the_key() -> None:
    base = fingerprint(_straggler(4, 2)).key
    assert fingerprint(_straggler(4, 2, where="data.py:decode:77")).key != base
    assert fingerprint(_straggler(4, 2, where="data.py:augment:99")).key == base  # a line is no place
    assert fingerprint(_straggler(4, 2, op="all_gather")).key != base


def _mismatch(culprit_site: str, waiter_site: str) -> Diagnosis:
    snap = make_snapshot({0: ["train.py:main:1"], 1: ["train.py:main:1"], 2: ["train.py:main:1"]})
    ops = {0: make_op("barrier", culprit_site), 1: make_op("barrier", waiter_site), 2: make_op("barrier", waiter_site)}
    return make_diagnosis(snap, culprits=[0], ops=ops)


def test_the_role_enters_the_key() -> None:
    one = fingerprint(_mismatch("ckpt.py:save:10", "train.py:step:20"))
    swapped = fingerprint(_mismatch("train.py:step:20", "ckpt.py:save:10"))
    assert one.key != swapped.key
    assert "culprit barrier at job/ckpt.py:save" in one.parts


@pytest.mark.parametrize(
    "path",
    [
        "/home/a/run1/proj/model.py",
        "/scratch/b/proj/model.py",
        "C:\\Users\\b\\proj\\model.py",
    ],
)
def test_files_are_named_wherever_they_were(path: str) -> None:
    frame = Frame("step", path, 12)
    d = make_diagnosis(make_snapshot({0: [frame]}), culprits=[0], ops={0: make_op("all_reduce", frame)})
    assert "culprit all_reduce at proj/model.py:step" in fingerprint(d).parts


def test_library_frames_are_named_inside_their_installation() -> None:
    parts = set()
    for prefix in ("/venv/lib/python3.11/site-packages", "/usr/lib/python3/dist-packages"):
        frame = Frame("_sync_ddp", f"{prefix}/lightning/fabric/utilities/distributed.py", 230)
        d = make_diagnosis(make_snapshot({0: [frame]}), culprits=[0], ops={0: make_op("all_reduce", frame)})
        parts.add(fingerprint(d).parts)
    assert parts == {
        ("verdict collective_mismatch", "culprit all_reduce at lightning/fabric/utilities/distributed.py:_sync_ddp")
    }


def test_ranks_nobody_saw_do_not_enter_the_key_unless_culprits() -> None:
    snap = make_snapshot({0: in_c10d("all_reduce", "train.py:step:40"), 1: in_c10d("all_reduce", "train.py:step:40")})
    ops = {0: make_op("all_reduce", "train.py:step:40"), 1: make_op("all_reduce", "train.py:step:40")}
    seen = make_diagnosis(snap, verdict=Verdict.NCCL_TIMEOUT, ops=ops)
    unseen = make_diagnosis(snap, verdict=Verdict.NCCL_TIMEOUT, ops=ops, states={1: RankState.UNKNOWN})
    assert fingerprint(unseen) == fingerprint(seen)
    gone = RankAnalysis(1, None, "", RankState.UNKNOWN, None, None, None, "its node did not answer")
    blamed = dataclasses.replace(seen, ranks=(seen.ranks[0], gone), culprit_ranks=(1,))
    assert "culprit unknown" in fingerprint(blamed).parts


@pytest.mark.parametrize("verdict", [Verdict.NOT_HUNG, Verdict.UNKNOWN])
def test_a_diagnosis_without_a_hang_still_has_a_key(verdict: Verdict) -> None:
    for d in (make_diagnosis(make_snapshot({}), verdict=verdict, tree=False), make_diagnosis(verdict=verdict)):
        found = fingerprint(d)
        assert re.fullmatch(r"[0-9a-f]{16}", found.key)
        assert found.parts[0] == f"verdict {verdict.value}"
    assert fingerprint(make_diagnosis(make_snapshot({}), verdict=Verdict.NOT_HUNG, tree=False)).key != (
        fingerprint(make_diagnosis(make_snapshot({}), verdict=Verdict.UNKNOWN, tree=False)).key
    )
