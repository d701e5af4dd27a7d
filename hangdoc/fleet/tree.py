"""The relay tree (docs/scale.md): above ``TREE_AT`` agents the coordinator asks at most
``FANOUT`` of them, which ask the others for it, one level per power of ``FANOUT``.

The tree is built from the agents called (sorted by name, cut into groups of ``FANOUT``,
the first of each group relaying for it; the same again one level up) each time
``coordinator.fan_out`` calls them, so ``find_ranks``, every sample round, and every other
per-node call of a diagnosis (source lines, probes, GPUs, waits) go through it unchanged:
the same ``RemoteNode`` methods run, their RPCs answered by a ``Batch`` (``client.Plan``)
that makes them all through the relays at once and hands each call its own node's answer.

A relay that fails makes every node of its subtree unreachable, with the reason
``relay HOST: ...`` (never a missing rank), and is not asked to relay again in that
diagnosis: its group is then called by the level above.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf.message import Message

from ..errors import HangdocError
from . import wire
from .client import AgentAuth, AgentError, Planned, RemoteNode, planning, rebuilt_error
from .node import Node
from .wire import RelayFailed, RelayTarget

FANOUT = 64  # calls one caller makes at once, at every level: 64 x 64 = 4,096 nodes a level of relays
# Agents above which the coordinator goes through relays. Measured (bench/bench_fanout.py
# --sizes 256,500,1000,2000 --per-process 250 --repeat 3 --tree: replaying agents and their
# relays on this 2-core machine, load 10 falling; docs/benchmarks.md), flat / tree:
#   agents  find_ranks (s)  one round (s)  observe() (s)  coordinator CPU a round (s)
#      256     0.39 / 0.50    0.17 / 0.18    2.54 / 2.55    0.11 / 0.02
#      500     0.79 / 0.78    0.39 / 0.34    2.99 / 2.85    0.29 / 0.07
#    1,000     1.53 / 1.57    0.68 / 0.62    4.09 / 3.22    0.53 / 0.13
#    2,000     3.13 / 2.52    1.47 / 1.32    5.90 / 4.81    1.08 / 0.26
# Below ~500 the relays' extra hop costs more than the flat waves; from 500 on the tree is as
# fast or faster even here, where the relays share the coordinator's cores.
TREE_AT = 400
RELAY_SLACK = 1.0  # seconds a relay keeps for itself beyond its children's deadline
# What an agent receives in one message: gRPC's default, which agents keep (no
# grpc.max_receive_message_length in limits.server_options: an unauthenticated caller's
# message is read before it is refused), less room for framing. A relay request carries
# each leaf's own request: 4,096 Sample requests of 3 ranks (bench_fanout) are 4.2 MB, so
# above 64 x 64 nodes the coordinator asks the leaf relays of such a subtree itself.
MAX_RELAY_REQUEST = 4 * 1024 * 1024 - 64 * 1024
MAX_PASSES = 4  # calls one fan-out's call may make in sequence (GetInfo, then FindRanks)
T = TypeVar("T")
Result = tuple[Node, T | None, BaseException | None]
FlatFanOut = Callable[[Sequence[Node], Callable[[Node], object], float | None], list[Result[object]]]


@dataclass(frozen=True)
class Subtree:
    """A relay and the nodes it asks: agents, or relays of their own subtrees."""

    relay: RemoteNode
    children: tuple[RemoteNode | Subtree, ...]

    @property
    def leaves(self) -> Iterator[RemoteNode]:
        for child in self.children:
            if isinstance(child, Subtree):
                yield from child.leaves
            else:
                yield child

    @property
    def height(self) -> int:
        return 1 + max((c.height for c in self.children if isinstance(c, Subtree)), default=0)


def build_tree(nodes: Sequence[RemoteNode], fanout: int | None = None) -> list[RemoteNode | Subtree]:
    """What the coordinator asks: at most ``fanout`` relays (or the nodes themselves, when
    there are no more). A group whose every node failed as a relay is asked directly."""
    fanout = fanout or FANOUT
    ordered = sorted(nodes, key=lambda n: n.name)
    level: list[RemoteNode | Subtree] = list(ordered)
    while len(level) > fanout:
        grouped: list[RemoteNode | Subtree] = []
        for first in range(0, len(level), fanout):
            group = level[first : first + fanout]
            relay = next((r for c in group if not (r := _first_leaf(c)).relay_failed), None)
            if relay is None or len(group) == 1:
                grouped += group
            else:
                grouped.append(Subtree(relay, tuple(group)))
        if len(grouped) == len(level):
            break  # no relay left to ask: a flat fan-out
        level = grouped
    return level


def _first_leaf(node: RemoteNode | Subtree) -> RemoteNode:
    return node.relay if isinstance(node, Subtree) else node


def uses_tree(nodes: Sequence[Node]) -> bool:
    """Whether a fan-out over ``nodes`` goes through relays: more than ``TREE_AT`` agents,
    asked as the operator (the token or a client certificate), the only caller a relay
    serves; any other caller asks every agent itself, as each of them would answer it."""
    return len(nodes) > TREE_AT and all(isinstance(n, RemoteNode) and _operator(n.auth) for n in nodes)


def _operator(auth: AgentAuth) -> bool:
    return bool(auth.token or auth.tls_cert)


def tree_fan_out(
    nodes: Sequence[Node], call: Callable[[Node], T], deadline: float | None, flat: FlatFanOut
) -> list[Result[T]]:
    """``coordinator.fan_out`` through relays: ``call(node)`` runs for every node in this
    thread, its RPCs put aside (``Planned``), made through the tree, then ``call`` runs
    again with their answers; a call that makes a second RPC gets another pass."""
    batch = Batch()
    results: dict[int, Result[T]] = {}
    todo = list(nodes)
    for _ in range(MAX_PASSES):
        waiting = []
        for node in todo:
            batch.node_calls = {}
            try:
                with planning(batch):
                    results[id(node)] = (node, call(node), None)
            except Planned:
                waiting.append(node)
            except Exception as exc:  # noqa: BLE001 - a node's failure is its result, as in fan_out
                results[id(node)] = (node, None, exc)
        if not waiting:
            break
        batch.send([n for n in waiting if isinstance(n, RemoteNode)], deadline, flat)
        todo = waiting
    for node in todo:
        results.setdefault(id(node), (node, None, AgentError(f"agent {node.name}: more than {MAX_PASSES} calls")))
    return [results[id(n)] for n in nodes]


Answer = bytes | wire.NodeSamples | HangdocError


class Batch:
    """The answers of the calls put aside so far, by node and by call, and the calls
    waiting for the next pass (``client.Plan``)."""

    def __init__(self) -> None:
        self.answers: dict[tuple[int, str, int], Answer] = {}
        self.sent: dict[tuple[int, str], int] = {}  # calls of each node's method answered so far
        self.planned: dict[int, tuple[str, Message, float]] = {}
        self.node_calls: dict[str, int] = {}  # the running call's RPCs so far, by method

    def answer(self, node: RemoteNode, method: str, request: Message, timeout: float) -> object:
        nth = self.node_calls[method] = self.node_calls.get(method, 0) + 1
        got = self.answers.get((id(node), method, nth))
        if got is None:
            self.planned[id(node)] = (method, request, timeout)
            raise Planned
        if isinstance(got, HangdocError):
            raise got
        return got

    def send(self, nodes: Sequence[RemoteNode], deadline: float | None, flat: FlatFanOut) -> None:
        """The calls put aside, through the tree: one tree call per method."""
        by_method: dict[str, list[RemoteNode]] = {}
        for node in nodes:
            by_method.setdefault(self.planned[id(node)][0], []).append(node)
        for method, asked in by_method.items():
            got = relay_call(asked, method, {n.name: self.planned[id(n)] for n in asked}, deadline, flat)
            for node in asked:
                nth = self.sent[(id(node), method)] = self.sent.get((id(node), method), 0) + 1
                self.answers[(id(node), method, nth)] = got[node.name]
        self.planned.clear()


def relay_call(
    nodes: Sequence[RemoteNode],
    method: str,
    requests: Mapping[str, tuple[str, Message, float]],
    deadline: float | None,
    flat: FlatFanOut,
) -> dict[str, Answer]:
    """``method`` of every node, each with its own request and timeout, through the tree:
    each node's answer (serialized, or merged samples) or error, by name."""
    top = build_tree(nodes)
    height = max((t.height for t in top if isinstance(t, Subtree)), default=0)
    own = deadline if deadline is not None else max(timeout for _, _, timeout in requests.values())
    budget = own + height * RELAY_SLACK
    encoded = {name: (req.SerializeToString(), timeout) for name, (_, req, timeout) in requests.items()}
    sent: dict[int, bytes] = {}  # each relay's request, by id of the relay
    top = fitting(top, method, encoded, budget, sent)

    roles = {id(_first_leaf(t)): t for t in top}

    def ask(entry: Node) -> bytes:
        role = roles[id(entry)]
        if isinstance(role, RemoteNode):
            body, timeout = encoded[role.name]
            return role.forward(method, body, timeout, role.auth.metadata)
        return role.relay.relay(sent[id(role.relay)], budget, role.relay.auth.metadata)

    out: dict[str, Answer] = {}
    for entry, raw, exc in each_answer(flat, [_first_leaf(t) for t in top], ask, budget + RELAY_SLACK / 2):
        role = roles[id(entry)]
        if isinstance(role, RemoteNode):
            out[role.name] = raw if isinstance(raw, bytes) else _error(exc, role.name)
        elif isinstance(raw, bytes):
            out.update(read_response(raw, role))
        else:
            role.relay.relay_failed = True
            failure = _error(exc, entry.name)
            for leaf in role.leaves:
                out[leaf.name] = AgentError(f"relay {role.relay.name}: {failure}", help=failure.help)
    return out


