"""A stopped agent under a relay: through the tree the job is found in one pass (FindRanks
answers carry GetInfo), and a node whose agent is stopped (SIGSTOP: its kernel still
accepts, nothing answers) is unreachable once its connection's wait is over (the
coordinator's connect timeout, ``RelayChild.connect_seconds``), as when GetInfo came first,
not after FindRanks' whole deadline."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
from support.agents import REPO, Agent, start_agent

from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.fleet import tree
from hangdoc.fleet.client import AgentAuth, RemoteNode
from hangdoc.fleet.coordinator import find_ranks

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
