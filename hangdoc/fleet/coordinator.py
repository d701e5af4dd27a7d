"""Fan out to every node of a job: find its ranks, then sample them all in lock-step.

Calls go to all nodes at once, with a bounded number in flight and a deadline each; a node
that fails or does not answer in time comes back as ``Unreachable`` with its reason (in the
``Fleet`` when finding ranks, in the ``Round`` when sampling), and the rest of the job is
still diagnosed. With one ``LocalNode`` (the default) this is the single-machine path, and
its errors pass through unchanged. A call about each node's ranks (their probes, GPUs,
heartbeats) goes through ``fan_out_pids``, which hands every node's failure back as a value.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextvars
import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..capture.find.discover import Discovery
from ..capture.find.jobspec import JobKind, JobSpec, parse_job_spec
from ..capture.find.jobsplit import MultipleJobs, rendezvous_key
from ..capture.find.wholejob import Elsewhere, elsewhere_note
from ..errors import HangdocError, JobNotFound
from ..model import Note, NoteKind, RankProcess, Sample, Unreachable, counted
from .node import LocalNode, Node

MAX_IN_FLIGHT = 64
ROUND_SLACK = 1.0  # seconds a node may take beyond its dumps' own timeout (network, queueing)
T = TypeVar("T")


@dataclass(frozen=True)
class Fleet:
    """The job as found across nodes: which node holds which rank process (ranks in order),
    and the nodes that did not answer when it was found."""

    placed: tuple[tuple[Node, RankProcess], ...]
    world_size: int | None
    notes: tuple[Note, ...] = ()
    unreachable: tuple[Unreachable, ...] = ()
    # every node that answered, those without ranks too (a server's node): where a wait
    # that leaves a rank's node may lead
    answered: tuple[Node, ...] = ()

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
    """``call(node)`` on every node at once; (node, result, None) or (node, None, error).
    Above ``tree.TREE_AT`` agents the calls go through relays (``fleet.tree``), each
    level's deadline one ``RELAY_SLACK`` beyond the one below."""
    if len(nodes) > 1:
        from . import tree  # the agents' client: not loaded for a single machine

        if tree.uses_tree(nodes):
            return tree.tree_fan_out(nodes, call, deadline, flat_fan_out)
    return flat_fan_out(nodes, call, deadline)


def flat_fan_out(
    nodes: Sequence[Node], call: Callable[[Node], T], deadline: float | None
) -> list[tuple[Node, T | None, BaseException | None]]:
    """``fan_out`` with every call made from here, ``MAX_IN_FLIGHT`` at once (what a relay
    does for its children)."""
    if not nodes:
        return []
    if len(nodes) == 1:  # no threads for the common single-node case; errors pass through
        return [(nodes[0], call(nodes[0]), None)]
    out: list[tuple[Node, T | None, BaseException | None]] = []
    pool = cf.ThreadPoolExecutor(max_workers=min(MAX_IN_FLIGHT, len(nodes)))
    try:
        # each call in a copy of this context: a capture's shared values (``memo.share_values``)
        futures = {pool.submit(contextvars.copy_context().run, call, node): node for node in nodes}
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
        return (
            f"not asked within {deadline:.1f} s: queued behind {MAX_IN_FLIGHT} calls in flight "
            f"to {nodes} nodes (a flat fan-out's limit: docs/scale.md)"
        )
    return f"no answer within {deadline:.1f} s"


@dataclass(frozen=True, slots=True)
class NodeAnswer(Generic[T]):
    """One node's answer to a call about its ranks (``fan_out_pids``): what the call
    returned, or the exception it raised (``error``), or why no answer came (``missed``:
    the fan-out's deadline passed)."""

    node: Node
    ranks: Mapping[int, int]  # the pids asked, each with its index into ``Fleet.placed``
    value: T | None = None
    error: Exception | None = None
    missed: BaseException | None = None


