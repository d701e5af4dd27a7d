"""Coordinator fan-out over several nodes: merging, deadlines, unreachable nodes.

The nodes here serve recorded samples (the capture path itself is exercised against real
processes elsewhere); what is under test is how the coordinator combines them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence

import pytest
from support.factories import make_rank

from hangdoc.capture.find.discover import Discovery
from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.capture.find.wholejob import Elsewhere
from hangdoc.errors import JobNotFound
from hangdoc.fleet.client import AgentError
from hangdoc.fleet.coordinator import Fleet, Round, find_ranks, sample_all
from hangdoc.model import (
    Frame,
    Note,
    NoteKind,
    ProbeAnswer,
    ProbeStatus,
    RankProcess,
    Sample,
    SourceFile,
    Unreachable,
    Verdict,
)
from hangdoc.pipeline import CaptureOptions, observe

C10D = "torch/distributed/distributed_c10d.py"
SPEC = parse_job_spec("10.0.0.1:29500")


class RecordedNode:
    """A node that answers from recorded rank snapshots, optionally slowly or not at all."""

    def __init__(self, name: str, ranks, *, delay: float = 0.0, fail: BaseException | None = None):
        self._name = name
        self.snaps = {r.process.pid: r for r in ranks}
        self.delay = delay
        self.fail = fail
        self.rounds = 0

    @property
    def name(self) -> str:
        return self._name

    def find_ranks(self, spec) -> Discovery:
        if self.fail:
            raise self.fail
        if not self.snaps:
            raise JobNotFound(f"no process has MASTER_ADDR={spec.host} on {self._name}")
        procs = tuple(r.process for r in self.snaps.values())
        return Discovery(procs, procs[0].world_size, (), "recorded")

    def probe(self, pids: Sequence[int], timeout: float):
        if self.fail:
            raise self.fail
        return {
            pid: ProbeAnswer(ProbeStatus.ANSWERED, "", self.snaps[pid].flight)
            if self.snaps[pid].flight
            else ProbeAnswer(ProbeStatus.NO_PROBE, "no hangdoc probe")
            for pid in pids
        }

    def sample(self, procs: Sequence[RankProcess], t: float, *, native: bool, timeout: float) -> list[Sample]:
        time.sleep(self.delay)
        if self.fail:
            raise self.fail
        i = self.rounds
        self.rounds += 1
        out = []
        for p in procs:
            recorded = self.snaps[p.pid].samples
            out.append(recorded[min(i, len(recorded) - 1)])
        return out

    def sources(self, wanted: Mapping[int, Sequence[Frame]]) -> tuple[SourceFile, ...]:
        return ()


class FlakyNode(RecordedNode):
    """Finds its ranks, then fails every sampling round, each time for another reason."""

    def sample(self, procs: Sequence[RankProcess], t: float, *, native: bool, timeout: float) -> list[Sample]:
        self.rounds += 1
        raise ConnectionResetError(f"reset in round {self.rounds}")


def ranks_on(host: str, ranks: dict[int, str], world: int = 4):
    stacks = {
        "reduce": ["train.py:<module>:9", "train.py:step:40", f"{C10D}:all_reduce:2800"],
        "gather": ["train.py:<module>:9", "metrics.py:log:12", f"{C10D}:all_gather:4200"],
    }
    return [
        make_rank(r, stacks[kind], host=host, pid=100 + r, world_size=world, samples=8) for r, kind in ranks.items()
    ]


def test_three_nodes_merge_into_one_diagnosis() -> None:
    nodes = [
        RecordedNode("n0", ranks_on("n0", {0: "reduce", 1: "reduce"}, 6)),
        RecordedNode("n1", ranks_on("n1", {2: "reduce", 3: "reduce"}, 6)),
        RecordedNode("n2", ranks_on("n2", {4: "reduce", 5: "gather"}, 6)),
    ]
    fleet = find_ranks(nodes, SPEC)
    assert [p.rank for p in fleet.procs] == [0, 1, 2, 3, 4, 5]
    _snapshot, d = observe("10.0.0.1:29500", fleet, CaptureOptions(window=0.2, interval=0.05), lambda m: None)
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH and d.culprit_ranks == (5,)
    assert {r.rank: r.host for r in d.ranks} == {0: "n0", 1: "n0", 2: "n1", 3: "n1", 4: "n2", 5: "n2"}
    assert all(n.rounds == nodes[0].rounds for n in nodes)  # lock-step rounds


def test_node_down_is_unreachable_and_its_ranks_unknown() -> None:
    nodes = [
        RecordedNode("n0", ranks_on("n0", {0: "reduce", 1: "reduce"})),
        RecordedNode("n1", [], fail=ConnectionRefusedError("connection refused")),
    ]
    fleet = find_ranks(nodes, SPEC)
    assert [u.target for u in fleet.unreachable] == ["n1"]
    snapshot, d = observe("x", fleet, CaptureOptions(window=0.2, interval=0.05), lambda m: None)
    assert d.verdict is not Verdict.RANK_MISSING
    assert d.partial and "partial evidence" in d.summary
    assert "connection refused" in snapshot.unreachable[0].reason


def test_slow_node_misses_the_deadline_without_holding_the_round() -> None:
    fast = RecordedNode("n0", ranks_on("n0", {0: "reduce", 1: "reduce"}))
    slow = RecordedNode("n1", ranks_on("n1", {2: "reduce", 3: "reduce"}))
    fleet = find_ranks([fast, slow], SPEC)
    slow.delay = 6.0
    t0 = time.monotonic()
    taken = sample_all(fleet, 0.0, native=False, timeout=0.5)
    assert time.monotonic() - t0 < 4.0  # the 1.5 s round deadline, not the node's 6 s
    assert sorted(fleet.placed[i][1].rank for i in taken.samples) == [0, 1]
    assert [(u.target, u.ranks) for u in taken.lost] == [("n1", (2, 3))]
    assert "no answer within 1.5 s" in taken.lost[0].reason


def test_a_node_still_queued_at_the_deadline_is_said_not_asked() -> None:
    # a flat fan-out has MAX_IN_FLIGHT calls in flight; past the deadline, the nodes still
    # waiting their turn were never asked: their reason must not say they did not answer
    from hangdoc.fleet.coordinator import MAX_IN_FLIGHT, fan_out

    nodes = [RecordedNode(f"n{i}", ()) for i in range(MAX_IN_FLIGHT + 6)]
    t0 = time.monotonic()
    results = fan_out(nodes, lambda n: time.sleep(1.5), 0.3)
    assert time.monotonic() - t0 < 1.4  # the deadline, not the calls
    reasons = [str(exc) for _, _, exc in results]
    assert all(r.startswith(("no answer within 0.3 s", "not asked within 0.3 s")) for r in reasons)
    queued = f"not asked within 0.3 s: queued behind {MAX_IN_FLIGHT} calls in flight to {len(nodes)} nodes"
    assert all(r.startswith(queued) for r in reasons[-6:])
    assert reasons[0] == "no answer within 0.3 s"


def hand_made_fleet(*nodes: RecordedNode) -> Fleet:
    """Every node's ranks, placed in rank order, without asking the nodes (no discovery)."""
    placed = [(node, snap.process) for node in nodes for snap in node.snaps.values()]
    return Fleet(placed, len(placed))


