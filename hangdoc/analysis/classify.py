"""Name the hang: verdict, culprit ranks, and the facts that back them.

Input is the per-rank view built by ``analyse`` (state, distributed op, relevant thread,
movement). The rules are checked in a fixed order, most specific first:
progress -> rank_missing -> init_deadlock -> cleanup_deadlock -> straggler ->
collective_mismatch -> nccl_timeout -> unknown.

``decide`` applies the rules and returns a ``Finding`` (verdict, culprits, the facts found,
no words); ``classify`` has ``wording`` turn it into the summary, evidence and next steps,
then applies the rules of the other evidence sources (``settle``: the flight recorder, the
GPUs and NCCL's RAS) and adds the probes' evidence. The verdict is decided there, once.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence

from ..model import GIVEN_GROUP, WORLD_GROUP, DistOp, Evidence, Frame, OpKind, RankState, Verdict
from ..waitwords import root_line, root_step
from . import phrases, settle, wording
from .beyond import Chain, root_cause
from .facts import (
    AllReceive,
    CleanupStuck,
    DataMoving,
    DeviceWaits,
    EnvSplit,
    GroupsApart,
    InitSplit,
    InitStuck,
    Mismatch,
    NothingCaptured,
    P2PFact,
    Progressing,
    RanksGone,
    SameOp,
    SeenInOneOp,
    Straggling,
    Teardown,
    ThreadsRace,
    Unexplained,
    Unpaired,
    Unseen,
    WaitsOutside,
    Working,
)
from .finding import Classification, Finding, Told
from .host_sync import waits_for_device
from .probe_evidence import probe_lines
from .structure import (
    Scope,
    Structure,
    could_be_groups,
    minority,
    op_scope,
    sides,
    structure_of,
    tiny_parting,
    whole_groups,
)
from .views import OpKey, RankView, op_keys

IN_OP = (RankState.WAITING, RankState.COMMUNICATING)
OUTSIDE = (RankState.BUSY, RankState.BLOCKED, RankState.STOPPED)


def classify(
    views: Sequence[RankView],
    missing: Sequence[int],
    unknown: Sequence[int],
    *,
    others_unseen: bool = False,
    told: Told | None = None,
    notes: Sequence[str] = (),
    chains: Mapping[int, Chain] | None = None,
) -> Classification:
    """The verdict, decided once: the stack rules (``decide``) in words, then what the other
    sources make of it (``settle``), then the probes' evidence. ``notes`` are said after the
    stacks' own evidence."""
    found = decide(views, missing, unknown, others_unseen=others_unseen, chains=chains)
    summary, evidence = wording.words(found.facts)
    lines: list[str] = []
    if found.quiet_over is not None:
        lines.append(phrases.quiet_line(found.quiet_over))
    culprits = set(found.culprits)
    unreadable = [v for v in views if v.state is RankState.UNREADABLE and v.rank not in culprits]
    lines += wording.notes(unknown, unreadable)
    lines += phrases.lock_notes(views, [e.words() for e in evidence] + lines)
    device = [v for v in views if v.state in IN_OP and waits_for_device(v.op)]
    if device and isinstance(found.facts, Mismatch):
        # the mismatch is among the ops stacks name; the ranks at host syncs are in neither
        lines += phrases.op_lines(device) + [wording.NOT_VISIBLE]
    if unknown and found.verdict is not Verdict.NOT_HUNG:
        summary += wording.partial_suffix(unknown)
    evidence += map(Evidence, [*lines, *notes])
    result = Classification(
        found,
        found.verdict,
        tuple(sorted(found.culprits)),
        summary,
        tuple(evidence),
        wording.next_steps(found.verdict, found.facts),
        found.ambiguous,
    )
    told = told or Told()
    result = settle.by_flight(result, told.flight, told.had_stacks)
    seen = {v.rank for v in views}
    result = settle.by_devices(result, told.devices, tuple(sorted(set(unknown) - seen)))
    probed = probe_lines(views)
    if probed:
        result = dataclasses.replace(result, evidence=(*result.evidence, *map(Evidence, probed)))
    root = root_cause(chains, result.verdict, result.culprits, views) if chains else None
    if root is None:
        return result
    return dataclasses.replace(
        result,
        evidence=(*result.evidence, Evidence(root_line(root))),
        next_steps=(root_step(root), *result.next_steps),
        root=root,
    )


