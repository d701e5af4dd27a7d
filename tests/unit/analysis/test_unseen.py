"""A rank that cannot be captured is evidence: when every rank that could be read waits in
one collective, the ranks not seen there are the likely culprits, by elimination (a rank
stuck in the kernel on a dead filesystem while 63 others wait is the classic case)."""

from __future__ import annotations

import dataclasses

from support.factories import make_rank, make_snapshot

from hangdoc.analysis.analyse import analyse
from hangdoc.model import CaptureErrorKind, ProcessState, RankState, Verdict
from hangdoc.watch.stall import Action, judge

C10D = "torch/distributed/distributed_c10d.py"
LOOP = ["train.py:<module>:200", "train.py:main:150", "train.py:train_step:40"]


def _waiting(rank: int, op: str = "all_reduce", line: int = 40) -> object:
    return make_rank(rank, [*LOOP[:2], f"train.py:train_step:{line}", f"{C10D}:{op}:2800"], world_size=4)


def test_the_rank_not_seen_where_all_others_wait_is_the_likely_culprit() -> None:
    timed_out = make_rank(3, error=CaptureErrorKind.TIMEOUT, world_size=4)
    in_d = ProcessState("disk-sleep", cpu_seconds=10.0, num_threads=9)  # what capture records beside the error
    stuck = dataclasses.replace(timed_out, samples=tuple(dataclasses.replace(s, state=in_d) for s in timed_out.samples))
    d = analyse(make_snapshot([_waiting(r) for r in (0, 1, 2)] + [stuck]))
    assert d.verdict is Verdict.STRAGGLER
    assert d.culprit_ranks == (3,)
    assert d.summary.startswith("straggler: rank 3 could not be read while ranks 0-2 wait in all_reduce")
    assert d.summary.endswith(": likely the rank they wait for")
    assert (
        "rank 3 (pid 1003) could not be read: py-spy timed out; process in uninterruptible sleep (D): "
        "stuck in the kernel, on a dead filesystem or device" in [e.words() for e in d.evidence]
    )
    assert any(e.rank == 3 and e.text.startswith("(pid 1003) could not be read") for e in d.evidence)
    assert any("by elimination, not by a stack" in e.words() for e in d.evidence)
    assert sum("could not be read" in e.words() for e in d.evidence) == 1  # said once, not again as a note
    assert d.partial  # the verdict rests on a rank nobody saw
    state = {ra.rank: ra.state for ra in d.ranks}
    assert state[3] is RankState.UNREADABLE
    # the watchdog does not postpone it: nothing shows the unseen rank working
    assert judge(d, 0, 3).action is Action.FIRE


def test_without_an_unseen_rank_the_same_wait_is_a_transport_hang() -> None:
    d = analyse(make_snapshot([_waiting(r) for r in range(4)]))
    assert d.verdict is Verdict.NCCL_TIMEOUT
    assert d.culprit_ranks == ()


def test_an_unseen_rank_does_not_hide_a_mismatch_among_the_seen() -> None:
    denied = make_rank(3, error=CaptureErrorKind.PTRACE_DENIED, world_size=4)
    d = analyse(make_snapshot([_waiting(0), _waiting(1), _waiting(2, "all_gather", 55), denied]))
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH
    assert d.culprit_ranks == (2,)
    assert any("rank 3 could not be read" in e.words() for e in d.evidence)  # still reported as a note