def test_sample_all_leaves_the_fleet_unchanged_and_returns_the_lost_node() -> None:
    up = RecordedNode("n0", ranks_on("n0", {0: "reduce", 1: "reduce"}))
    down = RecordedNode(
        "n1", ranks_on("n1", {2: "reduce", 3: "gather"}), fail=ConnectionRefusedError("connection refused")
    )
    fleet = hand_made_fleet(up, down)
    placed = list(fleet.placed)
    first = sample_all(fleet, 0.0, native=False, timeout=0.5)
    assert fleet == Fleet(placed, 4)  # no unreachable, no notes added
    assert sorted(first.samples) == [0, 1]
    assert first.samples[0] == up.snaps[100].samples[0]
    assert first.lost == (Unreachable("n1", "ConnectionRefusedError: connection refused", (2, 3)),)
    # every round says what it found, nothing is remembered in between
    again = sample_all(fleet, 0.5, native=False, timeout=0.5, only={0, 3})
    assert sorted(again.samples) == [0]
    assert again.lost == (Unreachable("n1", "ConnectionRefusedError: connection refused", (3,)),)
    assert fleet == Fleet(placed, 4)


def test_sample_all_gives_a_hangdoc_error_as_its_message() -> None:
    only = RecordedNode("n0", ranks_on("n0", {0: "reduce"}), fail=AgentError("agent n0 unavailable"))
    fleet = hand_made_fleet(only)
    with pytest.raises(AgentError):  # a single node: its errors pass through, as on one machine
        sample_all(fleet, 0.0, native=False, timeout=0.5)
    other = RecordedNode("n1", ranks_on("n1", {1: "reduce"}))
    assert sample_all(hand_made_fleet(only, other), 0.0, native=False, timeout=0.5) == Round(
        {1: other.snaps[101].samples[0]}, (Unreachable("n0", "agent n0 unavailable", (0,)),)
    )