def decide(
    views: Sequence[RankView],
    missing: Sequence[int],
    unknown: Sequence[int],
    *,
    others_unseen: bool = False,
    chains: Mapping[int, Chain] | None = None,
) -> Finding:
    """Apply the rules in order; the first that fits gives the verdict. ``others_unseen``:
    the job has ranks nobody saw besides ``unknown`` (one rank's dump, and nothing says the
    job's size): a claim about every rank cannot be made. ``chains``: the waits of ranks
    off CPU outside any op, followed past the ranks (``beyond``), by rank."""
    partial = bool(unknown) or others_unseen
    by_state: dict[RankState, list[RankView]] = defaultdict(list)
    for v in views:
        by_state[v.state].append(v)
    waiting = by_state[RankState.WAITING]
    in_op = [v for v in views if v.state in IN_OP]
    outside = [v for v in views if v.state in OUTSIDE]
    exited = [v.rank for v in by_state[RankState.EXITED]]
    progressing = by_state[RankState.PROGRESSING]

    if not views:
        return Finding(Verdict.UNKNOWN, [], NothingCaptured())

    # -- progress
    if progressing or not waiting:
        found = _not_hung(progressing, in_op, outside, waiting)
        if found is not None:
            return found

    # -- rank_missing
    gone = sorted(set(missing) | set(exited))
    if gone:
        world = len(views) + len(gone) + len(unknown)
        return Finding(Verdict.RANK_MISSING, gone, RanksGone(gone, exited, world, in_op), quiet_over=in_op)

    # -- init_deadlock
    init = [v for v in in_op if v.op and v.op.kind is OpKind.INIT]
    if init:
        return _init_deadlock(views, init, in_op)

    # -- cleanup_deadlock: in a collective on a cleanup path, or idle in cleanup code (joining
    #    a thread, waiting on a queue in __exit__) while the others wait in the training loop
    cleanup = [v for v in in_op if v.op and (v.op.in_cleanup or v.op.kind is OpKind.CLEANUP)]
    cleanup += [v for v in outside if v.state is RankState.BLOCKED and v.cleanup is not None]
    in_cleanup = {id(v) for v in cleanup}
    training = [v for v in in_op if id(v) not in in_cleanup]
    if cleanup and training:
        return Finding(
            Verdict.CLEANUP_DEADLOCK,
            [v.rank for v in cleanup],
            CleanupStuck(cleanup, training),
            quiet_over=in_op,
        )
    if cleanup and partial and all(id(v) in in_cleanup for v in outside):
        # every rank seen is in cleanup (no rank is in training: that returned above), the
        # others were not seen: cleanup from one side
        return Finding(
            Verdict.CLEANUP_DEADLOCK,
            [v.rank for v in cleanup],
            CleanupStuck(cleanup, [], unknown),
            quiet_over=in_op,
        )

    # -- two threads of one rank in collectives on one group: their order is a race
    raced = [v for v in in_op if _one_group_twice(v)]
    if raced:
        others = [v for v in in_op if not _one_group_twice(v)]
        return Finding(
            Verdict.COLLECTIVE_MISMATCH, [v.rank for v in raced], ThreadsRace(raced, others), quiet_over=in_op
        )

    # -- straggler
    if outside and in_op:
        return Finding(
            Verdict.STRAGGLER,
            [v.rank for v in outside],
            Straggling(outside, in_op),
            # a slow rank may still finish: observe longer; a lock-order deadlock seen in
            # two samples cannot, nor a wait that comes back to its rank across processes
            ambiguous=not all(v.deadlocked or _in_cycle(v, chains) for v in outside),
            quiet_over=in_op,
        )

    # -- collective_mismatch / nccl_timeout. A rank at a host sync waits for device work in
    #    a collective its stack does not name: it is compared with no one (ranks that stop
    #    at different host syncs may wait in the same collective)
    known: list[RankView] = []
    device: list[RankView] = []
    for v in in_op:
        (device if waits_for_device(v.op) else known).append(v)
    key = op_keys()
    classes: dict[OpKey, list[RankView]] = defaultdict(list)
    for v in known:
        classes[key(v.op)].append(v)  # type: ignore[arg-type]
    p2p_problem = _p2p_unpaired(known)
    if len(classes) > 1 or p2p_problem:
        return _mismatch(classes, p2p_problem, known)
    unseen = by_state[RankState.UNREADABLE]
    if device:
        facts = DeviceWaits(device, known)
        if not (unseen and facts.one_site):
            # every rank at one host sync: the devices wait in some collective that does
            # not complete (transport-like, said with low confidence); anything else: what
            # is missing, not a guess
            verdict = Verdict.NCCL_TIMEOUT if facts.one_site and not partial else Verdict.UNKNOWN
            return Finding(verdict, [], facts, quiet_over=in_op)
    if in_op and unseen:
        # every rank that could be read waits in one op: the ranks not seen there are what
        # the others wait for, by elimination (a rank in D state on a dead filesystem, one
        # py-spy cannot pause); the report says it rests on elimination, not a stack
        return Finding(Verdict.STRAGGLER, [v.rank for v in unseen], Unseen(unseen, in_op), quiet_over=in_op)
    if in_op and partial:
        # "every rank in the same op" holds only over the whole world: what the ranks not
        # seen do decides between a transport hang and one rank the others wait for
        return Finding(Verdict.UNKNOWN, [], SeenInOneOp(in_op, unknown), quiet_over=in_op)
    if in_op and all(id(v) in in_cleanup for v in in_op) and not outside:
        return Finding(Verdict.NCCL_TIMEOUT, [], Teardown(in_op), quiet_over=in_op)
    if in_op:
        return Finding(Verdict.NCCL_TIMEOUT, [], SameOp(in_op), quiet_over=in_op)
    return _outside_only(views, outside, chains or {}, unknown if partial else None)


