"""A stopped agent under a relay: through the tree the job is found in one pass (FindRanks
answers carry GetInfo), and a node whose agent is stopped (SIGSTOP: its kernel still
accepts, nothing answers) is unreachable once its connection's wait is over (the
coordinator's connect timeout, ``RelayChild.connect_seconds``), as when GetInfo came first,
not after FindRanks' whole deadline."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
from support.agents import REPO, Agent, start_agent

from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.fleet import tree
from hangdoc.fleet.client import AgentAuth, RemoteNode
from hangdoc.fleet.coordinator import find_ranks
from hangdoc.fleet.v1 import agent_pb2 as pb

TOKEN = "0123456789abcdef0123456789abcdef"
SNAPSHOT = REPO / "tests" / "snapshots" / "mismatch_uneven_shards_eval_gather.json.gz"
N = 3  # fan-out 2: groups {0,1} {2}; node 0 relays for node 1
CONNECT = 1.5

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture
def agents(tmp_path: object) -> Iterator[list[Agent]]:
    token = tmp_path / "token"  # type: ignore[operator]
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    running: list[Agent] = []
    try:
        for k in range(N):
            args = ["--listen", "127.0.0.1:0", "--token-file", str(token), "--replay", str(SNAPSHOT)]
            args += ["--node-name", f"node{k}", "--replay-rank-offset", str(3 * k), "--replay-world-size", str(3 * N)]
            running.append(start_agent(tmp_path, *args))
        yield sorted(running, key=lambda a: a.address)
    finally:
        for agent in running:
            os.kill(agent.proc.pid, signal.SIGCONT)
            agent.close()


def test_a_stopped_leaf_is_unreachable_after_the_connect_timeout(
    agents: list[Agent], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tree, "TREE_AT", 1)
    monkeypatch.setattr(tree, "FANOUT", 2)
    asked: list[str] = []
    relay_call = tree.relay_call
    monkeypatch.setattr(tree, "relay_call", lambda nodes, *a: asked.append(a[0]) or relay_call(nodes, *a))
    stopped = agents[1]  # a leaf under the relay agents[0]
    os.kill(stopped.proc.pid, signal.SIGSTOP)
    nodes = [RemoteNode(a.address, AgentAuth(token=TOKEN), connect_timeout=CONNECT) for a in agents]
    try:
        t0 = time.monotonic()
        fleet = find_ranks(nodes, parse_job_spec("127.0.0.1:29500"), deadline=30.0)
        took = time.monotonic() - t0
    finally:
        for node in nodes:
            node.close()
    assert asked == ["FindRanks"]  # one pass: no GetInfo
    assert [(u.target, u.reason) for u in fleet.unreachable] == [
        (stopped.address, f"agent {stopped.address} did not answer within {CONNECT:.1f} s")
    ]
    assert len(fleet.placed) == 3 * (N - 1)
    assert took < CONNECT + 5  # FindRanks' own deadline is CONNECT + 10


def test_a_relay_waits_through_a_failed_connection_attempt(
    agents: list[Agent], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leaf whose agent answers too late for one connection attempt (its node busy: at
    12,500 agents on 2 cores, "Did not receive HTTP/2 settings before handshake timeout") is
    still asked, within the connect timeout."""
    from hangdoc.fleet import client, wire
    from hangdoc.fleet.agent import AgentConfig, serve_in_thread

    # the relay's connection attempts give up after 0.3 s instead of gRPC's 20 s
    monkeypatch.setattr(client, "_CHANNEL_OPTIONS", [*client._CHANNEL_OPTIONS, ("grpc.min_reconnect_backoff_ms", 300)])
    relay = serve_in_thread(AgentConfig(listen="127.0.0.1:0", token=TOKEN, replay=str(SNAPSHOT)))
    leaf = agents[1]
    node = RemoteNode(f"127.0.0.1:{relay.port}", AgentAuth(token=TOKEN))
    os.kill(leaf.proc.pid, signal.SIGSTOP)
    resume = threading.Timer(1.5, os.kill, (leaf.proc.pid, signal.SIGCONT))
    resume.start()
    try:
        target = wire.RelayTarget(
            leaf.address, pb.FindRanksRequest(job="127.0.0.1:29500").SerializeToString(), 10.0, connect=5.0
        )
        answers = wire.relay_answers(
            node.relay(wire.relay_request("FindRanks", [target], 12.0), 12.0, node.auth.metadata)
        )
    finally:
        resume.join()
        node.close()
        relay.stop()
    got = answers[leaf.address]
    assert isinstance(got, bytes), got
    assert len(pb.Discovery.FromString(got).ranks) == 3