def fan_out_pids(
    fleet: Fleet,
    call: Callable[[Node, list[int]], T],
    deadline: float | None,
    *,
    only: Collection[int] | None = None,
    skip: Collection[str] = (),
) -> list[NodeAnswer[T]]:
    """``call(node, pids)`` on every node holding ranks of ``fleet`` (``only`` those indices
    into ``placed``; no node named in ``skip``), at once, with the pids of its ranks; every
    node's answer, a failure included, in first-seen order."""
    groups = {
        id(node): (node, idx)
        for node, idx in fleet.by_node(None if only is None else set(only))
        if node.name not in skip
    }

    def ask(node: Node) -> tuple[T | None, Exception | None]:
        try:
            return call(node, [fleet.placed[i][1].pid for i in groups[id(node)][1]]), None
        except Exception as exc:  # noqa: BLE001 - a node's failure is its answer, for the caller to weigh
            return None, exc

    out: list[NodeAnswer[T]] = []
    for node, got, missed in fan_out([node for node, _ in groups.values()], ask, deadline):
        value, error = got if got is not None else (None, None)
        ranks = {fleet.placed[i][1].pid: i for i in groups[id(node)][1]}
        out.append(NodeAnswer(node, ranks, value, error, missed))
    return out


def _reason(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, HangdocError) else f"{type(exc).__name__}: {exc}"


def find_ranks(nodes: Sequence[Node], spec: JobSpec, deadline: float | None = None) -> Fleet:
    """Discover the job on every node; raise ``JobNotFound`` only if no node has a rank.

    A ``pid:`` names a process of one node: the same number on another node is some other
    process. So with several nodes, the pid is looked up everywhere, the node that holds it
    names the job (its ranks' rendezvous: ``MASTER_ADDR:MASTER_PORT`` or the Slurm step), and
    the other nodes are asked for that job, never for the pid."""
    if spec.kind is JobKind.PID and len(nodes) > 1:
        return _find_by_pid(nodes, spec, deadline)
    return _assemble(nodes, spec, fan_out(nodes, lambda n: n.find_ranks(spec), deadline))


def _find_by_pid(nodes: Sequence[Node], spec: JobSpec, deadline: float | None) -> Fleet:
    first = fan_out(nodes, lambda n: n.find_ranks(spec), deadline)
    holders = [(node, found) for node, found, _ in first if isinstance(found, Discovery)]
    if not holders:
        return _assemble(nodes, spec, first)
    specs = {node.name: _job_of(found) for node, found in holders}
    named = set(specs.values())
    if len(holders) > 1 and (len(named) > 1 or None in named):
        listed = "; ".join(
            f"{name}: {job or 'a job with no rendezvous to name it by'}" for name, job in sorted(specs.items())
        )
        raise MultipleJobs(
            f"{spec} names rank processes on {len(holders)} nodes ({listed}): a pid is one node's number",
            tuple(sorted(j for j in named if j)),
            help="Name the job by its rendezvous (HOST:PORT or slurm:JOBID), or ask only the node that holds the pid.",
        )
    held = {node.name for node, _ in holders}
    others = [n for n in nodes if n.name not in held]
    kept = [(node, found, exc) for node, found, exc in first if node.name in held]
    job = next(iter(named))
    anchor = ", ".join(sorted(held))
    if job is None:
        note = (
            f"{spec} is on {anchor}; its ranks show no rendezvous (MASTER_ADDR/MASTER_PORT, "
            f"a Slurm step) to ask the other {counted(len(others), 'node')} for: they were not asked"
        )
        rest: list[tuple[Node, Discovery | None, BaseException | None]] = []
    else:
        job_spec = parse_job_spec(job)
        note = f"{spec} is on {anchor}, a rank of {job}; the other nodes were asked for {job}"
        rest = _fan_out_caught(others, lambda n: n.find_ranks(job_spec), deadline)
    fleet = _assemble(nodes, spec, kept + rest)
    return dataclasses.replace(fleet, notes=(Note(note), *fleet.notes))


