"""What the reports say of each rank and of each class of ranks (``report.rows``): the
terminal's rank table and the ``--html`` page both print these values (their own tests
check the tables; these check the decisions)."""

from __future__ import annotations

import pytest
from support.factories import make_op

from hangdoc.model import DistOp, RankAnalysis, RankState, Verdict
from hangdoc.report.rows import (
    call_site,
    culprit_words,
    detail,
    op_text,
    rank_classes,
    rank_rows,
    state_word,
)

AR = make_op("all_reduce", "train.py:train_step:30")
BAR = make_op("barrier", "train.py:evaluate:48")


def _rank(rank: int | None, state: RankState = RankState.WAITING, op: DistOp | None = AR, *,
          host: str = "node0", detail: str = "") -> RankAnalysis:  # fmt: skip
    return RankAnalysis(rank, 100 + (rank or 0), host, state, op, "MainThread", None, detail)


def test_a_job_that_is_not_hung_has_no_rank_blocked() -> None:
    calm = {RankState.BLOCKED: "waiting", RankState.BUSY: "running"}
    for state in RankState:
        assert state_word(state, Verdict.NOT_HUNG) == calm.get(state, state.value)
        for verdict in set(Verdict) - {Verdict.NOT_HUNG}:  # the state's own word
            assert state_word(state, verdict) == state.value
    assert {state_word(s, Verdict.NOT_HUNG) for s in RankState}.isdisjoint({"blocked", "busy"})


def test_op_text_and_call_site() -> None:
    assert op_text(None) == "—"
    assert op_text(AR) == "all_reduce"
    assert op_text(make_op("send", peer=3, in_cleanup=True)) == "send (peer 3) [cleanup]"
    assert call_site(_rank(0)) == "train.py:30"
    assert call_site(_rank(0, op=None)) == ""


def test_a_detail_that_repeats_the_op_is_blank() -> None:
    assert detail(_rank(0, detail="in all_reduce (train.py:30)")) == ""
    assert detail(_rank(0, detail="in lock.acquire (train.py:40)")) == "in lock.acquire (train.py:40)"
    assert detail(_rank(0, op=None, detail="in all_reduce (train.py:30)")) == "in all_reduce (train.py:30)"


def test_rank_rows_in_rank_order_culprits_marked() -> None:
    ranks = [_rank(2, RankState.BLOCKED, BAR), _rank(None), _rank(0), _rank(1, RankState.BUSY, None)]
    rows = rank_rows(ranks, frozenset({2}), Verdict.NOT_HUNG)
    assert [r.rank for r in rows] == [0, 1, 2, None]
    assert [r.culprit for r in rows] == [False, False, True, False]
    assert [r.state_word for r in rows] == ["waiting", "running", "waiting", "waiting"]
    assert [r.op for r in rows] == ["all_reduce", "—", "barrier", "all_reduce"]
    assert rows[2].site == "train.py:48" and rows[2].pid == 102
    assert rank_rows(ranks, frozenset({2}), Verdict.STRAGGLER)[2].state_word == "blocked"


def test_classes_group_by_state_op_and_site_culprits_apart() -> None:
    ranks = [
        *(_rank(r, host=f"node{r // 4}") for r in range(10)),  # 10 in all_reduce, on 3 hosts
        *(_rank(r, op=BAR, detail=f"waits {r % 2}") for r in (10, 11, 12)),  # 3 in barrier
        _rank(13),  # a culprit in all_reduce: a class of its own
        _rank(14, RankState.BLOCKED),  # another state: another class
        _rank(None),
        _rank(None),
    ]
    classes = rank_classes(ranks, frozenset({13}), Verdict.COLLECTIVE_MISMATCH)
    # culprits first, then the largest, then by first rank
    assert [(c.culprit, c.op, c.state, len(c.members)) for c in classes] == [
        (True, "all_reduce", RankState.WAITING, 1),
        (False, "all_reduce", RankState.WAITING, 12),
        (False, "barrier", RankState.WAITING, 3),
        (False, "all_reduce", RankState.BLOCKED, 1),
    ]
    big = classes[1]
    assert big.numbers == tuple(range(10)) and big.unnumbered == 2
    assert big.label(40) == "[0-9] +2 unnumbered"
    assert big.hosts == "3 hosts" and classes[2].hosts == "node0"
    assert big.detail == ""  # none says more than its op
    assert classes[2].detail == "waits 0 (and 1 other details)"  # the commonest: ranks 10 and 12
    assert classes[3].state_word == "blocked" and classes[0].site == "train.py:30"
    assert sum(len(c.members) for c in classes) == len(ranks)


def test_a_long_class_label_is_cut_at_a_comma() -> None:
    (only,) = rank_classes([_rank(r) for r in range(0, 400, 2)], frozenset(), Verdict.STRAGGLER)
    label = only.label(24)
    assert label.startswith("[0,2,4,") and label.endswith(",…]") and len(label) <= 30


@pytest.mark.parametrize(
    ("ranks", "words"),
    [
        ([], ""),
        ([3], "culprit: rank 3"),
        ([7, 3, 5, 6], "culprits: ranks 3, 5-7"),
        (list(range(0, 10_000, 2)), "culprits: ranks 0, 2, 4"),
    ],
)
def test_culprit_words(ranks: list[int], words: str) -> None:
    said = culprit_words(ranks)
    assert said.startswith(words) and "(" not in words
    if len(ranks) > 100:
        assert said.endswith("… (5,000)") and len(said) < 90
    else:
        assert said == words
