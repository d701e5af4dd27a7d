"""The relay tree's parts (docs/scale.md): how the coordinator cuts the agents into relay
groups, when it uses them, how a leaf relay merges its children's samples, how a relay's
answer becomes each node's answer or error, and what a relay refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.factories import make_snapshot

from hangdoc.bundle import save_snapshot
from hangdoc.errors import JobNotFound, PermissionDenied, UsageError
from hangdoc.fleet import tree, wire
from hangdoc.fleet.agent import AgentConfig, _check_relay, serve_in_thread
from hangdoc.fleet.client import AgentAuth, AgentError, RemoteNode
from hangdoc.fleet.tree import Subtree, build_tree, read_response, uses_tree
from hangdoc.fleet.v1 import agent_pb2 as pb
from hangdoc.model import Sample

pytestmark = [pytest.mark.timeout(60)]
OPERATOR = AgentAuth(token="t" * 32)


@pytest.fixture
def nodes() -> list[RemoteNode]:
    made = [RemoteNode(f"10.0.{k // 100}.{k % 100}:7420", OPERATOR) for k in range(22)]
    yield made
    for node in made:
        node.close()


def _shape(entry: RemoteNode | Subtree) -> object:
    return (entry.relay.name, [_shape(c) for c in entry.children]) if isinstance(entry, Subtree) else entry.name


def test_groups_of_fanout_sorted_by_name_first_of_each_relays(nodes: list[RemoteNode]) -> None:
    top = build_tree(list(reversed(nodes)), fanout=4)
    names = sorted(n.name for n in nodes)
    assert len(top) <= 4
    leaves = [leaf.name for t in top for leaf in (t.leaves if isinstance(t, Subtree) else [t])]
    assert leaves == names  # every node once, in name order
    first = top[0]
    assert isinstance(first, Subtree) and first.height == 2
    assert _shape(first)[1][0] == (names[0], names[0:4])  # type: ignore[index]
    assert first.relay.name == names[0]
    assert [len(t.children) for t in top if isinstance(t, Subtree)] == [4, 2]  # 22 = 16 + 6
    assert build_tree(nodes[:4], fanout=4) == sorted(nodes[:4], key=lambda n: n.name)  # no relay needed


def test_a_failed_relay_is_not_chosen_again(nodes: list[RemoteNode]) -> None:
    ordered = sorted(nodes, key=lambda n: n.name)
    ordered[0].relay_failed = True
    top = build_tree(nodes, fanout=4)
    first = top[0]
    assert isinstance(first, Subtree) and first.relay is ordered[1]
    assert ordered[0] in first.leaves  # still asked, as a node


def test_tree_used_only_above_the_threshold(monkeypatch: pytest.MonkeyPatch, nodes: list[RemoteNode]) -> None:
    monkeypatch.setattr(tree, "TREE_AT", 21)
    assert not uses_tree(nodes[:21])
    assert uses_tree(nodes[:22])
    assert not uses_tree([*nodes[:21], object()])  # type: ignore[list-item]  # a local node: flat


def test_no_tree_for_a_caller_a_relay_would_refuse() -> None:
    # without the token or a client certificate every relay refuses (operators only): the
    # caller asks each agent itself, as each would answer it
    bare = [RemoteNode(f"10.2.0.{k}:7420") for k in range(tree.TREE_AT + 1)]
    certified = [RemoteNode(f"10.3.0.{k}:7420", AgentAuth(tls_cert="c.pem")) for k in range(tree.TREE_AT + 1)]
    try:
        assert not uses_tree(bare)
        assert uses_tree(certified)
    finally:
        for node in (*bare, *certified):
            node.close()


def test_default_threshold_both_sides() -> None:
    made = [RemoteNode(f"10.1.{k // 200}.{k % 200}:7420", OPERATOR) for k in range(tree.TREE_AT + 1)]
    try:
        assert not uses_tree(made[:-1]) and uses_tree(made)
    finally:
        for node in made:
            node.close()


def _response(stacks: dict[int, list[str]], pid0: int) -> pb.SampleResponse:
    snap = make_snapshot(stacks)
    return wire.samples_to_proto([(pid0 + i, r.samples[0]) for i, r in enumerate(snap.ranks)])


def test_leaf_relay_interns_frames_and_stacks_once_for_all_children() -> None:
    same = {r: ["train.py:main:10", "dist.py:all_reduce:5"] for r in range(3)}
    one, two = _response(same, 100), _response({0: ["train.py:main:10", "dist.py:barrier:9"]}, 200)
    expected = {"a:1": wire.samples_from_proto(one), "b:1": wire.samples_from_proto(two)}
    merger = wire.TableMerger()
    merger.add("a:1", pb.SampleResponse.FromString(one.SerializeToString()))
    merger.add("b:1", pb.SampleResponse.FromString(two.SerializeToString()))
    table = merger.table
    assert len(table.frames) == 3 and len(table.stacks) == 2  # main, all_reduce, barrier
    got = {target: wire.samples_from_proto(samples) for target, samples in wire.tabled_samples(table).items()}
    assert got == expected


def test_a_child_answer_pointing_outside_its_tables_is_refused() -> None:
    bad = _response({0: ["train.py:main:10"]}, 1)
    bad.samples[0].sample.threads[0].stack = 7
    merger = wire.TableMerger()
    with pytest.raises(wire.AgentApiError):
        merger.add("a:1", bad)
    assert not merger.table.nodes


def test_relay_answer_gives_each_node_its_answer_or_its_error(nodes: list[RemoteNode]) -> None:
    sub = Subtree(nodes[0], tuple(nodes[:4]))
    response = pb.RelayResponse()
    response.answers.add(target=nodes[0].name, response=b"\x08\x01")
    response.answers.add(
        target=nodes[1].name, failure=pb.RelayFailure(message="no rank", kind="JobNotFound", help="look")
    )
    response.answers.add(
        target=nodes[2].name,
        failure=pb.RelayFailure(message="relay x: down", kind="NoSuchKind", help="", relay=nodes[2].name),
    )
    got = read_response(response.SerializeToString(), sub)
    assert got[nodes[0].name] == b"\x08\x01"
    assert isinstance(got[nodes[1].name], JobNotFound) and got[nodes[1].name].help == "look"  # type: ignore[union-attr]
    assert type(got[nodes[2].name]) is AgentError and str(got[nodes[2].name]) == "relay x: down"
    assert nodes[2].relay_failed and not nodes[1].relay_failed  # a failed sub-relay is not asked again
    missing = got[nodes[3].name]
    assert isinstance(missing, AgentError) and f"relay {nodes[0].name}" in str(missing)


def test_relay_requests_are_bounded() -> None:
    many = pb.RelayRequest(method="Sample", timeout_seconds=6.0)
    for k in range(65):
        many.children.add(address=f"h{k}:1")
    with pytest.raises(UsageError, match="at most 64"):
        _check_relay(many)
    with pytest.raises(UsageError, match="forwards"):
        _check_relay(pb.RelayRequest(method="Jobs", timeout_seconds=6.0))
    with pytest.raises(UsageError, match="timeout_seconds"):
        _check_relay(pb.RelayRequest(method="Sample", timeout_seconds=float("nan")))
    with pytest.raises(UsageError, match="child's timeout_seconds"):
        _check_relay(pb.RelayRequest(method="Sample", timeout_seconds=6.0, children=[pb.RelayChild(address="h:1")]))
    deep = pb.RelayRequest(method="Sample", timeout_seconds=6.0)
    level = deep.children.add(address="h:1")
    for _ in range(4):
        level = level.children.add(address="h:1")
    with pytest.raises(UsageError, match="deeper"):
        _check_relay(deep)


def test_a_tokenless_local_caller_is_refused_with_help(tmp_path: Path) -> None:
    saved = tmp_path / "snap.json"
    save_snapshot(make_snapshot({0: ["train.py:main:10"]}), saved)
    agent = serve_in_thread(AgentConfig(listen="127.0.0.1:0", replay=str(saved)))
    node = RemoteNode(f"127.0.0.1:{agent.port}", AgentAuth())
    try:
        request = pb.RelayRequest(method="GetInfo", timeout_seconds=5.0)
        request.children.add(address=node.name, request=b"", timeout_seconds=3.0)
        with pytest.raises(PermissionDenied, match="only the operator") as refused:
            node.relay(request.SerializeToString(), 5.0, ())
        assert "call that node's agent directly" in refused.value.help
    finally:
        node.close()
        agent.stop()


def test_samples_decode_alike_from_a_table_and_from_one_answer() -> None:
    one = _response({0: ["a.py:f:1", "b.py:g:2"], 1: ["a.py:f:1"]}, 10)
    merger = wire.TableMerger()
    merger.add("n:1", pb.SampleResponse.FromString(one.SerializeToString()))
    (samples,) = wire.tabled_samples(merger.table).values()
    decoded: dict[int, Sample] = wire.samples_from_proto(samples)
    assert decoded == wire.samples_from_proto(one)


def test_a_subtree_whose_request_an_agent_would_refuse_is_asked_by_its_leaf_relays(
    monkeypatch: pytest.MonkeyPatch, nodes: list[RemoteNode]
) -> None:
    monkeypatch.setattr(tree, "FANOUT", 4)
    encoded = {n.name: (b"x" * 100, 5.0) for n in nodes}
    top = build_tree(nodes)
    assert [t.height for t in top if isinstance(t, Subtree)] == [2, 2]
    sent: dict[int, bytes] = {}
    assert tree.fitting(top, "Sample", encoded, 7.0, sent) == top  # 22 requests of 100 bytes fit
    big, small = (len(sent[id(t.relay)]) for t in top)  # type: ignore[union-attr]
    monkeypatch.setattr(tree, "MAX_RELAY_REQUEST", big - 1)
    sent.clear()
    split = tree.fitting(top, "Sample", encoded, 7.0, sent)
    assert [t.height for t in split] == [1, 1, 1, 1, 2]  # type: ignore[union-attr]  # 16 nodes in groups of 4
    monkeypatch.setattr(tree, "MAX_RELAY_REQUEST", small - 1)
    sent.clear()
    split = tree.fitting(top, "Sample", encoded, 7.0, sent)
    assert [t.height for t in split] == [1] * 6  # type: ignore[union-attr]  # 22 nodes in groups of 4
    assert [leaf.name for t in split for leaf in t.leaves] == sorted(n.name for n in nodes)  # type: ignore[union-attr]
    assert set(sent) == {id(t.relay) for t in split}  # type: ignore[union-attr]
