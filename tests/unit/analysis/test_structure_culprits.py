"""Culprits that explain the structure (``hangdoc.analysis.structure``): in model-parallel
jobs ranks of different process groups legitimately wait at different places, so the
culprits are the few ranks that left the structure, not everyone outside the largest class.

The jobs are Megatron-style (``bench/synthetic_parallel.py``): tensor-parallel groups at
eight places (attention or MLP, forward or recompute, plain or sequence parallel), pipeline
stages receiving on their group, expert-parallel all_to_all at dispatch or combine; three
ranks of one group went on to the epoch-end barrier on WORLD. Snapshots carry no call
arguments (the first bundle format), with or without the call lines.
"""

from __future__ import annotations

import sys

import pytest
from support.factories import make_frame, make_rank, make_snapshot
from support.paths import REPO

from hangdoc.analysis.analyse import analyse
from hangdoc.analysis.structure import Scope, line_scope, minority
from hangdoc.model import Confidence, Diagnosis, Frame, Verdict

sys.path.insert(0, str(REPO / "bench"))
from synthetic_parallel import SHAPES, outlier_ranks, parallel_snapshot

C10D = "torch/distributed/distributed_c10d.py"
LOOP = ["train.py:<module>:200", "train.py:main:150"]


def _short(d: Diagnosis) -> None:
    """The summary names the few, and counts the many (no thousands of rank numbers)."""
    assert len(d.summary) < 400, d.summary
    assert len(d.culprit_ranks) <= 3


