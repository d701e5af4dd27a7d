"""Following waits past the ranks (``fleet.follow``) over a node that answers from a table:
the bounds on depth and breadth, two samples of each process followed, ranks never
sampled as processes beyond them, and only the threads the analysis asked for."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hangdoc.fleet.coordinator import Fleet
from hangdoc.fleet.follow import MAX_DEPTH, MAX_FOLLOWED, MAX_PEERS_EACH, follow_waits
from hangdoc.fleet.node import Waited
from hangdoc.model import RankProcess, Sample, ThreadStack, ThreadWait, WaitKind


class TableNode:
    """A node whose processes wait on the pids ``leads`` names (one thread each)."""

    name = "node-a"

    def __init__(self, leads: dict[int, tuple[int, ...]]) -> None:
        self.leads = leads
        self.sampled: list[int] = []
        self.asked: list[int] = []

    def waits(self, pids: Sequence[int]) -> Waited:
        self.asked += pids
        waits = {p: (ThreadWait(p, "read", WaitKind.PIPE, 3, "pipe:[1]", self.leads.get(p, ())),) for p in pids}
        named = {q for p in pids for q in self.leads.get(p, ())}
        return Waited(waits, {q: RankProcess(q, self.name, None, cmdline=("worker",)) for q in named})

    def sample(self, procs: Sequence[RankProcess], t: float, *, native: bool, timeout: float) -> list[Sample]:
        self.sampled += [p.pid for p in procs]
        return [Sample(t=t, threads=(ThreadStack(1, "MainThread", (), p.pid),)) for p in procs]


def _fleet(node: TableNode, *pids: int) -> Fleet:
    return Fleet(tuple((node, RankProcess(pid, node.name, rank)) for rank, pid in enumerate(pids)), len(pids))  # type: ignore[misc]


def _run(node: TableNode, fleet: Fleet, wanted: dict[int, frozenset[int]]):
    samples = [[Sample(t=0.0, threads=(ThreadStack(1, "MainThread", (), p.pid),))] for _, p in fleet.placed]
    beyond, notes = follow_waits(fleet, samples, wanted, lambda: 1.0, pause=0.0, timeout=1.0)
    return samples, beyond, notes


def test_a_chain_is_followed_to_its_end_and_each_process_sampled_twice() -> None:
    node = TableNode({1: (10,), 10: (11,), 11: ()})
    samples, beyond, notes = _run(node, _fleet(node, 1, 2), {0: frozenset({1})})
    assert sorted(pid for _, pid in beyond.held) == [10, 11]
    assert node.sampled.count(10) == 2 and node.sampled.count(11) == 2
    assert 1 not in node.sampled and 2 not in node.sampled  # ranks are sampled by the rounds only
    assert samples[0][-1].waits[0].peers == (10,)
    assert all(len(s.samples) == 2 and s.samples[-1].waits for s in beyond.snapshots())
    assert notes[-1].pids == (10, 11)


def test_only_the_threads_asked_for_keep_their_waits() -> None:
    node = TableNode({1: (10,)})
    samples, beyond, _ = _run(node, _fleet(node, 1), {0: frozenset({99})})
    assert samples[0][-1].waits == () and not beyond.held


def test_a_wait_back_on_a_rank_or_a_process_followed_is_not_sampled_again() -> None:
    node = TableNode({1: (10,), 10: (2, 11), 11: (10,)})
    _, beyond, _ = _run(node, _fleet(node, 1, 2), {0: frozenset({1})})
    assert sorted(pid for _, pid in beyond.held) == [10, 11]
    assert node.sampled.count(10) == 2


def test_depth_and_breadth_are_bounded() -> None:
    deep = {1: (10,), **{10 + i: (11 + i,) for i in range(20)}}
    node = TableNode(deep)
    _, beyond, notes = _run(node, _fleet(node, 1), {0: frozenset({1})})
    assert len(beyond.held) == MAX_DEPTH
    assert any("no further" in n.text for n in notes)
    wide = TableNode({1: tuple(range(100, 140)), **{p: tuple(range(p * 10, p * 10 + 9)) for p in range(100, 140)}})
    _, beyond, _ = _run(wide, _fleet(wide, 1), {0: frozenset({1})})
    first = [pid for _, pid in beyond.held if 100 <= pid < 140]
    assert len(first) == MAX_PEERS_EACH and len(beyond.held) <= MAX_FOLLOWED


def test_a_node_that_fails_is_a_note_not_an_error() -> None:
    class Broken(TableNode):
        def waits(self, pids: Sequence[int]) -> Waited:
            raise OSError("the agent went away")

    node = Broken({})
    samples, beyond, notes = _run(node, _fleet(node, 1), {0: frozenset({1})})
    assert not beyond.held and "the agent went away" in notes[0].text


def test_included_processes_are_followed_though_no_rank_waits() -> None:
    class Including(TableNode):
        def waits(self, pids: Sequence[int], include: Sequence[str] = ()) -> Waited:
            found = super().waits(pids)
            if include:
                found.peers[50] = RankProcess(50, self.name, None, cmdline=("python", "server.py", "--serve"))
            return found

    node = Including({50: ()})
    fleet = _fleet(node, 1)
    samples = [[Sample(t=0.0, threads=(ThreadStack(1, "MainThread", (), 1),))]]
    beyond, notes = follow_waits(fleet, samples, {}, lambda: 1.0, pause=0.0, timeout=1.0, include=("--serve",))
    assert [pid for _, pid in beyond.held] == [50] and node.sampled.count(50) == 2
    assert "--include" in notes[-1].text and samples[0][-1].waits == ()


class FarNode(TableNode):
    """A node whose agent listens at ``address`` and holds one TCP connection's far end."""

    def __init__(self, name: str, address: str, holders: dict[tuple[str, str], tuple[int, ...]]) -> None:
        super().__init__({})
        self.name, self.address, self.held = name, address, holders
        self.sockets: list[tuple[str, str]] = []

    def waits(
        self, pids: Sequence[int], include: Sequence[str] = (), sockets: Sequence[tuple[str, str]] = ()
    ) -> Waited:
        found = super().waits(pids)
        self.sockets += sockets
        holders = {pair: self.held[pair] for pair in sockets if pair in self.held}
        peers = {p: RankProcess(p, "node-b", None, cmdline=("server",)) for ps in holders.values() for p in ps}
        return Waited(found.waits, {**found.peers, **peers}, holders)