def fitting(
    top: Sequence[RemoteNode | Subtree],
    method: str,
    encoded: Mapping[str, tuple[bytes, float]],
    budget: float,
    sent: dict[int, bytes],
) -> list[RemoteNode | Subtree]:
    """``top`` with every subtree whose relay request would be larger than an agent
    receives (``MAX_RELAY_REQUEST``) replaced by its children, asked by the coordinator
    itself; each relay's request, encoded, in ``sent``."""
    out: list[RemoteNode | Subtree] = []
    for entry in top:
        if isinstance(entry, Subtree):
            request = wire.relay_request(method, _children(entry, encoded), budget)
            if len(request) > MAX_RELAY_REQUEST and entry.height > 1:
                out += fitting(entry.children, method, encoded, budget, sent)
                continue
            sent[id(entry.relay)] = request
        out.append(entry)
    return out


def each_answer(
    flat: FlatFanOut, nodes: Sequence[Node], ask: Callable[[Node], bytes], deadline: float
) -> list[Result[object]]:
    """``flat(nodes, ask, deadline)``, whose one-node case hands its error back too."""
    if len(nodes) != 1:
        return flat(nodes, ask, deadline)
    try:
        return [(nodes[0], ask(nodes[0]), None)]
    except Exception as exc:  # noqa: BLE001 - that node's answer
        return [(nodes[0], None, exc)]