@pytest.mark.parametrize("code", [True, False], ids=["lines", "no-lines"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("world", [2_000, 10_000])
def test_the_ranks_that_left_the_structure_are_the_culprits(world: int, shape: str, code: bool) -> None:
    d = analyse(parallel_snapshot(world, shape, code=code))
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH, d.summary
    assert d.culprit_ranks == outlier_ranks(world, shape), d.summary
    _short(d)
    if code:  # the call lines say which op runs on WORLD: named by torch's semantics
        assert "on WORLD, which waits for every rank" in d.summary
        assert d.confidence is Confidence.MEDIUM  # read from lines, not arguments
    else:  # nothing says which groups: the merged tree's shape alone, said low
        assert "left the others' path for barrier" in d.summary
        assert d.confidence is Confidence.LOW
        assert any("the merged tree's shape alone" in b for b in d.basis)


@pytest.mark.parametrize("code", [True, False], ids=["lines", "no-lines"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("world", [2_000, 10_000])
def test_a_structure_with_no_one_outside_names_no_one(world: int, shape: str, code: bool) -> None:
    d = analyse(parallel_snapshot(world, shape, code=code, outliers=0))
    assert d.culprit_ranks == ()
    assert d.confidence is Confidence.LOW
    _short(d)
    if code:  # every op on a passed group: no mismatch is visible at all
        assert d.verdict is Verdict.UNKNOWN, d.summary
        assert "no small set of ranks is outside that structure" in d.summary
    else:  # the ops' groups unknown: ranks in different ops, nobody to blame
        assert d.verdict is Verdict.COLLECTIVE_MISMATCH, d.summary
        assert any("no small set is off the others' path" in b for b in d.basis), d.basis


@pytest.mark.timeout(150)
@pytest.mark.parametrize("code", [True, False], ids=["lines", "no-lines"])
def test_the_three_outliers_are_named_at_100k(code: bool) -> None:
    # building and analysing take some 4 s a case here (2 cores)
    world = 100_000
    d = analyse(parallel_snapshot(world, "tp", code=code))
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH, d.summary
    assert d.culprit_ranks == outlier_ranks(world, "tp")
    _short(d)


def test_outliers_at_one_place_fewer_than_a_group_of_the_structure() -> None:
    # groups of 4, and 3 ranks at the barrier: still fewer than any place of the others
    world = 2_048
    d = analyse(parallel_snapshot(world, "ep", group=4, code=False))
    assert d.culprit_ranks == outlier_ranks(world, "ep", group=4)


# -- the rule's edges, by hand -------------------------------------------------------------


def _site(line: int, text: str | None) -> Frame:
    return make_frame(f"train.py:train_step:{line}", code=text)


def _on(rank: int, line: int, text: str | None, world: int, op: str = "all_reduce") -> object:
    return make_rank(
        rank, [*LOOP, "train.py:step:90", _site(line, text), f"{C10D}:{op}:2800"], world_size=world, samples=2
    )


def _at_barrier(rank: int, world: int, text: str | None = "dist.barrier()") -> object:
    return make_rank(
        rank,
        [*LOOP, make_frame("train.py:epoch_end:120", code=text), f"{C10D}:barrier:4100"],
        world_size=world,
        samples=2,
    )


def test_the_few_on_a_passed_group_are_named_when_the_many_are_on_world() -> None:
    # the other side of the rule: 13 ranks at the WORLD barrier, 3 ranks of two groups still
    # in their groups' all_reduce at two places: they are what the barrier waits for
    world = 16
    ranks = [
        _on(0, 40, "dist.all_reduce(x, group=tp)", world),
        *(_on(r, 55, "dist.all_reduce(x, group=tp)", world) for r in (1, 2)),
        *(_at_barrier(r, world) for r in range(3, 16)),
    ]
    d = analyse(make_snapshot(ranks))
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH
    assert d.culprit_ranks == (0, 1, 2)


def test_two_places_of_whole_groups_on_passed_groups_name_no_one() -> None:
    # 6 and 2 ranks on passed groups: each place could hold whole groups of 2
    world = 8
    ranks = [
        *(_on(r, 40, "dist.all_reduce(x, group=g)", world) for r in range(6)),
        *(_on(r, 55, "dist.all_reduce(x, group=g)", world) for r in (6, 7)),
    ]
    d = analyse(make_snapshot(ranks))
    assert d.verdict is Verdict.UNKNOWN, d.summary
    assert d.culprit_ranks == ()
    assert d.confidence is Confidence.LOW


def test_a_split_group_on_passed_groups_names_no_one() -> None:
    # 3 and 1 (no common divisor): no whole groups of one size; but the single rank waits in
    # a passed group's collective for a member who is in the others' op: which of them
    # skipped an op, stacks do not say (issue 25)
    world = 4
    ranks = [
        *(_on(r, 40, "dist.all_reduce(x, group=g)", world) for r in range(3)),
        _on(3, 55, "dist.all_reduce(x, group=g)", world),
    ]
    d = analyse(make_snapshot(ranks))
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH
    assert d.culprit_ranks == () and d.confidence is Confidence.LOW


def _tree_job(outliers: int, place: int) -> object:
    """No lines: ranks 0-7 and 8-15 at two places, ``place`` ranks of the last at a third,
    and ``outliers`` ranks off the others' path at the barrier."""
    world = 16 + place + outliers
    ranks = [
        *(_on(r, 40, None, world) for r in range(8)),
        *(_on(r, 55, None, world) for r in range(8, 16)),
        *(_on(r, 70, None, world) for r in range(16, 16 + place)),
        *(_at_barrier(r, world, None) for r in range(16 + place, world)),
    ]
    return make_snapshot(ranks)


def test_the_tree_names_a_path_only_when_fewer_than_every_place() -> None:
    # 3 ranks off the path, fewer than the 4 at the smallest place: named (low)
    d = analyse(_tree_job(outliers=3, place=4))  # type: ignore[arg-type]
    assert d.culprit_ranks == (20, 21, 22)
    assert d.confidence is Confidence.LOW
    # 4 ranks off the path, as many as that place: it may be a place of the structure
    d = analyse(_tree_job(outliers=4, place=4))  # type: ignore[arg-type]
    assert d.culprit_ranks == ()
    assert d.confidence is Confidence.LOW


def test_a_minority_is_fewer_than_half() -> None:
    assert minority([[0, 1, 2], [3]]) == [3]
    assert minority([[0, 1], [2], [3]]) == []  # the largest holds half: no minority
    assert minority([[0, 1, 2], [3], [4]]) == [3, 4]


@pytest.mark.parametrize(
    ("name", "line", "scope"),
    [
        ("barrier", "dist.barrier()", Scope.WORLD),
        ("all_reduce", "dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)", Scope.WORLD),
        ("all_reduce", "dist.all_reduce(t, group=None)", Scope.WORLD),
        ("all_reduce", "dist.all_reduce(t, group=dist.group.WORLD)", Scope.WORLD),
        ("broadcast", "torch.distributed.broadcast(rng_state, 0)", Scope.WORLD),
        ("all_reduce", "torch.distributed.all_reduce(x, group=get_tensor_model_parallel_group())", Scope.PART),
        ("barrier", "torch.distributed.barrier(group=group)", Scope.PART),
        ("all_reduce", "dist.all_reduce(t, op, pg)", None),  # a third positional: the group
        ("all_reduce", "dist.all_reduce(t,", None),  # the call goes on to the next line
        ("all_reduce", "dist.all_reduce(*args)", None),
        ("all_reduce", "loss.backward()", None),  # not the call
        ("all_reduce", None, None),  # no line
    ],
)
def test_the_call_line_says_the_scope(name: str, line: str | None, scope: Scope | None) -> None:
    assert line_scope(name, make_frame("train.py:f:1", code=line)) is scope


# ------------------------------------------------------------------ who waits for whom


def _expert_step(rank: int, line: int, text: str) -> object:
    return make_rank(
        rank, [*LOOP, make_frame(f"moe.py:step:{line}", code=text), f"{C10D}:all_reduce:2800"], world_size=4
    )


def test_a_rank_in_its_group_s_collective_waits_for_members_in_the_world_op() -> None:
    """Rank 3 waits in its expert group's all_reduce; ranks 0-2 are in the WORLD all_reduce.
    Rank 3's collective needs a fellow member who is in the WORLD op (it skipped it): rank 3
    is a victim, and the stacks do not say which member skipped."""
    ranks = [_expert_step(r, 75, "dist.all_reduce(p.grad)") for r in range(3)]
    ranks.append(_expert_step(3, 70, "dist.all_reduce(tokens, group=ep_group)"))
    d = analyse(make_snapshot(ranks))
    assert (d.verdict, d.culprit_ranks, d.confidence) == (Verdict.COLLECTIVE_MISMATCH, (), Confidence.LOW)
    assert d.summary.startswith(
        "collective mismatch: rank 3 waits in all_reduce (moe.py:70) on "
        "a group its caller passed, while ranks 0-2 are in all_reduce "
        "(moe.py:75) on WORLD: a member of its group is in the others' "
        "op"
    ), d.summary
    assert "stacks do not say which, so no rank is named" in d.summary
    assert any("completes once every member of the group has entered it" in e.words() for e in d.evidence)


def test_a_rank_on_world_among_ranks_in_group_collectives_is_still_the_one_named() -> None:
    """The other way round: rank 3 alone on WORLD while ranks 0-2 wait on passed groups is
    the rank every group waits for (it left the structure)."""
    ranks = [_expert_step(r, 70, "dist.all_reduce(tokens, group=ep_group)") for r in range(3)]
    ranks.append(_expert_step(3, 75, "dist.all_reduce(p.grad)"))
    d = analyse(make_snapshot(ranks))
    assert (d.verdict, d.culprit_ranks) == (Verdict.COLLECTIVE_MISMATCH, (3,))