def test_a_node_lost_mid_capture_is_listed_once_with_its_ranks_and_first_reason() -> None:
    up = RecordedNode("n0", ranks_on("n0", {0: "reduce", 1: "reduce"}))
    flaky = FlakyNode("n1", ranks_on("n1", {2: "reduce", 3: "reduce"}))
    fleet = find_ranks([up, flaky], SPEC)
    assert fleet.unreachable == ()
    snapshot, d = observe("x", fleet, CaptureOptions(window=0.2, interval=0.05), lambda m: None)
    assert flaky.rounds > 1  # asked again every round
    assert snapshot.unreachable == (Unreachable("n1", "ConnectionResetError: reset in round 1", (2, 3)),)
    assert d.partial
    assert fleet.unreachable == ()  # recorded by the capture, not in the fleet


def test_no_node_has_the_job() -> None:
    with pytest.raises(JobNotFound, match="no node has a rank"):
        find_ranks([RecordedNode("n0", []), RecordedNode("n1", [])], SPEC)


class NativeAskingNode(RecordedNode):
    """Records which pids it was asked to sample with native frames."""

    def __init__(self, name: str, ranks) -> None:
        super().__init__(name, ranks)
        self.native_for: list[int] = []

    def sample(self, procs: Sequence[RankProcess], t: float, *, native: bool, timeout: float) -> list[Sample]:
        if native:
            self.native_for += [p.pid for p in procs]
        return super().sample(procs, t, native=native, timeout=timeout)


@pytest.mark.parametrize("loop_thread", ["MainThread", "TrainingThread(train_func)"])
def test_a_loop_idle_in_backward_gets_its_native_frames_whatever_its_thread(loop_thread: str) -> None:
    backward = [
        "train.py:train_func:30",
        "torch/_tensor.py:backward:626",
        "torch/autograd/__init__.py:backward:347",
        "torch/autograd/graph.py:_engine_run_backward:823",
    ]
    idle_main = ["threading.py:Thread.join:1112", "threading.py:_wait_for_tstate_lock:1132"]
    in_main = loop_thread == "MainThread"
    ranks = [
        make_rank(
            r,
            backward if in_main else idle_main,
            host="n0",
            pid=100 + r,
            world_size=2,
            samples=8,
            threads=None if in_main else {loop_thread: backward},
        )
        for r in (0, 1)
    ]
    node = NativeAskingNode("n0", ranks)
    fleet = find_ranks([node], SPEC)
    snapshot, _ = observe("x", fleet, CaptureOptions(window=0.2, interval=0.05), lambda m: None)
    assert sorted(node.native_for) == [100, 101]  # once per rank
    assert any(n.words().startswith("native frames taken of pids 100, 101") for n in snapshot.notes)
    assert [n.pids for n in snapshot.notes if n.text.startswith("native frames")] == [(100, 101)]


