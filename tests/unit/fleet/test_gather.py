"""The capture's steps across nodes: the one fan-out by pid that serves every per-rank call
(its failures come back as values), the probes asked once, and a ``Gather`` that asks the
question it is given for native frames."""

from __future__ import annotations

import time
from collections.abc import Sequence

from support.factories import make_rank

from hangdoc.fleet.coordinator import Fleet, fan_out_pids
from hangdoc.fleet.gather import Gather
from hangdoc.fleet.probes import ask_probes
from hangdoc.model import Heartbeat, Note, ProbeAnswer, ProbeStatus, RankProcess, Sample

BACKWARD = ["train.py:main:30", "torch/autograd/graph.py:_engine_run_backward:823"]


class Node:
    """Answers from recorded ranks; ``fail`` raises from every per-rank call, ``delay`` is
    how long each takes."""

    def __init__(
        self,
        name: str,
        ranks=(),
        *,
        fail: Exception | None = None,
        delay: float = 0.0,
        answers: dict[int, ProbeAnswer] | None = None,
    ) -> None:
        self.name, self.fail, self.delay = name, fail, delay
        self.snaps = {r.process.pid: r for r in ranks}
        self.answers = answers or {}
        self.asked: list[list[int]] = []
        self.native_for: list[int] = []

    def heartbeats(self, pids: Sequence[int]) -> dict[int, Heartbeat]:
        self.asked.append(list(pids))
        time.sleep(self.delay)
        if self.fail:
            raise self.fail
        return {pid: Heartbeat(pid, 1, 1, False, 0.0) for pid in pids}

    def probe(self, pids: Sequence[int], timeout: float) -> dict[int, ProbeAnswer]:
        self.asked.append(list(pids))
        if self.fail:
            raise self.fail
        return {pid: self.answers[pid] for pid in pids if pid in self.answers}

    def sample(self, procs: Sequence[RankProcess], t: float, *, native: bool, timeout: float) -> list[Sample]:
        if native:
            self.native_for += [p.pid for p in procs]
        return [self.snaps[p.pid].samples[0] for p in procs]

    def sources(self, wanted):
        return ()


def fleet_of(*placed: tuple[Node, int]) -> Fleet:
    return Fleet(tuple((node, RankProcess(pid, node.name, rank)) for rank, (node, pid) in enumerate(placed)), None)


def test_one_fan_out_by_pid_hands_back_every_node_answer_or_failure() -> None:
    good, bad, slow = Node("good"), Node("bad", fail=RuntimeError("down")), Node("slow", delay=2.0)
    fleet = fleet_of((good, 7), (bad, 7), (good, 8), (slow, 9))
    answers = fan_out_pids(fleet, lambda node, pids: node.heartbeats(pids), 0.5)
    assert [a.node.name for a in answers] == ["good", "bad", "slow"]
    assert answers[0].ranks == {7: 0, 8: 2} and answers[0].value is not None and answers[0].error is None
    assert answers[1].ranks == {7: 1} and answers[1].value is None and str(answers[1].error) == "down"
    assert answers[2].value is None and answers[2].error is None and isinstance(answers[2].missed, TimeoutError)
    assert good.asked == [[7, 8]]  # one call per node, with its ranks' pids


def test_one_node_failing_is_a_value_too_and_only_and_skip_choose_whom_to_ask() -> None:
    bad = Node("bad", fail=RuntimeError("down"))
    (answer,) = fan_out_pids(fleet_of((bad, 7)), lambda node, pids: node.heartbeats(pids), None)
    assert str(answer.error) == "down"
    a, b = Node("a"), Node("b")
    fleet = fleet_of((a, 1), (a, 2), (b, 3))
    assert [(x.node.name, dict(x.ranks)) for x in fan_out_pids(fleet, lambda n, p: 0, None, only={1, 2})] == [
        ("a", {2: 1}),
        ("b", {3: 2}),
    ]
    assert [x.node.name for x in fan_out_pids(fleet, lambda n, p: 0, None, skip={"a"})] == ["b"]


def test_probes_say_what_answered_and_what_failed() -> None:
    dumpless = ProbeAnswer(ProbeStatus.ANSWERED, "no TORCH_FR_BUFFER_SIZE", heartbeat=Heartbeat(7, 3, 4, True, 1.0))
    a = Node("a", answers={7: dumpless, 8: ProbeAnswer(ProbeStatus.NO_PROBE, "none")})
    b = Node("b", fail=RuntimeError("agent b\nunavailable"))
    probes = ask_probes(fleet_of((a, 7), (a, 8), (b, 9)), {0, 1, 2})
    assert probes.answers == {0: dumpless}
    assert probes.notes == (
        Note("no answer from the probe of pid 9: agent b\\nunavailable"),  # one line
        Note("no flight recorder dump from pid 7: no TORCH_FR_BUFFER_SIZE"),
    )
    assert ask_probes(fleet_of((a, 8)), {0}).notes == ()  # no probe anywhere: nothing to say


def test_gather_takes_native_frames_where_the_question_it_was_given_says_once_per_rank() -> None:
    node = Node("n0", [make_rank(r, BACKWARD, host="n0", pid=100 + r) for r in (0, 1)])
    fleet = Fleet(tuple((node, node.snaps[pid].process) for pid in (100, 101)), 2)
    asked: list[int] = []

    def needs_native(samples, process, code) -> bool:
        asked.append(process.pid)
        return process.pid == 101

    gather = Gather("x", fleet, needs_native, native=False, timeout=1.0)
    assert gather.sample(0.0).captured == 2
    told: list[int] = []
    assert gather.take_native(0.5, told.append) == (101,) and told == [1]
    assert gather.take_native(1.0) == () and node.native_for == [101]
    assert asked == [100, 101, 100]  # a rank given its native sample is not asked of again
    snapshot = gather.snapshot(1.0)
    assert snapshot.notes == (Note("native frames taken of pid 101", pids=(101,)),)
    assert snapshot.notes[0].words() == "native frames taken of pid 101"
    assert [len(r.samples) for r in snapshot.ranks] == [1, 2]
