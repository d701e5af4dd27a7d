"""Follow the wait past the ranks: read what the ranks that wait outside torch.distributed
wait on, sample the processes at the other ends (a server, a DataLoader worker, a child),
then what those wait on, to a bounded depth and breadth.

Which ranks, and which of their threads, is the analysis's question (``NeedsWaits``,
``analysis.beyond.needs_waits``, passed in by ``diagnose.py``): a plain job whose ranks all
wait in collectives costs nothing here. Every pid followed comes from the kernel's tables on
the node that holds the process (``Node.waits``); a process is followed on that node only,
and one that is a rank is never sampled twice. Each process followed gets two samples, the
window's ``interval`` apart, so that the analysis can tell one that waits from one that
moves.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..model import Frame, Note, NoteKind, RankProcess, RankSnapshot, Sample, ThreadWait, counted
from .coordinator import Fleet, fan_out
from .node import Node, Waited

# the native ids of a rank's threads whose waits are worth following (empty: none): its
# samples so far, its process, and a frame's source line
NeedsWaits = Callable[[Sequence[Sample], RankProcess, Callable[[Frame], str | None]], frozenset[int]]

# Bounds on one diagnosis's following. A wait chain in the jobs this is for is short: a
# trainer -> a server -> its scheduler thread, a rank -> a DataLoader worker -> a file, a
# trainer -> a Ray actor -> a server. Four links past the ranks hold them with room; the
# breadth bounds are what keep a rank that reads from many processes (DataLoader's result
# queue is written by every worker) from sampling a node's every process.
MAX_DEPTH = 4  # processes past a rank, along one chain
MAX_FOLLOWED = 16  # processes sampled beyond the ranks in one diagnosis
MAX_PEERS_EACH = 4  # processes followed from one process's waits


@dataclass
class Beyond:
    """The processes followed so far, by (node name, pid), with their samples."""

    held: dict[tuple[str, int], tuple[Node, RankProcess, list[Sample]]] = field(default_factory=dict)

    def snapshots(self) -> tuple[RankSnapshot, ...]:
        return tuple(RankSnapshot(proc, tuple(samples)) for _, proc, samples in self.held.values())


def follow_waits(
    fleet: Fleet,
    samples: list[list[Sample]],
    wanted: dict[int, frozenset[int]],
    clock: Callable[[], float],
    *,
    pause: float,
    timeout: float,
    include: Sequence[str] = (),
) -> tuple[Beyond, list[Note]]:
    """Read the waits of ``wanted`` ranks' threads (index into ``fleet.placed`` -> native
    ids) into their last samples (``samples`` is changed in place), follow them; with the
    processes of the fleet's nodes whose command line contains a word of ``include``
    (``--include``), followed as well. The processes followed, and what is worth saying."""
    beyond = Beyond()
    notes: list[Note] = []
    ranks = {(node.name, proc.pid) for node, proc in fleet.placed}
    by_node: dict[int, tuple[Node, list[int]]] = {}
    for i in sorted(wanted):
        node, proc = fleet.placed[i]
        by_node.setdefault(id(node), (node, []))[1].append(proc.pid)
    if include:
        for node, _ in fleet.placed:
            by_node.setdefault(id(node), (node, []))
    hosts = _hosts(fleet)
    answers, frontier = _far_ends(fleet, _ask(list(by_node.values()), notes, include), ranks, notes, hosts)
    index = {(node.name, proc.pid): i for i, (node, proc) in enumerate(fleet.placed)}
    for node, waited in answers:
        for pid, waits in waited.waits.items():
            at = index.get((node.name, pid))
            if at is None or at not in wanted:
                continue
            kept = tuple(w for w in waits if w.native_id in wanted[at])
            if samples[at]:
                samples[at][-1] = dataclasses.replace(samples[at][-1], waits=kept)
            frontier += _next(node, kept, waited, ranks, beyond, frontier, hosts)
        named = {p for ws in waited.waits.values() for w in ws for p in w.peers}
        for pid, proc in waited.peers.items():  # --include's
            key = (node.name, pid)
            fresh = all((n.name, p.pid) != key for n, p in frontier)
            if pid not in named and key not in ranks and len(frontier) < MAX_FOLLOWED and fresh:
                frontier.append((node, _on_node(proc, node, hosts)))
    depth = 0
    while frontier and depth < MAX_DEPTH:
        depth += 1
        _sample(frontier, beyond, clock(), timeout)
        answers, far = _far_ends(fleet, _ask(_group(frontier), notes), ranks, notes, hosts)
        frontier = [(n, p) for n, p in far if (n.name, p.pid) not in beyond.held]
        for node, waited in answers:
            for pid, waits in waited.waits.items():
                _set_waits(beyond, node, pid, waits)
                frontier += _next(node, waits, waited, ranks, beyond, frontier, hosts)
    if frontier:
        notes.append(Note(f"waits followed {MAX_DEPTH} processes deep and no further", NoteKind.OTHER))
    if beyond.held:
        time.sleep(pause)  # a second look, so that a process that moves is not taken for one that waits
        followed = [(node, proc) for node, proc, _ in beyond.held.values()]
        _sample(followed, beyond, clock(), timeout)
        answers, _ = _far_ends(fleet, _ask(_group(followed), notes), ranks, notes, hosts)
        for node, waited in answers:
            for pid, waits in waited.waits.items():
                _set_waits(beyond, node, pid, waits)
        pids = tuple(sorted(pid for _, pid in beyond.held))
        what = f"followed the waits of {counted(len(wanted), 'rank')}" if wanted else "followed"
        what += " and --include" if include else ""
        notes.append(
            Note(f"{what} to {counted(len(pids), 'process', 'processes')} beyond the ranks", NoteKind.OTHER, pids=pids)
        )
    return beyond, notes


def _next(
    node: Node,
    waits: Sequence[ThreadWait],
    waited: Waited,
    ranks: set[tuple[str, int]],
    beyond: Beyond,
    queued: Sequence[tuple[Node, RankProcess]],
    hosts: dict[str, str],
) -> list[tuple[Node, RankProcess]]:
    """The processes ``waits`` lead to that are not ranks, not followed yet, within bounds."""
    taken = {(n.name, p.pid) for n, p in queued}
    out: list[tuple[Node, RankProcess]] = []
    for pid in dict.fromkeys(p for w in waits if not w.peer_host for p in w.peers):
        key = (node.name, pid)
        if key in ranks or key in beyond.held or key in taken or pid not in waited.peers:
            continue
        if len(out) >= MAX_PEERS_EACH or len(beyond.held) + len(queued) + len(out) >= MAX_FOLLOWED:
            break
        out.append((node, _on_node(waited.peers[pid], node, hosts)))
    return out


def _hosts(fleet: Fleet) -> dict[str, str]:
    """The host each node's ranks carry, by node name: a process followed there carries the
    same, whatever its agent calls its machine (a Ray node is named by its id)."""
    hosts: dict[str, str] = {}
    for node, proc in fleet.placed:
        hosts.setdefault(node.name, proc.host)
    return hosts


def _on_node(proc: RankProcess, node: Node, hosts: dict[str, str]) -> RankProcess:
    host = hosts.get(node.name)
    return dataclasses.replace(proc, host=host) if host is not None and host != proc.host else proc


def _far_ends(
    fleet: Fleet,
    answers: list[tuple[Node, Waited]],
    ranks: set[tuple[str, int]],
    notes: list[Note],
    hosts: dict[str, str],
) -> tuple[list[tuple[Node, Waited]], list[tuple[Node, RankProcess]]]:
    """Waits on a TCP connection that leaves their node, where the node at its remote
    address is one of the fleet's (its agent answered): that agent names the processes
    holding the other end (``Node.waits(sockets=...)``), and the waits say so (``peers``
    on ``peer_host``). The answers so rewritten, and the far processes to follow (ranks
    are not followed)."""
    asked: dict[int, tuple[Node, set[tuple[str, str]]]] = {}
    for _, waited in answers:
        for waits in waited.waits.values():
            for w in waits:
                node = _node_at(fleet, w.remote) if w.remote and w.local and not w.peers else None
                if node is not None:
                    asked.setdefault(id(node), (node, set()))[1].add((w.remote, w.local))
    if not asked:
        return answers, []
    far: dict[tuple[str, str], tuple[Node, tuple[RankProcess, ...]]] = {}

    def lookup(node: Node) -> Waited | str:
        try:
            return node.waits([], (), sorted(asked[id(node)][1]))
        except Exception as exc:  # noqa: BLE001 - a far node's failure is a note
            return f"{type(exc).__name__}: {exc}"

    for node, found, exc in fan_out([n for n, _ in asked.values()], lookup, 10.0):
        if not isinstance(found, Waited):
            notes.append(Note(f"could not ask who holds a connection: {exc or found}", NoteKind.OTHER, node.name))
            continue
        for (their_local, their_remote), pids in found.holders.items():
            procs = tuple(_on_node(found.peers[p], node, hosts) for p in pids if p in found.peers)
            if procs:
                far[(their_remote, their_local)] = (node, procs)
    rewritten: list[tuple[Node, Waited]] = []
    onward: list[tuple[Node, RankProcess]] = []
    for node, waited in answers:
        read: dict[int, tuple[ThreadWait, ...]] = {}
        for pid, ws in waited.waits.items():
            changed = []
            for w in ws:
                hit = far.get((w.local, w.remote)) if w.remote and not w.peers else None
                if hit is not None:
                    there, procs = hit
                    w = dataclasses.replace(w, peers=tuple(p.pid for p in procs), peer_host=procs[0].host)
                    onward += [(there, p) for p in procs if (there.name, p.pid) not in ranks][:MAX_PEERS_EACH]
                changed.append(w)
            read[pid] = tuple(changed)
        rewritten.append((node, dataclasses.replace(waited, waits=read)))
    return rewritten, list({(n.name, p.pid): (n, p) for n, p in onward}.values())


def _node_at(fleet: Fleet, address: str) -> Node | None:
    """The node of the fleet whose agent listens at the host of ``address`` (``IP:PORT``)."""
    host = address.rpartition(":")[0].strip("[]")
    for node in fleet.answered:
        where = getattr(node, "address", None)
        if isinstance(where, str) and _same_host(where.rpartition(":")[0].strip("[]"), host):
            return node
    return None


@functools.cache
def _resolved(name: str) -> str:
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name


def _same_host(agent_host: str, ip: str) -> bool:
    return bool(agent_host) and _resolved(agent_host) == _resolved(ip)


def _group(procs: Sequence[tuple[Node, RankProcess]]) -> list[tuple[Node, list[int]]]:
    groups: dict[int, tuple[Node, list[int]]] = {}
    for node, proc in procs:
        groups.setdefault(id(node), (node, []))[1].append(proc.pid)
    return list(groups.values())


def _ask(
    groups: list[tuple[Node, list[int]]], notes: list[Note], include: Sequence[str] = ()
) -> list[tuple[Node, Waited]]:
    pids = {id(node): pids for node, pids in groups}
    out = []
    for node, waited, exc in fan_out([n for n, _ in groups], lambda n: _waits(n, pids[id(n)], include), 10.0):
        if isinstance(waited, Waited):
            out.append((node, waited))
        else:
            notes.append(Note(f"could not read what the processes wait on: {exc or waited}", NoteKind.OTHER, node.name))
    return out


def _waits(node: Node, pids: list[int], include: Sequence[str]) -> Waited | str:
    try:
        return node.waits(pids, include) if include else node.waits(pids)
    except Exception as exc:  # noqa: BLE001 - one node's failure is a note, not the diagnosis's end
        return f"{type(exc).__name__}: {exc}"


def _sample(procs: Sequence[tuple[Node, RankProcess]], beyond: Beyond, t: float, timeout: float) -> None:
    groups: dict[int, tuple[Node, list[RankProcess]]] = {}
    for node, proc in procs:
        groups.setdefault(id(node), (node, []))[1].append(proc)
        beyond.held.setdefault((node.name, proc.pid), (node, proc, []))

    def call(node: Node) -> list[Sample]:
        return node.sample(groups[id(node)][1], t, native=False, timeout=timeout)

    for node, taken, _exc in fan_out([n for n, _ in groups.values()], call, timeout + 5.0):
        for proc, sample in zip(groups[id(node)][1], taken or (), strict=False):
            beyond.held[(node.name, proc.pid)][2].append(sample)


def _set_waits(beyond: Beyond, node: Node, pid: int, waits: tuple[ThreadWait, ...]) -> None:
    held = beyond.held.get((node.name, pid))
    if held is not None and held[2]:
        held[2][-1] = dataclasses.replace(held[2][-1], waits=waits)
