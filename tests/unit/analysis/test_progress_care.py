"""Progress decided with care: a job is not hung only when what the waiting ranks wait for
moves. One rank completing ops on its own (a subgroup's loop, a polling wait) beside a rank
that does not move at all says nothing about the ranks stuck behind that one; and a few
ranks moving among many that wait is reported as that, not as "the job progresses"."""

from __future__ import annotations

from support.factories import make_rank, make_snapshot

from hangdoc.analysis.analyse import analyse
from hangdoc.model import RankState, Verdict

C10D = "torch/distributed/distributed_c10d.py"
LOOP = ["train.py:<module>:200", "train.py:main:150"]
WAIT = [*LOOP, "train.py:train_step:40", f"{C10D}:all_reduce:2800"]
LOCKED = [*LOOP, "loader.py:next_batch:12", "threading.py:Lock.acquire:88"]
WORLD = 16


def _waiting(rank: int) -> object:
    return make_rank(rank, WAIT, world_size=WORLD)


def _progressing(rank: int) -> object:
    # a different op in each sample: it completes collectives (on its own subgroup)
    stacks = [[*LOOP, f"stats.py:reduce_stats:{line}", f"{C10D}:all_reduce:2800"] for line in (10, 11, 12)]
    return make_rank(rank, stacks=stacks, world_size=WORLD)


def test_a_rank_that_progresses_does_not_hide_one_that_does_not_move() -> None:
    ranks = [_waiting(r) for r in range(WORLD) if r not in (5, 7)]
    ranks += [make_rank(5, LOCKED, world_size=WORLD), _progressing(7)]
    d = analyse(make_snapshot(ranks))
    assert d.verdict is Verdict.STRAGGLER
    assert d.culprit_ranks == (5,)
    states = {ra.rank: ra.state for ra in d.ranks}
    assert states[7] is RankState.PROGRESSING and states[5] is RankState.BLOCKED


def test_a_few_ranks_progressing_among_many_waiting_is_said_as_such() -> None:
    ranks = [_waiting(r) for r in range(WORLD) if r != 7] + [_progressing(7)]
    d = analyse(make_snapshot(ranks))
    assert d.verdict is Verdict.NOT_HUNG
    assert d.summary.startswith(
        "not hung, for now: only rank 7 completed distributed "
        "operations during the window while ranks 0-6,8-15 waited in "
        "all_reduce"
    )
    assert d.ambiguous  # watched longer before it is final


def test_most_ranks_progressing_is_a_job_that_progresses() -> None:
    # the other side of "a few": more ranks complete ops than wait
    ranks = [_progressing(r) for r in range(WORLD) if r not in (2, 3)]
    ranks += [_waiting(2), _waiting(3)]
    d = analyse(make_snapshot(ranks))
    assert d.verdict is Verdict.NOT_HUNG
    assert d.summary.startswith("not hung: ranks 0-1,4-15 completed distributed operations")
    assert not d.ambiguous


def test_a_working_rank_outside_any_op_is_what_the_waiting_ranks_wait_for() -> None:
    # rank 5 computes (on CPU) while the others wait and rank 7 progresses: slow, not stuck
    ranks = [_waiting(r) for r in range(WORLD) if r not in (5, 7)]
    ranks += [make_rank(5, LOCKED, world_size=WORLD, cpu_per_sample=0.4), _progressing(7)]
    d = analyse(make_snapshot(ranks))
    assert d.verdict is Verdict.NOT_HUNG
