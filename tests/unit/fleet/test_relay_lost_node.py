"""A node lost through the relays says why: an agent that cannot start a thread for its
call (its node out of tasks: kernel.pid_max, ulimit -u) is that node's unreachable reason,
as a value the coordinator reports, and the relay's other nodes are found; an agent with a
token starts no thread it never uses (caller identification)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.fleet import limits, tree
from hangdoc.fleet.agent import AgentConfig, BackgroundAgent, serve_in_thread
from hangdoc.fleet.client import AgentAuth, RemoteNode
from hangdoc.fleet.coordinator import find_ranks

pytestmark = [pytest.mark.timeout(60)]
TOKEN = "t" * 32
SNAPSHOT = Path(__file__).parents[2] / "snapshots" / "mismatch_uneven_shards_eval_gather.json.gz"
N = 3  # fan-out 2: groups {0,1} {2}, the first relayed by node 0


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[BackgroundAgent], list[limits.Lanes]]]:
    lanes: list[limits.Lanes] = []
    init = limits.Lanes.__init__

    def recorded(self: limits.Lanes) -> None:
        init(self)
        lanes.append(self)

    monkeypatch.setattr(limits.Lanes, "__init__", recorded)
    agents: list[BackgroundAgent] = []
    try:
        for k in range(N):
            config = AgentConfig(
                listen="127.0.0.1:0",
                token=TOKEN,
                host=f"node{k}",
                replay=str(SNAPSHOT),
                replay_rank_offset=3 * k,
                replay_world_size=3 * N,
            )
            agents.append(serve_in_thread(config))
        yield agents, lanes
    finally:
        for agent in agents:
            agent.stop()


def test_a_node_out_of_threads_is_lost_with_that_reason(
    started: tuple[list[BackgroundAgent], list[limits.Lanes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    agents, lanes = started
    monkeypatch.setattr(tree, "TREE_AT", 1)
    monkeypatch.setattr(tree, "FANOUT", 2)
    addresses = [f"127.0.0.1:{a.port}" for a in agents]
    victim = sorted(addresses)[1]  # a leaf under the relay sorted(addresses)[0]

    def no_thread(*args: object, **kwargs: object) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(lanes[addresses.index(victim)].operator.pool, "submit", no_thread)
    nodes = [RemoteNode(a, AgentAuth(token=TOKEN)) for a in addresses]
    try:
        fleet = find_ranks(nodes, parse_job_spec("127.0.0.1:29500"), deadline=20.0)
    finally:
        for node in nodes:
            node.close()
    assert [u.target for u in fleet.unreachable] == [victim]
    reason = fleet.unreachable[0].reason
    assert "could not start the call's work: can't start new thread" in reason, reason
    assert len(fleet.placed) == 3 * (N - 1)


def test_an_agent_with_a_token_starts_no_identify_thread() -> None:
    before = set(threading.enumerate())
    agent = serve_in_thread(AgentConfig(listen="127.0.0.1:0", token=TOKEN, replay=str(SNAPSHOT)))
    try:
        started = {t.name for t in set(threading.enumerate()) - before}
        assert not any(name.startswith("hangdoc-identify") for name in started), started
    finally:
        agent.stop()