def _job_of(found: Discovery) -> str | None:
    """The spec of the rendezvous the ranks found share, or None."""
    keys = {rendezvous_key(dict(p.env)) for p in found.ranks}
    specs = {k.spec() if k is not None else None for k in keys}
    return specs.pop() if len(specs) == 1 else None


def _fan_out_caught(
    nodes: Sequence[Node], call: Callable[[Node], T], deadline: float | None
) -> list[tuple[Node, T | None, BaseException | None]]:
    """``fan_out`` whose single-node case also hands errors back instead of raising them."""
    if len(nodes) != 1:
        return fan_out(nodes, call, deadline)
    try:
        return [(nodes[0], call(nodes[0]), None)]
    except Exception as exc:  # noqa: BLE001 - reported as that node's answer
        return [(nodes[0], None, exc)]


def _assemble(
    nodes: Sequence[Node], spec: JobSpec, results: list[tuple[Node, Discovery | None, BaseException | None]]
) -> Fleet:
    placed: list[tuple[Node, RankProcess]] = []
    notes: list[Note] = []
    unreachable: list[Unreachable] = []
    worlds: set[int] = set()
    empty: list[tuple[str, JobNotFound]] = []
    elsewhere: list[Elsewhere] = []
    for node, found, exc in results:
        if isinstance(found, Discovery):
            placed += [(node, p) for p in found.ranks]
            notes += [dataclasses.replace(n, node=node.name) if len(nodes) > 1 else n for n in found.notes]
            if found.world_size:
                worlds.add(found.world_size)
            if found.elsewhere is not None:
                elsewhere.append(found.elsewhere)
        elif isinstance(exc, JobNotFound):
            empty.append((node.name, exc))  # the node answered: none of the job there
        elif exc is not None:
            unreachable.append(Unreachable(node.name, _reason(exc)))
    if not placed:
        detail = "; ".join([f"{name}: {exc}" for name, exc in empty] + [f"{u.target}: {u.reason}" for u in unreachable])
        failures = [exc for _, _, exc in results if exc is not None and not isinstance(exc, JobNotFound)]
        first = failures[0] if failures else None
        if not empty and isinstance(first, HangdocError) and {type(e) for e in failures} == {type(first)}:
            # no node answered, all for the same reason (wrong token, no TLS cert, down):
            # that reason and its help, not "job not found"
            raise type(first)(f"no agent answered for {spec}: {detail}", help=first.help)
        raise JobNotFound(
            f"no node has a rank of {spec}: {detail}", unreachable=tuple(f"{u.target}: {u.reason}" for u in unreachable)
        )
    notes += [Note(f"{exc} (no rank there)", NoteKind.NO_RANK_THERE, node=name) for name, exc in empty]
    placed.sort(key=lambda np: (np[1].rank is None, np[1].rank if np[1].rank is not None else 0))
    world = max(worlds) if worlds else None
    local = len(nodes) == 1 and isinstance(nodes[0], LocalNode)
    if note := elsewhere_note(
        elsewhere, [p.rank for _, p in placed], world, [n.name for n in nodes], str(spec), agents=not local
    ):
        notes.append(Note(note))
    answered = tuple(node for node, _, exc in results if exc is None or isinstance(exc, JobNotFound))
    return Fleet(tuple(placed), world, tuple(notes), tuple(unreachable), answered)


@dataclass(frozen=True, slots=True)
class Round:
    """What one lock-step round found: the samples taken, keyed by the index in
    ``fleet.placed``, and the nodes that failed it (each with the ranks it holds and why),
    in the order their answers were read."""

    samples: Mapping[int, Sample]
    lost: tuple[Unreachable, ...] = ()


def sample_all(fleet: Fleet, t: float, *, native: bool, timeout: float, only: set[int] | None = None) -> Round:
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
        samples.update(zip(idx, taken, strict=False))
    return Round(samples, tuple(lost))
