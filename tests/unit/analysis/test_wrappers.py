"""Collectives routed through a wrapper are told apart by where their paths part.

A wrapper (``deepspeed.comm``, accelerate, an in-house ``all_reduce_mean``) is one call site
for every collective that goes through it. The op's program point is the whole path of the
job's frames to it, so the same wrapper called from different lines is a mismatch, and the
report names the frame where the paths part; the same line through the same wrapper is
the same collective.
"""

from __future__ import annotations

from support.factories import make_frame, make_rank, make_snapshot

from hangdoc.analysis.analyse import analyse
from hangdoc.model import Verdict

C10D = "torch/distributed/distributed_c10d.py:all_reduce:2800"
OUTER = ["train.py:<module>:200", "train.py:main:150"]


def _through(wrapper: str, line: int) -> list:
    return [*OUTER, make_frame(f"train.py:train_step:{line}", code="all_reduce_mean(x)"), wrapper, C10D]


def test_an_in_house_wrapper_called_from_two_lines_is_a_mismatch() -> None:
    wrapper = "utils.py:all_reduce_mean:12"
    snap = make_snapshot(
        [make_rank(r, _through(wrapper, 40)) for r in (0, 1, 2)] + [make_rank(3, _through(wrapper, 55))]
    )
    d = analyse(snap)
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH
    assert d.culprit_ranks == (3,)
    assert d.summary == (
        "collective mismatch: rank 3 is in all_reduce (utils.py:12 from train.py:55) "
        "while ranks 0-2 are in all_reduce (utils.py:12 from train.py:40)"
    )


def test_a_library_wrapper_is_looked_through_to_the_users_line() -> None:
    wrapper = "deepspeed/comm/comm.py:all_reduce:120"  # an installed package
    snap = make_snapshot(
        [make_rank(r, _through(wrapper, 40)) for r in (0, 1, 2)] + [make_rank(3, _through(wrapper, 55))]
    )
    d = analyse(snap)
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH
    assert d.culprit_ranks == (3,)
    assert "rank 3 is in all_reduce (deepspeed/comm/comm.py:120 from train.py:55)" in d.summary
    assert "ranks 0-2 are in all_reduce (deepspeed/comm/comm.py:120 from train.py:40)" in d.summary


def test_the_same_line_through_the_same_wrapper_is_the_same_collective() -> None:
    wrapper = "utils.py:all_reduce_mean:12"
    d = analyse(make_snapshot([make_rank(r, _through(wrapper, 40)) for r in range(4)]))
    assert d.verdict is Verdict.NCCL_TIMEOUT
    assert d.culprit_ranks == ()


def test_direct_calls_read_as_before() -> None:
    snap = make_snapshot(
        [make_rank(r, [*OUTER, "train.py:train_step:40", C10D]) for r in (0, 1, 2)]
        + [make_rank(3, [*OUTER, "train.py:train_step:55", C10D])]
    )
    d = analyse(snap)
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH and d.culprit_ranks == (3,)
    assert d.summary == (
        "collective mismatch: rank 3 is in all_reduce (train.py:55) while ranks 0-2 are in all_reduce (train.py:40)"
    )


C10D_FILE = "torch/distributed/distributed_c10d.py"
STEP = [*OUTER, "loop.py:Loop.run:250", "loop.py:Loop.advance:300"]


def test_three_ops_with_no_minority_are_told_apart_by_where_the_paths_part() -> None:
    # Lightning, uneven shards: two ranks in one training step (the SIGTERM broadcast, the
    # reducer's all_reduce), the third left the step for validation's barrier
    d = analyse(
        make_snapshot(
            [
                make_rank(0, [*STEP, "loop.py:sync_sigterm:265", f"{C10D_FILE}:broadcast:2700"]),
                make_rank(1, [*STEP, "loop.py:backward:320", f"{C10D_FILE}:all_reduce:2800"]),
                make_rank(
                    2,
                    [
                        *OUTER,
                        "loop.py:Loop.run:250",
                        "loop.py:Loop.on_advance_end:406",
                        "eval.py:epoch_end:9",
                        f"{C10D_FILE}:barrier:4100",
                    ],
                ),
            ]
        )
    )
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH
    assert d.culprit_ranks == (2,)
    assert d.summary == (
        "collective mismatch: rank 2 left the others' path into "
        "Loop.on_advance_end (loop.py:406) while ranks 0-1 are in "
        "Loop.advance (loop.py:300)"
    )


def test_paths_that_part_evenly_name_nobody() -> None:
    # the other side: one rank per path, no larger path to call common
    d = analyse(
        make_snapshot(
            [
                make_rank(0, [*STEP, f"{C10D_FILE}:broadcast:2700"]),
                make_rank(
                    1, [*OUTER, "loop.py:Loop.run:250", "loop.py:Loop.on_advance_end:406", f"{C10D_FILE}:barrier:4100"]
                ),
            ]
        )
    )
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH
    assert d.culprit_ranks == ()