def _outside_only(
    views: Sequence[RankView], outside: Sequence[RankView], chains: Mapping[int, Chain], unknown: Sequence[int] | None
) -> Finding:
    """No rank in a distributed op. external_wait: every rank seen is off CPU on a wait that
    leaves the ranks; over part of the job (``unknown`` not None), what the others do is not
    known."""
    if chains and outside and all(_waits_outside(v, chains) for v in views):
        # a wait that ends at a process that runs may be slow work, not a hang: watch longer
        runs = any(chains[v.rank].runs for v in outside)
        if unknown is not None:
            return Finding(Verdict.UNKNOWN, [], WaitsOutside(outside, chains, True, unknown), ambiguous=runs)
        return Finding(Verdict.EXTERNAL_WAIT, [v.rank for v in outside], WaitsOutside(outside, chains), ambiguous=runs)
    return Finding(Verdict.UNKNOWN, [], Unexplained(views))


def _in_cycle(v: RankView, chains: Mapping[int, Chain] | None) -> bool:
    return chains is not None and v.rank in chains and chains[v.rank].cycle


def _waits_outside(v: RankView, chains: Mapping[int, Chain]) -> bool:
    return v.state is RankState.BLOCKED and v.rank in chains and chains[v.rank].leaves_the_ranks


def _not_hung(
    progressing: Sequence[RankView],
    in_op: Sequence[RankView],
    outside: Sequence[RankView],
    waiting: Sequence[RankView],
) -> Finding | None:
    """A job where something moves the way a healthy job moves; None when it is not.

    Progress counts only where it can be what the waiting ranks wait for: with ranks that
    wait and a rank outside any op that does not move at all (off CPU, no bytes, the same
    stack, no wake-ups: a lock, a dead filesystem, a stopped process), the ranks that
    complete ops elsewhere (a subgroup's loop, a polling wait) say nothing about the ones
    stuck, and the straggler rule decides instead. A few ranks progressing among many that
    wait is reported as such, and watched longer.
    """
    busy = [
        v
        for v in outside
        if v.state is RankState.BUSY or (v.move is not None and (v.move.moving or v.move.stack_changed or v.move.woke))
    ]
    if progressing:
        working = {id(v) for v in busy}
        still = [v for v in outside if id(v) not in working]
        if waiting and still:
            return None
        return Finding(
            Verdict.NOT_HUNG, [], Progressing(progressing, waiting), ambiguous=len(waiting) > len(progressing)
        )
    communicating = [v for v in in_op if v.state is RankState.COMMUNICATING]
    if communicating and not waiting:
        return Finding(Verdict.NOT_HUNG, [], DataMoving(communicating), ambiguous=bool(outside))
    if not in_op and busy:
        return Finding(Verdict.NOT_HUNG, [], Working(busy))
    return None