class SourceServingNode(NativeAskingNode):
    """Also serves the source lines of its ranks' frames: ``lines`` maps (file, line) to text."""

    def __init__(self, name: str, ranks, lines: Mapping[tuple[str, int], str]) -> None:
        super().__init__(name, ranks)
        self.lines = lines

    def sources(self, wanted: Mapping[int, Sequence[Frame]]) -> tuple[SourceFile, ...]:
        frames = {(f.filename, f.line) for fs in wanted.values() for f in fs}
        return tuple(
            SourceFile(file, ((line, text),)) for (file, line), text in self.lines.items() if (file, line) in frames
        )


@pytest.mark.parametrize(
    ("stack", "env", "asked"),
    [
        # torch's own synchronize: a native sample tells a CUDA wait from anything else
        (["train.py:train:30", "torch/cuda/__init__.py:synchronize:1083"], None, True),
        # the job's `.item()` line on a rank that shows a GPU
        (["train.py:train:31"], {"CUDA_VISIBLE_DEVICES": "0"}, True),
        # the same line on a rank that shows none: `.item()` on a CPU tensor returns or computes
        (["train.py:train:31"], None, False),
        # another line of the job, on a GPU rank: nothing to ask
        (["train.py:train:32"], {"CUDA_VISIBLE_DEVICES": "0"}, False),
    ],
)
def test_a_rank_at_a_host_sync_by_its_python_frames_gets_its_native_frames(stack, env, asked) -> None:
    ranks = [make_rank(r, stack, host="n0", pid=100 + r, world_size=2, samples=8, active=True, env=env) for r in (0, 1)]
    lines = {("/job/train.py", 31): "    total += loss.item()", ("/job/train.py", 32): "    total += loss"}
    node = SourceServingNode("n0", ranks, lines)
    fleet = find_ranks([node], SPEC)
    snapshot, _ = observe("x", fleet, CaptureOptions(window=0.2, interval=0.05), lambda m: None)
    assert sorted(node.native_for) == ([100, 101] if asked else [])
    assert any(n.words().startswith("native frames taken of pids 100, 101") for n in snapshot.notes) == asked
    assert [n.pids for n in snapshot.notes if n.text.startswith("native frames")] == ([(100, 101)] if asked else [])


# ------------------------------------------------------------------ pid: over several nodes


class PidNode:
    """A node that answers ``pid:N`` with what it holds under that number (a rank of some job,
    or nothing), and a rendezvous spec with the ranks of that job it holds."""

    def __init__(self, name: str, by_pid: Mapping[int, RankProcess], job: Sequence[RankProcess]):
        self.name, self.by_pid, self.job, self.asked = name, by_pid, job, []

    def find_ranks(self, spec) -> Discovery:
        self.asked.append(str(spec))
        if spec.pid is not None:
            if spec.pid not in self.by_pid:
                raise JobNotFound(f"no process with pid {spec.pid} on {self.name}")
            return Discovery((self.by_pid[spec.pid],), 4, (), "pid")
        if not self.job:
            raise JobNotFound(f"no process has MASTER_ADDR={spec.host} on {self.name}")
        return Discovery(tuple(self.job), 4, (), "endpoint")


def _proc(pid: int, rank: int, host: str, port: str = "29500") -> RankProcess:
    return RankProcess(
        pid, host, rank, world_size=4, env=(("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", port), ("RANK", str(rank)))
    )


def test_a_pid_is_looked_up_on_its_node_and_the_others_are_asked_for_its_job() -> None:
    a = PidNode("a", {4242: _proc(4242, 1, "a")}, [_proc(4241, 0, "a"), _proc(4242, 1, "a")])
    b = PidNode("b", {}, [_proc(4242, 2, "b"), _proc(4243, 3, "b")])  # 4242 there is another rank
    fleet = find_ranks([a, b], parse_job_spec("pid:4242"), deadline=5)
    assert [(n.name, p.rank) for n, p in fleet.placed] == [("a", 1), ("b", 2), ("b", 3)]
    assert b.asked == ["pid:4242", "10.0.0.1:29500"]  # never the pid, once it is known where it is
    assert fleet.notes[0] == Note(
        "pid:4242 is on a, a rank of 10.0.0.1:29500; the other nodes were asked for 10.0.0.1:29500"
    )