def _children(tree: Subtree, encoded: Mapping[str, tuple[bytes, float]]) -> list[RelayTarget]:
    out = []
    for child in tree.children:
        if isinstance(child, Subtree):
            out.append(RelayTarget(child.relay.name, children=tuple(_children(child, encoded))))
        else:
            body, timeout = encoded[child.name]
            out.append(RelayTarget(child.name, body, timeout, connect=child.connect_timeout))
    return out


def read_response(raw: bytes, tree: Subtree) -> dict[str, Answer]:
    """A relay's answer for every node of its subtree; a node it said nothing of is
    unreachable through it."""
    wanted = {leaf.name: leaf for leaf in tree.leaves}
    out: dict[str, Answer] = {}
    for target, got in wire.relay_answers(raw).items():
        if target not in wanted:
            continue
        if isinstance(got, RelayFailed):
            out[target] = rebuilt_error(got.kind, got.message, got.help)
            if (relay := wanted.get(got.relay)) is not None:
                relay.relay_failed = True  # its group is asked by another from now on
        else:
            out[target] = got
    for name in wanted - out.keys():
        out[name] = AgentError(f"relay {tree.relay.name}: no answer for this node in its reply")
    return out


def _error(exc: BaseException | None, name: str) -> HangdocError:
    if isinstance(exc, HangdocError):
        return exc
    if exc is None:
        return AgentError(f"agent {name} failed")
    return AgentError(f"agent {name}: {type(exc).__name__}: {exc}")
