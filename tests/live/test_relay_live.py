"""The relay tree over real gRPC: five `hangdoc agent --replay` processes, each the node of
three ranks of one 15-rank job, asked through relays (a forced threshold and fan-out 2, so
two levels of relays) and directly; the same diagnosis both ways, a relay that dies is its
subtree's unreachable nodes, and a relay asked without the token refuses."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.agents import REPO, Agent, start_agent

from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.fleet import tree
from hangdoc.fleet.client import AgentAuth, AgentError, RemoteNode
from hangdoc.fleet.coordinator import find_ranks, sample_all
from hangdoc.fleet.v1 import agent_pb2 as pb
from hangdoc.pipeline import CaptureOptions, diagnose

TOKEN = "0123456789abcdef0123456789abcdef"
SNAPSHOT = REPO / "tests" / "snapshots" / "mismatch_uneven_shards_eval_gather.json.gz"
N = 5  # fan-out 2: relay groups {0,1} {2,3} {4}, under one relay of {0,1} and {2,3}
JOB = "127.0.0.1:29500"
OPTIONS = CaptureOptions(window=1.0, interval=0.5)

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Agent]]:
    tmp = tmp_path_factory.mktemp("relay")
    token = tmp / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)

    def start(k: int) -> Agent:
        args = ["--listen", "127.0.0.1:0", "--token-file", str(token), "--replay", str(SNAPSHOT)]
        args += ["--node-name", f"node{k}", "--replay-rank-offset", str(3 * k), "--replay-world-size", str(3 * N)]
        return start_agent(tmp, *args)

    with ThreadPoolExecutor(N) as pool:
        started = [pool.submit(start, k) for k in range(N)]
    running = [f.result() for f in started if f.exception() is None]
    try:
        if len(running) < N:
            raise next(f.exception() for f in started if f.exception() is not None)  # type: ignore[misc]
        yield running  # agent k holds ranks 3k..3k+2
    finally:
        for agent in running:
            agent.close()


@pytest.fixture
def forced_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tree, "TREE_AT", 1)
    monkeypatch.setattr(tree, "FANOUT", 2)


def _nodes(agents: list[Agent]) -> list[RemoteNode]:
    return [RemoteNode(a.address, AgentAuth(token=TOKEN)) for a in agents]


def test_the_same_diagnosis_through_relays_as_flat(agents: list[Agent], monkeypatch: pytest.MonkeyPatch) -> None:
    flat_snapshot, flat = diagnose(JOB, OPTIONS, nodes=_nodes(agents))
    relays: list[str] = []
    relay_call = tree.relay_call
    monkeypatch.setattr(tree, "relay_call", lambda nodes, *a: relays.append(a[0]) or relay_call(nodes, *a))
    monkeypatch.setattr(tree, "TREE_AT", 1)
    monkeypatch.setattr(tree, "FANOUT", 2)
    relayed_snapshot, relayed = diagnose(JOB, OPTIONS, nodes=_nodes(agents))
    assert {"FindRanks", "Sample", "SampleSources"} <= set(relays)
    assert "GetInfo" not in relays  # the FindRanks answer carries it: one pass to find the job
    assert flat.verdict.value == relayed.verdict.value == "collective_mismatch"
    assert flat.culprit_ranks == relayed.culprit_ranks == tuple(3 * k + 2 for k in range(N))
    assert not flat_snapshot.unreachable and not relayed_snapshot.unreachable
    assert [r.process.rank for r in relayed_snapshot.ranks] == list(range(3 * N))
    assert relayed_snapshot.sources == flat_snapshot.sources
    for snapshot in (flat_snapshot, relayed_snapshot):  # each value decoded is one object (memo.share_values)
        threads = [th for r in snapshot.ranks for s in r.samples for th in s.threads if not th.locals]
        assert len({id(th) for th in threads}) == len(set(threads)) < len(threads)
        assert len({id(th.frames) for th in threads}) == len({th.frames for th in threads})
    leaf_log = Path(sorted(agents, key=lambda a: a.address)[1].log.name).read_text()  # under the first relay
    assert "via=operator(token) at relay node" in leaf_log  # the leaf's audit names the relay's caller


def test_a_relay_called_without_the_token_refuses(agents: list[Agent]) -> None:
    node = RemoteNode(agents[0].address, AgentAuth())
    try:
        request = pb.RelayRequest(method="GetInfo", timeout_seconds=5.0)
        request.children.add(address=agents[1].address, request=b"", timeout_seconds=3.0)
        with pytest.raises(AgentError, match="refused the call"):
            node.relay(request.SerializeToString(), 5.0, ())
    finally:
        node.close()


def test_a_dead_relay_is_its_subtrees_unreachable_nodes_then_bypassed(agents: list[Agent], forced_tree: None) -> None:
    fleet = find_ranks(_nodes(agents), parse_job_spec(JOB), deadline=10.0)
    assert len(fleet.placed) == 3 * N and not fleet.unreachable
    ranks = {a.address: tuple(range(3 * k, 3 * k + 3)) for k, a in enumerate(agents)}
    order = sorted(ranks)  # the tree's: groups {0, 1} {2, 3} {4}; order[0] relays for the first two

    def kill(address: str) -> None:
        next(a for a in agents if a.address == address).close()

    def round_(t: float, lost: list[str], via: str | None) -> None:
        taken = sample_all(fleet, t, native=False, timeout=2.0)
        assert {u.target: u.ranks for u in taken.lost} == {a: ranks[a] for a in lost}
        assert all(u.reason.startswith(f"relay {via}: ") == (via is not None) for u in taken.lost)
        assert sorted(taken.samples) == sorted(r for a in order if a not in lost for r in ranks[a])

    kill(order[2])  # a leaf relay, below the top relay: reported by it
    round_(1.0, order[2:4], via=order[2])
    round_(2.0, [order[2]], via=None)  # its group now relayed by order[3]
    kill(order[0])  # the top relay: its whole subtree
    round_(3.0, order[:4], via=order[0])
    round_(4.0, [order[0], order[2]], via=None)
