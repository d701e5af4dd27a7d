"""Analysis entry point: a ``JobSnapshot`` in, a ``Diagnosis`` out. Pure: no I/O.

Per rank it recognises the distributed op of the relevant thread (``ops``), judges
movement over the window (``progress``), and assigns a ``RankState``; it merges the
ranks' stacks into one ``CallTree`` (``merge``), reads what the other sources tell (the
flight recorder, the GPUs and RAS), then ``classify`` names the verdict, once, and
``confidence`` weighs it; the ``Diagnosis`` is built once from that.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..addresses import is_loopback_host
from ..digits import bounded_int
from ..memo import collections_paused, once_per_object
from ..model import (
    MAX_WORLD_SIZE,
    CallTree,
    Diagnosis,
    DistOp,
    JobSnapshot,
    RankAnalysis,
    RankSnapshot,
    RankState,
    Scope,
    Stack,
    StackGroup,
    counted,
    tree_frames,
)
from ..rankranges import ranges_text
from . import classify, confidence, gpu_state, phrases
from .beyond import chains_of
from .finding import Told
from .flight import match_flight
from .host_sync import waits_for_device
from .merge import build_tree, with_culprits
from .ops import Recogniser
from .views import RankView, Views


def expected_ranks(snapshot: JobSnapshot, views: Sequence[RankView] = ()) -> set[int]:
    """Every rank number the job should have: from the world size in the ranks' environment,
    the snapshot's, or the one the job's code passed to ``init_process_group`` (``mp.spawn``
    jobs often set it nowhere else)."""
    sizes = {r.process.world_size for r in snapshot.ranks if r.process.world_size}
    sizes |= {v.code_world for v in views if v.code_world}
    if snapshot.world_size:
        sizes.add(snapshot.world_size)
    if sizes:
        return set(range(min(max(sizes), MAX_WORLD_SIZE)))
    # nothing says the size, but a rank that sends to or receives from rank N shows N exists
    return {p for v in views if v.op is not None and (p := v.op.peer) is not None and 0 <= p < MAX_WORLD_SIZE}


def _env_int(snap: RankSnapshot, *keys: str, minimum: int = 0) -> int | None:
    """The first of ``keys`` set to a whole number in [minimum, MAX_WORLD_SIZE]; a value
    that is not one (``"²"``, ``"0"`` for a size, 5000 digits) is ignored, not trusted."""
    for key in keys:
        number = bounded_int((snap.process.env_get(key) or "").strip(), minimum, MAX_WORLD_SIZE)
        if number is not None:
            return number
    return None


@dataclass(frozen=True)
class Placement:
    """Where the absent ranks of a job are, as far as what was searched can tell."""

    elsewhere: frozenset[int] = frozenset()  # may run on nodes nobody searched: not seen
    proven: frozenset[int] = frozenset()  # no process, on positive evidence: missing
    note: str = ""


def off_node_ranks(snapshot: JobSnapshot, absent: set[int], views: Sequence[RankView] = ()) -> Placement:
    """Which absent ranks are missing and which may live on nodes this snapshot did not see.

    An absent rank is missing only on positive evidence that its node was searched and holds
    no such rank; otherwise it is not seen. The evidence:

    - the job's layout: every node's local world is known (LOCAL_WORLD_SIZE /
      SLURM_NTASKS_PER_NODE) and the nodes searched hold the whole world, or a searched
      node holds fewer ranks than its local world and the absent ranks of its block
      (torchrun's and Slurm's contiguous layout, or GROUP_RANK) account for exactly the
      shortfall;
    - a rendezvous on loopback (MASTER_ADDR, or the ``HOST:PORT`` the job was named by, is
      this node's loopback): no rank can run on another node, and this node was searched.

    Ranks read from dump files (``JobSnapshot.nodes_searched`` false) are never proven absent:
    a file holds the processes someone dumped, not every process of a node.
    """
    if not absent:
        return Placement()
    if not snapshot.nodes_searched:
        return Placement(
            frozenset(absent),
            note=(
                f"ranks {ranges_text(sorted(set(absent)))} are not in the dumps: not seen, so nothing "
                "is concluded about them; dump every rank, or diagnose the live job"
            ),
        )
    local_sizes = {
        n
        for r in snapshot.ranks
        if (n := _env_int(r, "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", minimum=1)) is not None
    }
    hosts: dict[str, list[RankSnapshot]] = {}
    for r in snapshot.ranks:
        hosts.setdefault(r.process.host, []).append(r)
    if len(local_sizes) == 1:
        per_node = local_sizes.pop()
        world = max(expected_ranks(snapshot, views), default=-1) + 1
        if per_node >= world or len(hosts) * per_node >= world:
            return Placement(proven=frozenset(absent))  # every node was looked at
        shortfall = sum(max(per_node - len(rs), 0) for rs in hosts.values())
        blocks = set()
        for rs in hosts.values():
            for r in rs:
                group = _env_int(r, "GROUP_RANK", "NODE_RANK", "SLURM_NODEID")
                blocks.add(group if group is not None else (r.rank or 0) // per_node)
        in_blocks = {rank for rank in absent if rank // per_node in blocks}
        local_missing = in_blocks if len(in_blocks) == shortfall else set()
        elsewhere = absent - local_missing
        note = (
            (
                f"ranks {ranges_text(sorted(set(elsewhere)))} may run on nodes that were not asked "
                f"({per_node} ranks per node, {counted(len(hosts), 'node')} seen): their state is unknown; "
                "diagnose with an agent on every node to see them"
            )
            if elsewhere
            else ""
        )
        return Placement(frozenset(elsewhere), frozenset(local_missing), note)
    if _loopback_rendezvous(snapshot):
        return Placement(proven=frozenset(absent))
    searched = ", ".join(sorted(hosts)[:4]) + (" ..." if len(hosts) > 4 else "")
    return Placement(
        frozenset(absent),
        note=(
            f"ranks {ranges_text(sorted(set(absent)))} have no process on the "
            f"{'node' if len(hosts) == 1 else 'nodes'} searched "
            f"({searched}), and nothing shows the job has no other node: not seen, not missing; "
            "run `hangdoc agent` on the job's other nodes and add --agents NODE:7420,... "
            "(or --hostfile FILE) to see them"
        ),
    )


def _loopback_rendezvous(snapshot: JobSnapshot) -> bool:
    """The ranks meet on this node's loopback, so none can run on another node: every
    MASTER_ADDR the ranks show is a loopback name or address; where none shows one, the
    ``HOST:PORT`` the job was named by."""
    addrs = {a.strip() for r in snapshot.ranks if (a := r.process.env_get("MASTER_ADDR"))}
    if not addrs:
        host, sep, port = snapshot.spec.rpartition(":")
        if not sep or not port.isdigit():
            return False
        addrs = {host.strip("[]")}
    return all(is_loopback_host(a) for a in addrs)


def scope_of(views: Sequence[RankView], missing: set[int], unknown: set[int], world: int | None) -> Scope:
    """What the diagnosis saw of the job, and what it knows of the rest."""
    seen = tuple(sorted({v.rank for v in views}))
    return Scope(
        seen=seen, not_seen=tuple(sorted(unknown - set(seen))), absent=tuple(sorted(missing)), world_size=world
    )


def analyse(snapshot: JobSnapshot) -> Diagnosis:
    """Diagnose a snapshot. Deterministic for a given snapshot."""
    with collections_paused():
        return _analyse(snapshot)


def _analyse(snapshot: JobSnapshot) -> Diagnosis:
    recogniser = Recogniser(snapshot)  # each distinct thread recognised once, for all ranks
    making = Views(snapshot, recogniser)
    views = [v for r in snapshot.ranks if (v := making.view(r)).rank >= 0]
    present = {v.rank for v in views}
    unknown: set[int] = set()
    for u in snapshot.unreachable:
        unknown.update(u.ranks)
    unreachable_ranks = set(unknown)
    expected = expected_ranks(snapshot, views)
    absent = expected - present
    if any(not u.ranks for u in snapshot.unreachable):
        unknown |= absent  # an unreachable node could hold any absent rank
    placement = off_node_ranks(snapshot, absent - unknown, views)
    unknown |= placement.elsewhere
    missing = set(placement.proven)
    elsewhere_note = placement.note

    merged = once_per_object(tree_frames)  # ranks share stacks: one merged stack for each
    stacks: dict[int, Stack] = {v.rank: merged(v.thread.frames) for v in views if v.thread is not None}
    tree = build_tree(stacks)
    groups, group_of = _groups(tree, {v.rank: v.op for v in views})

    # does anything say the job's size (a peer a rank names does not)? One rank, or dumps,
    # of a job of unknown size may be any part of it
    world_known = (
        any(r.process.world_size for r in snapshot.ranks)
        or bool(snapshot.world_size)
        or any(v.code_world for v in views)
    )
    coverage_unknown = not world_known and (len(present) == 1 or not snapshot.nodes_searched)
    others_unseen = not world_known and len(present) == 1  # its peers exist; nobody saw them
    told = Told(match_flight(snapshot), any(r.samples for r in snapshot.ranks), gpu_state.find(snapshot))
    chains = chains_of(snapshot, views)
    result = classify.classify(
        views,
        sorted(missing),
        sorted(unknown),
        others_unseen=others_unseen,
        told=told,
        notes=(elsewhere_note,) if elsewhere_note else (),
        chains=chains,
    )
    judged = confidence.judge(
        result,
        views,
        sorted(unknown),
        len(snapshot.unreachable),
        world_known=world_known,
        coverage_unknown=coverage_unknown,
    )
    describe = _details()
    ranks = [
        RankAnalysis(
            rank=v.rank,
            pid=v.snap.process.pid,
            host=v.snap.process.host,
            state=v.state,
            op=v.op,
            thread=v.thread.name if v.thread else None,
            group_id=group_of.get(v.rank),
            detail=describe(v),
            working=_working(v),
        )
        for v in views
    ]
    ranks += [
        RankAnalysis(r, None, "", RankState.MISSING, None, None, None, "no process has this rank")
        for r in sorted(missing)
    ]
    ranks += [
        RankAnalysis(
            r,
            None,
            "",
            RankState.UNKNOWN,
            None,
            None,
            None,
            "its node did not answer" if r in unreachable_ranks else "not seen",
        )
        for r in sorted(unknown - present)
    ]
    ranks.sort(key=lambda r: (r.rank is None, r.rank))
    observed = max((v.move.seconds for v in views if v.move), default=0.0)
    return Diagnosis(
        verdict=result.verdict,
        culprit_ranks=result.culprits,
        summary=result.summary,
        evidence=result.evidence,
        next_steps=result.next_steps,
        ranks=tuple(ranks),
        groups=tuple(groups),
        observed_seconds=round(max(observed, snapshot.window_seconds), 2),
        partial=bool(unknown) or any(v.state is RankState.UNREADABLE for v in views),
        tree=with_culprits(tree, result.culprits) if result.culprits and tree is not None else tree,
        ambiguous=result.ambiguous,
        confidence=judged.confidence,
        basis=judged.basis,
        scope=scope_of(views, missing, unknown, (max(expected) + 1) if world_known and expected else None),
        root_cause=result.root,
    )


def _details() -> Callable[[RankView], str]:
    """``phrases.describe_rank``; a rank in an op is described by its op alone, once per op
    object (the ranks of one stack share it)."""
    by_op: dict[int, str] = {}  # the ops are held by the views meanwhile

    def describe(v: RankView) -> str:
        if v.op is None:
            return phrases.describe_rank(v)
        said = by_op.get(id(v.op))
        if said is None:
            said = by_op[id(v.op)] = phrases.describe_rank(v)
        return said

    return describe


_WORKING = (RankState.BUSY, RankState.PROGRESSING, RankState.COMMUNICATING)


def _working(v: RankView) -> bool:
    """On CPU, moving bytes or changing its stack: by its state, or by its counters when it
    waits (CPU or I/O, not wake-ups alone; at a host sync, I/O only: it spins while it
    waits)."""
    if waits_for_device(v.op) and v.state is RankState.WAITING:
        return v.move is not None and (v.move.moving_bytes or v.move.stack_changed)
    return v.state in _WORKING or (v.move is not None and v.move.moving)


def _groups(tree: CallTree, ops: dict[int, DistOp | None]) -> tuple[list[StackGroup], dict[int, int]]:
    groups: list[StackGroup] = []
    group_of: dict[int, int] = {}
    for gid, (ranks, stack) in enumerate(tree.classes):
        groups.append(StackGroup(gid, ranks, stack, ops.get(ranks[0])))
        for r in ranks:
            group_of[r] = gid
    return groups, group_of