def _init_deadlock(views: Sequence[RankView], init: list[RankView], in_op: list[RankView]) -> Finding:
    init_ranks = [v.rank for v in init]
    in_init = {id(v) for v in init}
    others = [v for v in views if id(v) not in in_init and v.state is not RankState.UNREADABLE]
    if others:
        other_ranks = [v.rank for v in others]
        culprits = other_ranks if len(other_ranks) <= len(init_ranks) else init_ranks
        went_past = any(v.op is not None and v.op.kind is not OpKind.INIT for v in others)
        ambiguous = any(v.state is RankState.BUSY for v in others)
        return Finding(
            Verdict.INIT_DEADLOCK,
            culprits,
            InitSplit(init, others, went_past),
            ambiguous=ambiguous,
            quiet_over=in_op,
        )
    culprits, env = _env_disagreement(init)
    key = op_keys()
    classes: dict[OpKey, list[int]] = defaultdict(list)
    for v in init:
        classes[key(v.op)].append(v.rank)  # type: ignore[arg-type]
    if not culprits and len(classes) > 1:
        culprits = _minority(list(classes.values()))
    return Finding(Verdict.INIT_DEADLOCK, culprits, InitStuck(init, culprits, env), quiet_over=in_op)


_RDZV_KEYS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "SLURM_NTASKS")


def _env_disagreement(init: Sequence[RankView]) -> tuple[list[int], EnvSplit | None]:
    """The first rendezvous variable the ranks disagree on, and the ranks in the minority."""
    for key in _RDZV_KEYS:
        values: dict[str | None, list[int]] = defaultdict(list)
        for v in init:
            values[v.snap.process.env_get(key)].append(v.rank)
        if len(values) > 1:
            return _minority(list(values.values())), EnvSplit(key, dict(values))
    return [], None


def _minority(classes: list[list[int]]) -> list[int]:
    """Ranks outside the unique largest class; [] when the largest class is not unique."""
    sizes = sorted((len(c) for c in classes), reverse=True)
    if len(sizes) < 2 or sizes[0] == sizes[1]:
        return []
    biggest = max(classes, key=len)
    return sorted(r for c in classes if c is not biggest for r in c)


def _mismatch(
    classes: dict[OpKey, list[RankView]],
    p2p_problem: tuple[list[int], list[P2PFact]] | None,
    in_op: list[RankView],
) -> Finding:
    """Ranks in different ops. The culprits are the minority side by the ops' scopes
    (``structure``): ranks on WORLD that left a structure of passed groups, or the ranks
    outside the class that holds most of them; else the send/recv calls that do not pair
    up; else where the stacks part (with a WORLD op among the classes, the smaller path; in
    a structure of groups, only a side smaller than each of its places). A structure with
    no one outside it is ``GroupsApart``: nothing to blame."""
    groups = sorted(classes.values(), key=lambda vs: (-len(vs), vs[0].rank))
    shape = structure_of(groups)
    apart = whole_groups(shape)
    culprits = [] if apart else minority(sides(shape))
    left = bool(culprits) and len(shape.part) > 1 and bool(shape.world)
    waiting = _waiting_for_members(shape, culprits)
    if waiting:
        culprits = []
    p2p: list[P2PFact] = []
    by_peers = False
    if p2p_problem is not None:
        p2p_culprits, p2p = p2p_problem
        # a minority whose ops run on groups their callers passed may be a pipeline stage
        # in its own group's collective, legitimately apart from the others: p2p peers that
        # cannot pair are direct evidence, and name the culprits instead
        named = set(culprits)
        if not culprits or all(v.op is not None and v.op.group == GIVEN_GROUP for v in in_op if v.rank in named):
            culprits, by_peers, left = p2p_culprits, True, False
    if apart and not culprits:
        return Finding(Verdict.UNKNOWN, [], GroupsApart(groups, apart, shape.from_lines), quiet_over=in_op)
    parted: list[tuple[Frame, list[RankView]]] = []
    by_tree = False
    if not culprits:
        parted = _parting(in_op)
        if shape.world or not could_be_groups(parted, groups):
            # a WORLD op needs every rank, and a class of one rank is no whole group: the
            # ops are not legitimately apart, and the smaller path is the odd one out
            culprits = _minority([[v.rank for v in vs] for _, vs in parted])
        else:  # maybe a structure of groups: only ranks that left it
            culprits = tiny_parting(parted, groups)
            by_tree = bool(culprits)
        if not culprits:
            parted = []
    return Finding(
        Verdict.COLLECTIVE_MISMATCH,
        culprits,
        Mismatch(groups, culprits, p2p, by_peers, parted, shape if left else None, by_tree, waiting),
        quiet_over=in_op,
    )