def test_a_connection_to_another_node_is_followed_through_that_nodes_agent() -> None:
    local, remote = "10.0.0.1:41000", "10.0.0.2:8000"

    class Near(TableNode):
        name = "node-a"
        address = "10.0.0.1:7420"

        def waits(
            self, pids: Sequence[int], include: Sequence[str] = (), sockets: Sequence[tuple[str, str]] = ()
        ) -> Waited:
            wait = ThreadWait(1, "recvfrom", WaitKind.SOCKET, 5, "socket:[9]", (), remote, local)
            return Waited({p: (wait,) for p in pids}, {})

    near = Near({})
    far = FarNode("node-b", "10.0.0.2:7420", {(remote, local): (812,)})
    fleet = dataclasses.replace(_fleet(near, 1), answered=(near, far))  # type: ignore[arg-type]
    samples, beyond, _ = _run(near, fleet, {0: frozenset({1})})
    assert far.sockets[0] == (remote, local)  # the far node asked for its end: its local, our remote
    assert list(beyond.held) == [("node-b", 812)] and far.sampled.count(812) == 2
    wait = samples[0][-1].waits[0]
    assert wait.peers == (812,) and wait.peer_host == "node-b"


def test_a_connection_to_a_node_nobody_serves_stays_an_address() -> None:
    class Near(TableNode):
        name = "node-a"

        def waits(
            self, pids: Sequence[int], include: Sequence[str] = (), sockets: Sequence[tuple[str, str]] = ()
        ) -> Waited:
            wait = ThreadWait(1, "recvfrom", WaitKind.SOCKET, 5, "socket:[9]", (), "10.9.9.9:8000", "10.0.0.1:4")
            return Waited({p: (wait,) for p in pids}, {})

    near = Near({})
    far = FarNode("node-b", "10.0.0.2:7420", {})
    fleet = dataclasses.replace(_fleet(near, 1), answered=(near, far))  # type: ignore[arg-type]
    samples, beyond, _ = _run(near, fleet, {0: frozenset({1})})
    assert not beyond.held and far.sockets == [] and samples[0][-1].waits[0].remote == "10.9.9.9:8000"


def test_a_process_followed_carries_the_host_its_nodes_ranks_carry() -> None:
    """An agent may call its machine otherwise than the fleet names the node (a Ray node is
    named by its id): the followed process is put on the ranks' host, where the chain looks."""

    class Renaming(TableNode):
        def waits(
            self, pids: Sequence[int], include: Sequence[str] = (), sockets: Sequence[tuple[str, str]] = ()
        ) -> Waited:
            found = super().waits(pids)
            return Waited(found.waits, {p: dataclasses.replace(r, host="machine-7") for p, r in found.peers.items()})

    node = Renaming({1: (10,)})
    _, beyond, _ = _run(node, _fleet(node, 1), {0: frozenset({1})})
    assert [s.process.host for s in beyond.snapshots()] == ["node-a"]
