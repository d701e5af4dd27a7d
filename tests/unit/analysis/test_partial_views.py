"""A verdict over part of a job is never a confident claim about the rest (issue 24).

Every recording (corpus snapshots, stack dumps, flight recorder dumps) is replayed with
ranks hidden: each rank alone, the first half, every rank but one (each culprit among them),
every rank but all the culprits; hidden as absent from the dumps, on a node that stopped
answering, or behind an agent that never answered (``support.partial_views``, which
``bench/bench_accuracy.py --partial`` measures too). No view may be a confident
contradiction of the whole recording, blame a hidden rank with confidence, or call a rank
missing without evidence.

The recordings marked ``xfail`` below are the contradictions found when this test was
written, each with the rule it needs; ``strict`` makes a fixed one fail until its mark goes.
"""

from __future__ import annotations

import pytest
from support.partial_views import (
    SNAPSHOTS,
    Hiding,
    Recording,
    Said,
    Trial,
    recordings,
    subsets,
    trials,
    view,
)

from hangdoc.bundle import load_snapshot
from hangdoc.model import Unreachable, Verdict

pytestmark = pytest.mark.timeout(60)

RECORDINGS = recordings()

# recording -> the rule the analysis lacks (found by this test; the lead decides the fix)
KNOWN: dict[str, str] = {}  # every one found so far is fixed


def _param(rec: Recording) -> object:
    marks = [pytest.mark.xfail(strict=True, reason=KNOWN[rec.name])] if rec.name in KNOWN else []
    return pytest.param(rec, id=rec.name, marks=marks)


@pytest.mark.parametrize("recording", [_param(r) for r in RECORDINGS])
def test_no_view_of_part_of_a_job_is_a_confident_claim_about_the_rest(recording: Recording) -> None:
    views = list(trials(recording))
    bad = [f"{', '.join(t.faults)}: {t}" for t in views if t.faults]
    assert not bad, "\n".join(bad)


def test_the_views_cover_every_verdict_and_every_way_of_hiding() -> None:
    assert set(KNOWN) <= {r.name for r in RECORDINGS}
    snapshots = [r for r in RECORDINGS if not r.from_dumps]
    assert len(snapshots) == len(list(SNAPSHOTS.glob("*.json.gz")))
    assert any(r.name.startswith("dumps/") for r in RECORDINGS)
    assert any(r.name.startswith("flight/") for r in RECORDINGS)
    wholes = {}
    for rec in snapshots:
        views = list(trials(rec))
        assert {t.hiding for t in views} >= {Hiding.DUMPS, Hiding.NODE_SILENT}, rec.name
        wholes[rec.name] = views[0].whole.verdict
    assert {v.value for v in Verdict} - {"unknown", "external_wait"} <= set(wholes.values())


def test_subsets_each_rank_alone_half_and_all_but_each_culprit() -> None:
    got = dict(subsets((0, 1, 2, 3), (1, 3), 4))
    assert got == {
        "rank 0 alone": (0,),
        "rank 1 alone": (1,),
        "rank 2 alone": (2,),
        "rank 3 alone": (3,),
        "first half": (0, 1),
        "all but rank 0": (1, 2, 3),
        "all but culprit 1": (0, 2, 3),
        "all but rank 2": (0, 1, 3),
        "all but culprit 3": (0, 1, 2),
        "all but the culprits": (0, 2),
    }
    # a recording that lacks a rank of the job (rank_missing) is itself a view
    assert ("every rank recorded", (0, 1, 2)) in subsets((0, 1, 2), (3,), 4)
    assert all(len(kept) == 1 for _, kept in subsets(tuple(range(64)), (), 64)[:4])  # 4 singles at most
    assert subsets((0,), (), 1) == []  # nothing to hide


def test_views_hide_ranks_the_way_a_user_gets_them() -> None:
    snap = load_snapshot(next(r.path for r in RECORDINGS if r.name == "straggler_stale_cache_lock"))
    dumps = view(snap, (0, 1), Hiding.DUMPS)
    assert [r.rank for r in dumps.ranks] == [0, 1] and not dumps.nodes_searched and not dumps.unreachable
    lost = view(snap, (0, 1), Hiding.NODE_LOST)
    assert lost.nodes_searched and [u.ranks for u in lost.unreachable] == [(2, 3)]
    silent = view(snap, (0, 1), Hiding.NODE_SILENT)
    assert silent.unreachable and all(isinstance(u, Unreachable) and u.ranks == () for u in silent.unreachable)


def _trial(part: Said, whole: Said, hidden: tuple[int, ...] = (3,), hiding: Hiding = Hiding.DUMPS) -> Trial:
    return Trial("job", "view", hiding, (0, 1, 2), hidden, whole, part)


def test_what_counts_as_a_confident_contradiction() -> None:
    whole = Said("straggler", (3,), "high")
    assert _trial(Said("not_hung", (), "medium"), whole).contradiction  # another verdict
    assert _trial(Said("straggler", (2,), "high"), whole).contradiction  # a culprit the whole does not name
    assert not _trial(Said("not_hung", (), "low"), whole).contradiction  # low: a lead, not a claim
    assert not _trial(Said("unknown", (), "medium"), whole).contradiction
    assert not _trial(Said("straggler", (), "medium"), whole).contradiction  # fewer culprits
    two = Said("collective_mismatch", (1, 3), "high")
    assert not _trial(Said("collective_mismatch", (1,), "medium"), two).contradiction
    assert _trial(Said("straggler", (1,), "medium"), Said("unknown", (), "low")).contradiction
    # blaming a hidden rank confidently is a fault even where the whole agrees
    assert _trial(Said("straggler", (3,), "medium"), whole).faults == ["claim about a hidden rank"]
    # absent: a hidden rank never; a rank never recorded only with a lost node whose ranks are known
    assert _trial(Said("rank_missing", (3,), "low", absent=(3,)), whole).missing_unproven == (3,)
    missing = Said("rank_missing", (4,), "high", absent=(4,))
    assert not _trial(missing, missing, hiding=Hiding.NODE_LOST).missing_unproven
    assert _trial(missing, missing, hiding=Hiding.NODE_SILENT).missing_unproven == (4,)
