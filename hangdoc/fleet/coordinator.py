"""Fan out to every node of a job: find its ranks, then sample them all in lock-step.

Calls go to all nodes at once, with a bounded number in flight and a deadline each; a node
that fails or does not answer in time comes back as ``Unreachable`` with its reason (in the
``Fleet`` when finding ranks, in the ``Round`` when sampling), and the rest of the job is
still diagnosed. With one ``LocalNode`` (the default) this is the single-machine path, and
its errors pass through unchanged.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ..capture.discover import Discovery
from ..capture.jobspec import JobSpec
from ..errors import HangdocError, JobNotFound
from ..model import RankProcess, Sample, Unreachable
from .node import Node

MAX_IN_FLIGHT = 64
ROUND_SLACK = 1.0  # seconds a node may take beyond its dumps' own timeout (network, queueing)
T = TypeVar("T")


@dataclass(frozen=True)
class Fleet:
    """The job as found across nodes: which node holds which rank process (ranks in order),
    and the nodes that did not answer when it was found."""

    placed: tuple[tuple[Node, RankProcess], ...]
    world_size: int | None
    notes: tuple[str, ...] = ()
    unreachable: tuple[Unreachable, ...] = ()

    @property
    def procs(self) -> list[RankProcess]:
        return [p for _, p in self.placed]

    def by_node(self, only: set[int] | None = None) -> list[tuple[Node, list[int]]]:
        """Each node with the indices into ``placed`` of its ranks (``only`` those), in
        first-seen order."""
        groups: dict[int, tuple[Node, list[int]]] = {}
        for i, (node, _) in enumerate(self.placed):
            if only is None or i in only:
                groups.setdefault(id(node), (node, []))[1].append(i)
        return list(groups.values())


def fan_out(
    nodes: Sequence[Node], call: Callable[[Node], T], deadline: float | None
) -> list[tuple[Node, T | None, BaseException | None]]:
    """``call(node)`` on every node at once; (node, result, None) or (node, None, error)."""
    if not nodes:
        return []
    if len(nodes) == 1:  # no threads for the common single-node case; errors pass through
        return [(nodes[0], call(nodes[0]), None)]
    out: list[tuple[Node, T | None, BaseException | None]] = []
    pool = cf.ThreadPoolExecutor(max_workers=min(MAX_IN_FLIGHT, len(nodes)))
    try:
        futures = {pool.submit(call, node): node for node in nodes}
        _, pending = cf.wait(futures, timeout=deadline)
        for future, node in futures.items():
            if future in pending:
                out.append((node, None, TimeoutError(_missed(future.cancel(), deadline, len(nodes)))))
            elif (exc := future.exception()) is not None:
                out.append((node, None, exc))
            else:
                out.append((node, future.result(), None))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a slow node must not hold the report
    return out


def _missed(queued: bool, deadline: float | None, nodes: int) -> str:
    """Why a node's call missed the fan-out's deadline: it did not answer, or it was never
    asked (it waited its turn behind ``MAX_IN_FLIGHT`` calls: a flat fan-out's limit,
    docs/scale.md), so the node may be fine."""
    if queued:
        return (f"not asked within {deadline:.1f} s: queued behind {MAX_IN_FLIGHT} calls in flight "
                f"to {nodes} nodes (a flat fan-out's limit: docs/scale.md)")
    return f"no answer within {deadline:.1f} s"


def _reason(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, HangdocError) else f"{type(exc).__name__}: {exc}"


def find_ranks(nodes: Sequence[Node], spec: JobSpec, deadline: float | None = None) -> Fleet:
    """Discover the job on every node; raise ``JobNotFound`` only if no node has a rank."""
    results = fan_out(nodes, lambda n: n.find_ranks(spec), deadline)
    placed: list[tuple[Node, RankProcess]] = []
    notes: list[str] = []
    unreachable: list[Unreachable] = []
    worlds: set[int] = set()
    empty: list[str] = []
    for node, found, exc in results:
        if isinstance(found, Discovery):
            placed += [(node, p) for p in found.ranks]
            notes += [f"{node.name}: {n}" if len(nodes) > 1 else n for n in found.notes]
            if found.world_size:
                worlds.add(found.world_size)
        elif isinstance(exc, JobNotFound):
            empty.append(f"{node.name}: {exc}")  # the node answered: none of the job there
        elif exc is not None:
            unreachable.append(Unreachable(node.name, _reason(exc)))
    if not placed:
        detail = "; ".join(empty + [f"{u.target}: {u.reason}" for u in unreachable])
        failures = [exc for _, _, exc in results if exc is not None and not isinstance(exc, JobNotFound)]
        first = failures[0] if failures else None
        if not empty and isinstance(first, HangdocError) and {type(e) for e in failures} == {type(first)}:
            # no node answered, all for the same reason (wrong token, no TLS cert, down):
            # that reason and its help, not "job not found"
            raise type(first)(f"no agent answered for {spec}: {detail}", help=first.help)
        raise JobNotFound(f"no node has a rank of {spec}: {detail}",
                          unreachable=tuple(f"{u.target}: {u.reason}" for u in unreachable))
    notes += [f"{e} (no rank there)" for e in empty]
    placed.sort(key=lambda np: (np[1].rank is None, np[1].rank if np[1].rank is not None else 0))
    return Fleet(tuple(placed), max(worlds) if worlds else None, tuple(notes), tuple(unreachable))


@dataclass(frozen=True, slots=True)
class Round:
    """What one lock-step round found: the samples taken, keyed by the index in
    ``fleet.placed``, and the nodes that failed it (each with the ranks it holds and why),
    in the order their answers were read."""

    samples: Mapping[int, Sample]
    lost: tuple[Unreachable, ...] = ()


def sample_all(
    fleet: Fleet, t: float, *, native: bool, timeout: float, only: set[int] | None = None
) -> Round:
    """One lock-step round over every node; ``fleet`` is left as it is.

    ``only`` restricts the round to those indices (ranks still alive, or ranks to deepen).
    A node that fails this round gets no samples and is in the round's ``lost``; keeping
    track of lost nodes across rounds is the caller's.
    """
    groups = fleet.by_node(only)
    nodes = [node for node, _ in groups]
    indices = {id(node): idx for node, idx in groups}

    def call(node: Node) -> list[Sample]:
        return node.sample([fleet.placed[i][1] for i in indices[id(node)]], t, native=native, timeout=timeout)

    samples: dict[int, Sample] = {}
    lost: list[Unreachable] = []
    for node, taken, exc in fan_out(nodes, call, timeout + ROUND_SLACK if len(nodes) > 1 else None):
        idx = indices[id(node)]
        if taken is None:
            ranks = tuple(r for i in idx if (r := fleet.placed[i][1].rank) is not None)
            lost.append(Unreachable(node.name, _reason(exc) if exc is not None else "failed", ranks))
            continue
        samples.update(zip(idx, taken))
    return Round(samples, tuple(lost))
