"""During a capture, agents' answers decode to shared values (``memo.share_values``): a
stack in every answer that holds it is one object, and so is a rank's thread, and its list
of threads, that did not change since the last round. Decoded values stay equal to what was
sent; outside a capture nothing is kept."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from support.factories import make_rank

from hangdoc import memo
from hangdoc.fleet import wire
from hangdoc.fleet.coordinator import Fleet, fan_out_pids
from hangdoc.fleet.node import ReplayNode
from hangdoc.model import FrameLocals, JobSnapshot, RankProcess, Sample, ThreadStack
from hangdoc.pipeline import CaptureOptions, observe

ALL_REDUCE = ["train.py:main:30", "torch/distributed/distributed_c10d.py:all_reduce:2501"]
LOADER = ["threading.py:run:982", "data.py:prefetch:30"]


def over_the_wire(samples: dict[int, Sample]) -> dict[int, Sample]:
    """``samples`` as a fresh agent answer decodes them: encoded, sent, parsed back."""
    msg = wire.samples_to_proto(samples)
    return wire.samples_from_proto(type(msg).FromString(msg.SerializeToString()))


def rounds(ranks, count: int = 3) -> list[dict[int, Sample]]:
    """Each round's answer, as its own message: sample ``i`` of every rank."""
    return [over_the_wire({r.process.pid: r.samples[i] for r in ranks}) for i in range(count)]


def test_a_rank_unchanged_between_rounds_is_the_same_threads_and_equal_to_what_was_sent() -> None:
    ranks = [make_rank(r, ALL_REDUCE, threads={"loader": LOADER}) for r in range(4)]
    with memo.share_values():
        taken = rounds(ranks)
    for rank in ranks:
        pid = rank.process.pid
        first, *later = (answer[pid] for answer in taken)
        assert all(s.threads is first.threads for s in later)  # one list, one object per thread
        assert [s.threads for s in (first, *later)] == [s.threads for s in rank.samples]
        assert [s.t for s in (first, *later)] == [s.t for s in rank.samples]
    # the same stack in two ranks' answers, and in two rounds' messages: one object
    stacks = {id(s.threads[0].frames) for answer in taken for s in answer.values()}
    assert len(stacks) == 1
    frames = {id(th.frames[0]) for answer in taken for s in answer.values() for th in s.threads}
    assert len(frames) == 2  # main.py's and threading.py's outermost frames


def test_what_changed_is_new_and_its_unchanged_siblings_stay_shared() -> None:
    moving = make_rank(
        0,
        stacks=[[*ALL_REDUCE[:1], "model.py:forward:40"], [*ALL_REDUCE[:1], "model.py:forward:41"], ALL_REDUCE],
        threads={"loader": LOADER},
    )
    with memo.share_values():
        taken = rounds([moving])
    pid = moving.process.pid
    samples = [answer[pid] for answer in taken]
    assert [s.threads for s in samples] == [s.threads for s in moving.samples]
    mains = [s.threads[0] for s in samples]
    assert len({id(m) for m in mains}) == 3 and len({id(s.threads) for s in samples}) == 3
    assert len({id(s.threads[1]) for s in samples}) == 1  # the loader did not move


def test_a_thread_that_differs_only_in_a_flag_or_its_name_is_not_shared() -> None:
    base = make_rank(0, ALL_REDUCE, samples=1).samples[0]
    (thread,) = base.threads
    variants = [
        thread,
        ThreadStack(thread.thread_id, thread.name, thread.frames, thread.native_id, active=True),
        ThreadStack(thread.thread_id, thread.name, thread.frames, thread.native_id, owns_gil=True),
        ThreadStack(thread.thread_id, "renamed", thread.frames, thread.native_id),
        ThreadStack(thread.thread_id, None, thread.frames, thread.native_id),
        ThreadStack(thread.thread_id + 1, thread.name, thread.frames, thread.native_id),
        ThreadStack(thread.thread_id, thread.name, thread.frames, None),
    ]
    with memo.share_values():
        decoded = [over_the_wire({1: Sample(t=0.0, threads=(v,))})[1].threads[0] for v in variants]
        again = [over_the_wire({1: Sample(t=0.5, threads=(v,))})[1].threads[0] for v in variants]
    assert decoded == variants
    assert len({id(d) for d in decoded}) == len(variants)
    assert all(a is d for a, d in zip(again, decoded, strict=True))