def _one_group_twice(v: RankView) -> bool:
    """Two of the rank's threads wait in collectives on one process group: both on WORLD,
    or both on the same named group. (Two passed groups may be different groups.)"""
    mine = _group_of(v.op)
    return mine is not None and any(_group_of(op) == mine for _, op in v.side_ops)


def _group_of(op: DistOp | None) -> str | None:
    if op is None or op.kind is not OpKind.COLLECTIVE:
        return None
    if op.group is not None and op.group.startswith("name:"):
        return op.group
    read = op_scope(op)
    return WORLD_GROUP if read is not None and read.scope is Scope.WORLD else None


def _waiting_for_members(shape: Structure, few: Sequence[int]) -> list[RankView]:
    """The few ranks, when they all wait in collectives on groups their callers passed while
    the rest, most of the job, wait in other ops whose scope is known: such a collective
    completes once every member of its group has entered it, so some fellow member of each
    is not in it but in the others' op (a member that skipped the group's op or calls it
    later, or the few issued theirs early). Who waits for whom then rests on the groups'
    members and the order each rank issued its ops, which stacks do not show: the minority
    is not the culprit by being few. [] otherwise (the few on WORLD wait for everyone: they
    left, ``sides``)."""
    if not few or shape.unseen:
        return []
    named = set(few)
    waiting = [v for c in shape.part for v in c if v.rank in named]
    rest = sum(len(c) for c in (*shape.world, *shape.part)) - len(waiting)
    if len(waiting) != len(named) or rest <= len(named):
        return []
    if any(v.op is None or v.op.kind is not OpKind.COLLECTIVE for v in waiting):
        return []
    return waiting


def _parting(views: Sequence[RankView]) -> list[tuple[Frame, list[RankView]]]:
    """Where the ranks' paths first part, as in STAT's merged call tree: the ranks grouped
    by the function each calls at the first depth where they call different ones (lines
    within one function do not part them: one loop body at two lines is one path), largest
    group first. Ranks stuck in three different ops can still be two paths: two ranks in
    one training step (a broadcast and the reducer's all_reduce) and one that left it for
    validation. Empty when the paths never part."""
    stacks = {v.rank: [f for f in v.thread.frames if not f.native] if v.thread else [] for v in views}
    depth = 0
    while True:
        at: dict[tuple[str, str] | None, list[RankView]] = defaultdict(list)
        for v in views:
            stack = stacks[v.rank]
            at[(stack[depth].function, stack[depth].filename) if depth < len(stack) else None].append(v)
        if len(at) > 1:
            parts = [(stacks[vs[0].rank][depth], vs) for key, vs in at.items() if key is not None]
            if len(parts) < len(at):
                return []  # some path ends here: one is the other's caller, not apart
            return sorted(parts, key=lambda p: (-len(p[1]), p[1][0].rank))
        if None in at:
            return []
        depth += 1


def _p2p_unpaired(in_op: Sequence[RankView]) -> tuple[list[int], list[P2PFact]] | None:
    """Send/recv that cannot complete: receivers whose peer is not sending to them."""
    p2p = [v for v in in_op if v.op and v.op.kind is OpKind.P2P]
    if not p2p:
        return None
    by_rank = {v.rank: v for v in in_op}
    found: list[P2PFact] = []
    culprits: list[int] = []
    for v in p2p:
        op = v.op
        assert op is not None
        receiving = "recv" in op.name
        peer = by_rank.get(op.peer) if op.peer is not None else None
        if op.peer is not None and peer is not None:
            peer_op = peer.op
            peer_ok = (
                peer_op is not None
                and peer_op.kind is OpKind.P2P
                and (("send" in peer_op.name) == receiving)
                and peer_op.peer in (None, v.rank)
            )
            if not peer_ok:
                found.append(Unpaired(v.rank, op, receiving, op.peer, peer_op))
                culprits.append(op.peer)
    receivers = [v for v in p2p if "recv" in v.op.name]  # type: ignore[union-attr]
    senders = [v for v in p2p if "send" in v.op.name]  # type: ignore[union-attr]
    if receivers and not senders and not found and len(p2p) == len(in_op):
        found.append(AllReceive([v.rank for v in receivers]))
        culprits = [v.rank for v in receivers]
    if not found:
        return None
    return sorted(set(culprits)), found