WORKERS = "not counted as ranks (DataLoader/compile/multiprocessing workers)"
LISTED = "pid 91 (child of rank 0 (pid 11)), 92 (child of rank 0 (pid 11))"


class NotingNode(PidNode):
    """A node whose discovery says that two processes below its rank 0 are no ranks."""

    def find_ranks(self, spec) -> Discovery:
        found = super().find_ranks(spec)
        return dataclasses.replace(found, notes=(Note(WORKERS, NoteKind.NOT_RANKS, pids=(91, 92), listed=LISTED),))


def test_the_notes_of_several_nodes_name_their_node_as_a_value() -> None:
    a = NotingNode("a:7420", {}, [_proc(11, 0, "a"), _proc(12, 1, "a")])
    b = NotingNode("b:7420", {}, [])  # none of the job there
    fleet = find_ranks([a, b], SPEC, deadline=5)
    said, empty = fleet.notes
    assert said == Note(WORKERS, NoteKind.NOT_RANKS, node="a:7420", pids=(91, 92), listed=LISTED)
    assert said.words() == f"a:7420: {WORKERS}: {LISTED}"
    assert (empty.kind, empty.node, empty.pids) == (NoteKind.NO_RANK_THERE, "b:7420", ())
    assert empty.words() == "b:7420: no process has MASTER_ADDR=10.0.0.1 on b:7420 (no rank there)"
    alone = find_ranks([a], SPEC, deadline=5)  # one node: no other to tell its notes from
    assert alone.notes == (Note(WORKERS, NoteKind.NOT_RANKS, pids=(91, 92), listed=LISTED),)


def test_one_pid_number_on_two_nodes_in_different_jobs_is_refused() -> None:
    from hangdoc.capture.find.jobsplit import MultipleJobs

    a = PidNode("a", {4242: _proc(4242, 1, "a")}, [])
    b = PidNode("b", {4242: _proc(4242, 0, "b", port="31000")}, [])
    with pytest.raises(MultipleJobs) as err:
        find_ranks([a, b], parse_job_spec("pid:4242"), deadline=5)
    assert "pid:4242 names rank processes on 2 nodes (a: 10.0.0.1:29500; b: 10.0.0.1:31000)" in str(err.value)


class SpanningNode(PidNode):
    """A node whose ranks' environment says the job runs on four nodes."""

    def find_ranks(self, spec) -> Discovery:
        found = super().find_ranks(spec)
        there = Elsewhere(self.name.partition(":")[0], "GROUP_WORLD_SIZE=4", ("a", "b", "c", "d"), "10.0.0.1:29500")
        return dataclasses.replace(found, world_size=8, elsewhere=there)


def test_the_other_nodes_note_is_made_once_for_the_nodes_asked() -> None:
    a = SpanningNode("a:7420", {}, [_proc(11, 0, "a"), _proc(12, 1, "a")])
    b = SpanningNode("b:7420", {}, [_proc(21, 2, "b"), _proc(22, 3, "b")])
    fleet = find_ranks([a, b], parse_job_spec("10.0.0.1:29500"), deadline=5)
    (note,) = [n.words() for n in fleet.notes if "other nodes" in n.words()]
    assert note.startswith("ranks 0-3 of 8 are on the nodes asked (a:7420, b:7420)")
    assert "other nodes (c, d), not asked" in note
    assert "--agents a:7420,b:7420,c:7420,d:7420 " in note


def test_no_other_nodes_note_when_the_nodes_asked_hold_the_world() -> None:
    nodes = [
        SpanningNode(f"{h}:7420", {}, [_proc(10 * i + j, 2 * i + j, h) for j in (0, 1)]) for i, h in enumerate("abcd")
    ]
    fleet = find_ranks(nodes, parse_job_spec("10.0.0.1:29500"), deadline=5)
    assert len(fleet.placed) == 8
    assert not any("other nodes" in n.words() for n in fleet.notes)