def test_a_thread_with_kept_arguments_is_equal_but_never_shared() -> None:
    rank = make_rank(0, ALL_REDUCE, arguments=[(-1, {"tensor": "Tensor(shape=[4])"})])
    with memo.share_values():
        taken = rounds([rank])
    threads = [answer[rank.process.pid].threads[0] for answer in taken]
    assert threads == [s.threads[0] for s in rank.samples]
    assert threads[0].locals == (FrameLocals(1, (("tensor", "Tensor(shape=[4])"),)),)
    assert len({id(t) for t in threads}) == 3


def test_outside_a_capture_nothing_is_shared_or_kept() -> None:
    assert memo.shared_values() is None
    ranks = [make_rank(r, ALL_REDUCE) for r in range(2)]
    taken = rounds(ranks)
    assert taken[0][1000].threads == taken[1][1000].threads
    assert taken[0][1000].threads is not taken[1][1000].threads
    assert taken[0][1000].threads[0].frames is taken[0][1001].threads[0].frames  # one answer's table
    assert taken[0][1000].threads[0].frames is not taken[1][1000].threads[0].frames  # two answers: two copies
    assert memo.shared_values() is None


def test_each_capture_has_its_own_values_and_its_fan_out_threads_see_them() -> None:
    seen: dict[str, memo.SharedValues | None] = {}

    def other_capture() -> None:
        with memo.share_values():
            seen["other"] = memo.shared_values()

    with memo.share_values():
        mine = memo.shared_values()
        with memo.share_values():  # a capture within a capture: the outer one's values
            assert memo.shared_values() is mine
        assert memo.shared_values() is mine
        other = threading.Thread(target=other_capture)
        other.start()
        other.join(5)
        a, b = Node("a"), Node("b")
        fleet = Fleet(((a, RankProcess(1, "a", 0)), (b, RankProcess(2, "b", 1))), 2)
        answers = fan_out_pids(fleet, lambda node, pids: memo.shared_values(), 5.0)
    assert seen["other"] is not None and seen["other"] is not mine  # a capture of another job
    assert [answer.value for answer in answers] == [mine, mine]
    assert memo.shared_values() is None
    with memo.share_values():
        assert memo.shared_values() is not mine  # a later capture starts afresh


class Node:
    """Enough of a node for ``fan_out_pids``."""

    def __init__(self, name: str) -> None:
        self.name = name


class WireReplay(ReplayNode):
    """A saved job's node whose samples come as an agent's would: a new message each round."""

    def sample(self, procs: Sequence[RankProcess], t: float, *, native: bool, timeout: float) -> list[Sample]:
        taken = super().sample(procs, t, native=native, timeout=timeout)
        by_pid = over_the_wire({p.pid: s for p, s in zip(procs, taken, strict=True)})
        return [by_pid[p.pid] for p in procs]


def test_a_diagnosis_shares_the_threads_of_its_rounds() -> None:
    ranks = tuple(make_rank(r, ALL_REDUCE, threads={"loader": LOADER}, host="n0") for r in range(4))
    saved = JobSnapshot(spec="x", ranks=ranks, world_size=4)
    node = WireReplay(saved, "n0")
    fleet = Fleet(tuple((node, r.process) for r in ranks), 4)
    options = CaptureOptions(window=0.4, interval=0.2, max_window=0.4, timeout=1.0)
    snapshot, diagnosis = observe("x", fleet, options, lambda _: None)
    assert [len(r.samples) for r in snapshot.ranks] == [3, 3, 3, 3]
    for rank in snapshot.ranks:
        assert len({id(s.threads) for s in rank.samples}) == 1
    assert len({id(r.samples[0].threads[0].frames) for r in snapshot.ranks}) == 1
    assert diagnosis.verdict.value == "nccl_timeout" and diagnosis.culprit_ranks == ()
    assert memo.shared_values() is None
