"""Analysis entry point: a ``JobSnapshot`` in, a ``Diagnosis`` out. Pure: no I/O.

Per rank it recognises the distributed op of the relevant thread (``ops``), judges
movement over the window (``progress``), and assigns a ``RankState``; it merges the
ranks' stacks into one ``CallTree`` (``merge``), then ``classify`` names the verdict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from ..model import (
    MAX_WORLD_SIZE,
    CallTree,
    Diagnosis,
    DistOp,
    JobSnapshot,
    RankAnalysis,
    RankSnapshot,
    RankState,
    Stack,
    StackGroup,
    ThreadStack,
    bounded_int,
    collections_paused,
    compress_ranks,
    once_per_object,
)
from . import classify, confidence, wording
from .device import waits_for_device
from .flight import apply_flight, match_flight
from .gpu_state import apply_device_state
from .merge import build_tree, with_culprits
from .ops import Recogniser
from .probe_evidence import apply_probe_evidence
from .views import RankView, Views


def tree_stack(thread: ThreadStack) -> Stack:
    """The stack as merged across ranks: unsymbolised native frames (bare addresses, which
    differ per process under ASLR) are left out so identical stacks stay identical."""
    return _tree_frames(thread.frames)


def _tree_frames(frames: Stack) -> Stack:
    return tuple(f for f in frames if not (f.native and f.function.startswith("0x")))


def expected_ranks(snapshot: JobSnapshot, views: Sequence[RankView] = ()) -> set[int]:
    """Every rank number the job should have: from the world size in the ranks' environment,
    the snapshot's, or the one the job's code passed to ``init_process_group`` (``mp.spawn``
    jobs often set it nowhere else)."""
    sizes = {r.process.world_size for r in snapshot.ranks if r.process.world_size}
    sizes |= {v.code_world for v in views if v.code_world}
    if snapshot.world_size:
        sizes.add(snapshot.world_size)
    return set(range(min(max(sizes), MAX_WORLD_SIZE))) if sizes else set()


def _env_int(snap: RankSnapshot, *keys: str, minimum: int = 0) -> int | None:
    """The first of ``keys`` set to a whole number in [minimum, MAX_WORLD_SIZE]; a value
    that is not one (``"²"``, ``"0"`` for a size, 5000 digits) is ignored, not trusted."""
    for key in keys:
        number = bounded_int((snap.process.env_get(key) or "").strip(), minimum, MAX_WORLD_SIZE)
        if number is not None:
            return number
    return None


def off_node_ranks(
    snapshot: JobSnapshot, absent: set[int], views: Sequence[RankView] = ()
) -> tuple[set[int], str]:
    """Absent ranks that may live on nodes this snapshot did not look at.

    A multi-node job seen from some of its nodes (LOCAL_WORLD_SIZE / SLURM_NTASKS_PER_NODE
    smaller than the world) has ranks elsewhere: those are unknown, not missing. A node
    that was looked at and holds its full local world is missing nothing, whatever the rank
    numbering; where a node holds fewer, the absent ranks of its block (torchrun's and
    Slurm's contiguous layout, or GROUP_RANK) are the missing ones, if that accounts for
    exactly the shortfall. Otherwise hangdoc cannot tell which absent ranks are missing and
    calls them all unknown.
    """
    if not absent:
        return set(), ""
    local_sizes = {
        n for r in snapshot.ranks
        if (n := _env_int(r, "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", minimum=1)) is not None
    }
    if len(local_sizes) != 1:
        return set(), ""
    per_node = local_sizes.pop()
    world = max(expected_ranks(snapshot, views), default=-1) + 1
    hosts: dict[str, list[RankSnapshot]] = {}
    for r in snapshot.ranks:
        hosts.setdefault(r.process.host, []).append(r)
    if per_node >= world or len(hosts) * per_node >= world:
        return set(), ""  # every node was looked at: absent ranks are missing
    shortfall = sum(max(per_node - len(rs), 0) for rs in hosts.values())
    blocks = set()
    for rs in hosts.values():
        for r in rs:
            group = _env_int(r, "GROUP_RANK", "NODE_RANK", "SLURM_NODEID")
            blocks.add(group if group is not None else (r.rank or 0) // per_node)
    in_blocks = {rank for rank in absent if rank // per_node in blocks}
    local_missing = in_blocks if len(in_blocks) == shortfall else set()
    elsewhere = absent - local_missing
    if not elsewhere:
        return set(), ""

    note = (
        f"ranks {compress_ranks(elsewhere)[1:-1]} may run on nodes that were not asked "
        f"({per_node} ranks per node, {len(hosts)} node(s) seen): their state is unknown; "
        "diagnose with an agent on every node to see them"
    )
    return elsewhere, note


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
    absent = expected_ranks(snapshot, views) - present
    if any(not u.ranks for u in snapshot.unreachable):
        unknown |= absent  # an unreachable node could hold any absent rank
    elsewhere, elsewhere_note = off_node_ranks(snapshot, absent - unknown, views)
    unknown |= elsewhere
    missing = absent - unknown

    merged = once_per_object(_tree_frames)  # ranks share stacks: one merged stack for each
    stacks: dict[int, Stack] = {v.rank: merged(v.thread.frames) for v in views if v.thread is not None}
    tree = build_tree(stacks)
    groups, group_of = _groups(tree, {v.rank: v.op for v in views})

    result = classify.classify(views, sorted(missing), sorted(unknown))
    describe = _details()
    if elsewhere_note:
        result.evidence.append(elsewhere_note)
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
        RankAnalysis(r, None, "", RankState.UNKNOWN, None, None, None, "its node did not answer")
        for r in sorted(unknown - present)
    ]
    ranks.sort(key=lambda r: (r.rank is None, r.rank))
    observed = max((v.move.seconds for v in views if v.move), default=0.0)
    judged = confidence.judge(result.finding, views, sorted(unknown), len(snapshot.unreachable))
    diagnosis = Diagnosis(
        verdict=result.verdict,
        culprit_ranks=tuple(sorted(result.culprits)),
        summary=result.summary,
        evidence=tuple(result.evidence),
        next_steps=tuple(result.next_steps),
        ranks=tuple(ranks),
        groups=tuple(groups),
        observed_seconds=round(max(observed, snapshot.window_seconds), 2),
        partial=bool(unknown) or any(v.state is RankState.UNREADABLE for v in views),
        tree=tree,
        ambiguous=result.ambiguous,
        confidence=judged.confidence,
        basis=judged.basis,
    )
    # the ranks' flight recorder dumps, when had, sharpen or override what the stacks say
    diagnosis = apply_flight(diagnosis, match_flight(snapshot), stacks=any(r.samples for r in snapshot.ranks))
    # then their GPUs' state (NVML) and NCCL's RAS report, where captured
    diagnosis = apply_device_state(diagnosis, snapshot)
    # and what their probes told: live exceptions, last heartbeats (evidence only)
    diagnosis = apply_probe_evidence(diagnosis, snapshot)
    if diagnosis.culprit_ranks and diagnosis.tree is not None:  # the tree's outliers, knowing them
        diagnosis = dataclasses.replace(diagnosis, tree=with_culprits(diagnosis.tree, diagnosis.culprit_ranks))
    return diagnosis


def _details() -> Callable[[RankView], str]:
    """``wording.describe_rank``; a rank in an op is described by its op alone, once per op
    object (the ranks of one stack share it)."""
    by_op: dict[int, str] = {}  # the ops are held by the views meanwhile

    def describe(v: RankView) -> str:
        if v.op is None:
            return wording.describe_rank(v)
        said = by_op.get(id(v.op))
        if said is None:
            said = by_op[id(v.op)] = wording.describe_rank(v)
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


def _groups(
    tree: CallTree, ops: dict[int, DistOp | None]
) -> tuple[list[StackGroup], dict[int, int]]:
    groups: list[StackGroup] = []
    group_of: dict[int, int] = {}
    for gid, (ranks, stack) in enumerate(tree.classes):
        groups.append(StackGroup(gid, ranks, stack, ops.get(ranks[0])))
        for r in ranks:
            group_of[r] = gid
    return groups, group_of
