"""The words of a diagnosis: summary, evidence lines, next steps, one line per rank.

``classify`` decides the verdict and returns the facts it found (``facts``: one type per
rule outcome); this module turns those facts into sentences, from the shared phrases of
``phrases``, and knows nothing of the rules. It never imports ``classify``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ..memo import once_per_object
from ..model import (
    DistOp,
    Evidence,
    ThreadStack,
    Verdict,
)
from ..rankranges import rank_phrase
from ..waitwords import waits_words, who
from .facts import (
    AllReceive,
    CleanupStuck,
    DataMoving,
    DeviceWaits,
    EnvSplit,
    Facts,
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
    Unseen,
    WaitsOutside,
    Working,
)
from .phrases import (
    activity,
    cleanup_op,
    cleanup_short,
    cleanup_where,
    describe_rank,
    frame_tail,
    in_op,
    in_ops,
    move_line,
    op_lines,
    op_site,
    op_summary,
    progress_line,
    ranks_of,
    unseen_reason,
    verb_for,
)
from .structure import Scope, Structure, op_scope
from .views import RankView

NEXT_STEPS: dict[Verdict, tuple[str, ...]] = {
    Verdict.NOT_HUNG: (
        (
            "The job is moving; if it is slower than expected, profile a step (py-spy record) "
            "rather than looking for a hang."
        ),
    ),
    Verdict.CLEANUP_DEADLOCK: (
        (
            "Find the exception on the culprit ranks: it was raised in the training loop and is now "
            "being handled by cleanup code; look at their logs for a traceback."
        ),
        (
            "Do not synchronise (barrier, destroy_process_group, collective checkpointing) in "
            "__exit__/finally/atexit paths that only some ranks reach; let the launcher tear the job down."
        ),
        "Relaunch with TORCH_DISTRIBUTED_DEBUG=DETAIL to log every collective with ranks and shapes.",
    ),
    Verdict.COLLECTIVE_MISMATCH: (
        (
            "Make every rank of the group issue the same collectives in the same order: look for "
            "rank-dependent branches, uneven batches per rank and early exits around the call sites "
            "quoted above."
        ),
        (
            "Relaunch with TORCH_DISTRIBUTED_DEBUG=DETAIL (checks that collectives match across ranks) "
            "and NCCL_DEBUG=INFO."
        ),
        ("For uneven data with DDP, use the Join context manager or drop_last=True in the DistributedSampler."),
    ),
    Verdict.NCCL_TIMEOUT: (
        (
            "Every rank is in the same collective: suspect the transport, not the code. Check the "
            "network between the nodes (NCCL_DEBUG=INFO, NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, "
            "firewalls, link state) and GPU health."
        ),
        (
            "Lower the collective timeout so the job fails fast instead of hanging "
            "(init_process_group(timeout=...), NCCL_TIMEOUT=300)."
        ),
    ),
    Verdict.STRAGGLER: (
        (
            "Look at what the culprit ranks are doing (quoted above): an endless loop, a lock held "
            "by another thread, I/O that never returns."
        ),
        (
            "Attach to a culprit with `py-spy dump --pid PID --locals` (add --native for C "
            "extensions) to see the values involved."
        ),
    ),
    Verdict.RANK_MISSING: (
        (
            "Find out why the missing ranks have no process: their launcher's log, `dmesg` (OOM "
            "killer), the scheduler's record of the node."
        ),
        (
            "Lower the collective timeout so the job fails fast when a rank dies "
            "(init_process_group(timeout=...), NCCL_TIMEOUT=300), and let the launcher restart it."
        ),
    ),
    Verdict.INIT_DEADLOCK: (
        (
            "Check that every rank calls init_process_group/new_group with the same arguments, in "
            "the same order, and that MASTER_ADDR, MASTER_PORT and WORLD_SIZE agree."
        ),
        ("Relaunch with TORCH_DISTRIBUTED_DEBUG=DETAIL and TORCH_CPP_LOG_LEVEL=INFO to log rendezvous."),
    ),
    Verdict.EXTERNAL_WAIT: (
        (
            "The ranks wait on a process outside torch.distributed (a server, a worker, a child): "
            "see where the wait ends, above, and fix that process; the training code only waits."
        ),
        "Give the calls the ranks make to other processes a timeout, so that a stuck service fails the step loudly.",
    ),
    Verdict.UNKNOWN: ("Run again with a longer window (--window) and native frames (--native).",),
}


# -- sentences from facts --------------------------------------------------------------


class Said(NamedTuple):
    """What one rule's sentences say: lines of plain words, or of words said of one rank."""

    summary: str
    evidence: Sequence[str | Evidence]


class Words(NamedTuple):
    summary: str
    evidence: list[Evidence]


def words(facts: Facts) -> Words:
    """The summary and the evidence of one rule's facts (without the quiet line or notes)."""
    summary, lines = _SAY[type(facts)](facts)
    return Words(summary, [line if isinstance(line, Evidence) else Evidence(line) for line in lines])


SEE_THE_REST = (
    "See the ranks that were not seen: diagnose the live job through an agent on "
    "every node (`hangdoc agent` there, then --agents NODE:7420,... or --hostfile FILE), "
    "or dump every rank (py-spy dump --pid PID for each)."
)


def next_steps(verdict: Verdict, facts: Facts | None = None) -> tuple[str, ...]:
    if isinstance(facts, ThreadsRace):
        return RACE_NEXT_STEPS
    if isinstance(facts, DeviceWaits):
        return DEVICE_NEXT_STEPS
    if isinstance(facts, GroupsApart):
        return GROUPS_NEXT_STEPS
    if isinstance(facts, SeenInOneOp) or (isinstance(facts, CleanupStuck) and not facts.training):
        return (SEE_THE_REST, *NEXT_STEPS[verdict])
    return NEXT_STEPS[verdict]


def notes(unknown: Sequence[int], unreadable: Sequence[RankView]) -> list[str]:
    """Evidence lines on the ranks hangdoc could not see, added to every verdict."""
    lines: list[str] = []
    if unknown:
        lines.append(
            f"{rank_phrase(unknown)} {verb_for(unknown, 'was', 'were')} not seen (on a node not searched, "
            "not in the dumps, or on a node that did not answer): nothing is concluded "
            f"about {verb_for(unknown, 'it', 'them')}"
        )
    if unreadable:
        lines.append(
            f"{rank_phrase([v.rank for v in unreadable])} could not be read: "
            + "; ".join(sorted({describe_rank(v) for v in unreadable}))
        )
    return lines


def partial_suffix(unknown: Sequence[int]) -> str:
    """Appended to a hang's summary when some ranks' state is unknown."""
    return f" (partial evidence: {rank_phrase(unknown)} unknown)"


def _nothing_captured(_f: NothingCaptured) -> Said:
    return Said("No rank could be captured.", [])


def _unexplained(f: Unexplained) -> Said:
    return Said(
        "No rank is in a distributed operation and nothing moves; hangdoc cannot tell why.",
        [f"rank {v.rank}: {describe_rank(v)}" for v in f.views],
    )


def _waits_outside(f: WaitsOutside) -> Said:
    ranks = [v.rank for v in f.views]
    first = f.chains[ranks[0]]
    lead = f"{rank_phrase(ranks)} {verb_for(ranks, 'waits', 'wait')} outside torch.distributed"
    summary = f"External wait: {lead}, on {who(first.end)}."
    if f.partial:
        others = "its other ranks were"
        if f.unknown:
            others = f"{rank_phrase(f.unknown)} {verb_for(f.unknown, 'was', 'were')}"
        summary = f"{lead}, on {who(first.end)}; {others} not seen, so whether the job waits there is not known."
    evidence = [Evidence(waits_words(f.chains[r].links[0]) or "waits", r) for r in ranks]
    return Said(summary, evidence)


def _progressing(f: Progressing) -> Said:
    evidence = [progress_line(v) for v in f.ranks[:4]]
    if len(f.waiting) > len(f.ranks):
        # a few moving among many stuck: say so, not "the job progresses"
        return Said(
            f"not hung, for now: only {rank_phrase(ranks_of(f.ranks))} completed distributed operations "
            f"during the window while {rank_phrase(ranks_of(f.waiting))} waited "
            f"{in_ops(f.waiting)} throughout",
            [
                *evidence,
                (
                    f"{rank_phrase(ranks_of(f.waiting))} did not move: if they wait for "
                    f"{rank_phrase(ranks_of(f.ranks))}, they are slow; if not, the job is stuck "
                    "around them"
                ),
            ],
        )
    return Said(
        f"not hung: {rank_phrase(ranks_of(f.ranks))} completed distributed operations during the window",
        evidence,
    )


def _data_moving(f: DataMoving) -> Said:
    return Said(
        f"not hung: {rank_phrase(ranks_of(f.communicating))} are inside "
        f"{op_summary(f.communicating)} and data is moving",
        [move_line(v) for v in f.communicating[:4]],
    )


def _working(f: Working) -> Said:
    return Said(
        f"not hung: no rank waits in a distributed operation; {rank_phrase(ranks_of(f.busy))} "
        f"{verb_for(f.busy, 'is', 'are')} working (CPU, I/O or changing stacks)",
        [Evidence(f"is {describe_rank(v)}", v.rank) for v in f.busy[:4]],
    )


def _ranks_gone(f: RanksGone) -> Said:
    gone, waiting = f.gone, f.waiting
    evidence = [f"{rank_phrase(gone)} of world size {f.world} {verb_for(gone, 'has', 'have')} no process"]
    if f.exited:
        evidence.append(f"{rank_phrase(f.exited)} exited during the capture")
    evidence += op_lines(waiting)
    waiting_on = in_ops(waiting)
    return Said(
        f"rank missing: {rank_phrase(gone)} {verb_for(gone, 'has', 'have')} no process while "
        f"{rank_phrase(ranks_of(waiting))} {verb_for(waiting, 'waits', 'wait')} {waiting_on}",
        evidence,
    )


def _init_split(f: InitSplit) -> Said:
    init_ranks, other_ranks = ranks_of(f.init), ranks_of(f.others)
    evidence: list[str | Evidence] = [
        *op_lines(f.init),
        *(Evidence(f"is {describe_rank(v)}", v.rank) for v in f.others),
    ]
    return Said(
        f"init deadlock: {rank_phrase(init_ranks)} {verb_for(init_ranks, 'waits', 'wait')} in "
        f"{op_summary(f.init)} while "
        f"{rank_phrase(other_ranks)} {'went past it' if f.went_past else 'never reached it'}",
        evidence,
    )


def _init_stuck(f: InitStuck) -> Said:
    evidence = op_lines(f.init)
    if f.env is not None:
        evidence.insert(0, env_line(f.env))
    summary = f"init deadlock: every rank waits in {op_summary(f.init)}"
    if f.differ:
        summary += f"; {rank_phrase(f.differ)} differ"
    return Said(summary, evidence)


def env_line(env: EnvSplit) -> str:
    desc = ", ".join(f"{env.key}={val} on {rank_phrase(r)}" for val, r in env.values.items())
    return f"ranks disagree on the rendezvous: {desc}"


def _cleanup_stuck(f: CleanupStuck) -> Said:
    culprits, training = ranks_of(f.cleanup), f.training
    where, short = once_per_object(cleanup_op), once_per_object(DistOp.describe)
    evidence: list[str | Evidence] = [
        Evidence(f"is on a cleanup path: {where(v.op) if v.op is not None else cleanup_where(v)}", v.rank)
        for v in f.cleanup
    ]
    evidence += op_lines(training)
    shorts = {short(v.op) if v.op is not None else cleanup_short(v) for v in f.cleanup}
    if not training:
        return Said(
            f"cleanup seen from one side: {rank_phrase(culprits)} left the training loop and "
            f"{verb_for(culprits, 'waits', 'wait')} in cleanup ({' / '.join(sorted(shorts))}); "
            f"{_unseen_words(f.unseen)}: if they wait in the training loop, this is a cleanup deadlock",
            evidence,
        )
    return Said(
        f"cleanup deadlock: {rank_phrase(culprits)} left the training loop and "
        f"{verb_for(culprits, 'waits', 'wait')} in cleanup "
        f"({' / '.join(sorted(shorts))}) "
        f"while {rank_phrase(ranks_of(training))} {verb_for(training, 'waits', 'wait')} "
        f"{in_ops(training)}",
        evidence,
    )


def _threads_race(f: ThreadsRace) -> Said:
    culprits = ranks_of(f.raced)
    by_text: dict[str, list[int]] = {}
    for v in f.raced:
        text = "; ".join(_thread_in_op(th, op) for th, op in _raced_ops(v))
        by_text.setdefault(text, []).append(v.rank)
    evidence = [f"{rank_phrase(ranks)}: {text}" for text, ranks in by_text.items()]
    evidence += op_lines(f.others)
    first = f.raced[0]
    pair = " and ".join(_thread_in_op(th, op) for th, op in _raced_ops(first)[:2])
    each = "each have" if len(culprits) > 1 else "has"
    return Said(
        f"collective mismatch: {rank_phrase(culprits)} {each} two threads in collectives on one process "
        f"group at once ({'on rank ' + str(first.rank) + ': ' if len(culprits) > 1 else ''}{pair}): "
        "the order in which a process's threads reach a group can differ between ranks, and "
        "then each rank waits in a collective the others issued second (a deadlock by issue order)",
        evidence,
    )


def _raced_ops(v: RankView) -> list[tuple[ThreadStack, DistOp]]:
    main = [(v.thread, v.op)] if v.thread is not None and v.op is not None else []
    return main + list(v.side_ops)


def _thread_in_op(thread: ThreadStack, op: DistOp) -> str:
    return f"thread '{thread.name or thread.thread_id}' in {op.describe()}"


def _straggling(f: Straggling) -> Said:
    culprits, waiting = ranks_of(f.outside), f.waiting
    evidence: list[str | Evidence] = [Evidence(f"is {describe_rank(v)}", v.rank) for v in f.outside]
    evidence += op_lines(waiting)
    doing = sorted({activity(v) for v in f.outside})
    return Said(
        f"straggler: {rank_phrase(culprits)} {verb_for(culprits, 'is', 'are')} {'/'.join(doing)} while "
        f"{rank_phrase(ranks_of(waiting))} {verb_for(waiting, 'waits', 'wait')} {in_ops(waiting)}",
        evidence,
    )


# what a process's kernel state says about why py-spy could not read it
def _unseen(f: Unseen) -> Said:
    unseen, waiting = ranks_of(f.unseen), f.waiting
    evidence: list[str | Evidence] = [
        Evidence(f"(pid {v.snap.process.pid}) could not be read: {unseen_reason(v)}", v.rank) for v in f.unseen
    ]
    evidence += op_lines(waiting)
    evidence.append(
        f"every rank that could be read waits {in_ops(waiting)}; "
        f"{rank_phrase(unseen)} {verb_for(unseen, 'is', 'are')} the only one{'' if len(unseen) == 1 else 's'} "
        f"not seen there: likely {verb_for(unseen, 'the rank', 'the ranks')} the others wait for, by "
        "elimination, not by a stack"
    )
    return Said(
        f"straggler: {rank_phrase(unseen)} could not be read while {rank_phrase(ranks_of(waiting))} "
        f"{verb_for(waiting, 'waits', 'wait')} {in_ops(waiting)}: likely "
        f"{verb_for(unseen, 'the rank', 'the ranks')} {verb_for(waiting, 'it waits', 'they wait')} for",
        evidence,
    )


def _apart(groups: Sequence[Sequence[RankView]]) -> list[str]:
    """Each group's op in words that tell the groups apart: where two read alike (one wrapper
    called from different places), the frame where their paths part is named."""
    plain = [op_site(vs[0].op) for vs in groups]
    if len(set(plain)) == len(plain):
        return plain
    paths = [[f.location for f in vs[0].op.path] if vs[0].op else [] for vs in groups]
    out = []
    for i, (vs, text) in enumerate(zip(groups, plain, strict=False)):
        op = vs[0].op
        others = [p for j, p in enumerate(paths) if j != i]
        depth = next((d for d in range(len(paths[i])) if all(d >= len(p) or p[d] != paths[i][d] for p in others)), None)
        if op is None or op.call_site is None or depth is None or plain.count(text) == 1:
            out.append(text)
        else:
            out.append(f"{op.name} ({op.call_site.location} from {paths[i][depth]})")
    return out


def _mismatch(f: Mismatch) -> Said:
    groups, culprits = f.groups, f.culprits
    where = _apart(groups)
    evidence = [
        f"{rank_phrase(ranks_of(vs))} {verb_for(vs, 'waits', 'wait')} in {w}" + frame_tail(vs[0])
        for vs, w in zip(groups, where, strict=False)
    ]
    p2p = [p2p_line(p) for p in f.p2p]
    evidence += p2p
    if f.by_peers and p2p:
        summary = "collective mismatch: point-to-point calls do not pair up: " + "; ".join(p2p[:2])
    elif f.waiting_for_members:
        summary, more = _members_elsewhere(f.waiting_for_members, groups, where)
        evidence.append(more)
    elif f.structure is not None:
        summary, more = _left_structure(f.structure, culprits)
        evidence.append(more)
    elif f.parted and f.by_tree:
        (_, common), *others = f.parted
        left = " / ".join(sorted({op_site(v.op) for _, vs in others for v in vs[:1]}))
        summary = (
            f"collective mismatch: {rank_phrase(culprits)} left the others' path for {left}, "
            f"while the other {_count(common)} wait in {len(groups) - 1} ops at "
            "different places, as ranks of different process groups may"
        )
        evidence.append(
            "the paths part at the first frame where the ranks call different "
            "functions: "
            + "; ".join(f"{_count(vs)} in {frame}" for frame, vs in f.parted)
            + f"; {rank_phrase(culprits)} are fewer than the ranks at any one place of the others"
        )
    elif f.parted:
        (_, common), *others = f.parted
        left = " / ".join(str(frame) for frame, _ in others)
        summary = (
            f"collective mismatch: {rank_phrase(culprits)} left the others' path into {left} "
            f"while {rank_phrase(ranks_of(common))} are in {f.parted[0][0]}"
        )
        evidence.append(
            "the paths part at the first frame where the ranks call different "
            "functions: " + "; ".join(f"{rank_phrase(ranks_of(vs))} in {frame}" for frame, vs in f.parted)
        )
    elif len(groups) > 1:
        minority = [v for vs in groups[1:] for v in vs] if culprits else []
        if culprits and minority:
            majority = groups[0]
            told_apart = where != [op_site(vs[0].op) for vs in groups]  # a wrapper's callers named
            minority_where = " / ".join(sorted(set(where[1:]))) if told_apart else op_summary(minority)
            summary = (
                f"collective mismatch: {rank_phrase(culprits)} "
                f"{'is' if len(culprits) == 1 else 'are'} in {minority_where} while "
                f"{rank_phrase(ranks_of(majority))} are in {where[0]}"
            )
        elif len(groups) > 2 and 2 * len(groups[0]) <= sum(map(len, groups)):
            total = sum(map(len, groups))
            summary = (
                f"collective mismatch: ranks wait in {len(groups)} ops and none holds most "
                f"of them (the largest, {where[0]}, {len(groups[0]):,} of {total:,}): ranks "
                "of different process groups may wait apart legitimately, and no small set "
                "of ranks is off the others' path, so no rank is named"
            )
        else:
            summary = "collective mismatch: " + "; ".join(
                f"{_brief(ranks_of(vs))} in {w}" for vs, w in zip(groups, where, strict=False)
            )
    else:
        summary = "collective mismatch: point-to-point calls do not pair up: " + (p2p[0] if p2p else "")
    return Said(summary, evidence)


def _members_elsewhere(
    few: Sequence[RankView], groups: Sequence[Sequence[RankView]], where: Sequence[str]
) -> tuple[str, str]:
    """The summary and an evidence line for ranks in collectives on passed groups whose
    fellow members wait in the others' op."""
    named = {v.rank for v in few}
    theirs = [w for vs, w in zip(groups, where, strict=False) if vs[0].rank in named]
    rest = [v for vs in groups for v in vs if v.rank not in named]
    others = [w for vs, w in zip(groups, where, strict=False) if vs[0].rank not in named]
    on_world = all((read := op_scope(v.op)) is not None and read.scope is Scope.WORLD for v in rest)
    scope = "on WORLD" if on_world else "(on WORLD or a group of theirs)"
    summary = (
        f"collective mismatch: {rank_phrase(ranks_of(few))} {verb_for(few, 'waits', 'wait')} in "
        f"{' / '.join(theirs)} on a group {verb_for(few, 'its', 'their')} caller passed, while "
        f"{rank_phrase(ranks_of(rest))} are in {' / '.join(others)} {scope}: a member of "
        f"{verb_for(few, 'its', 'their')} group is in the others' op, so either it skipped "
        f"this collective (or calls it later) or {rank_phrase(ranks_of(few))} skipped the others' "
        "op; stacks do not say which, so no rank is named"
    )
    evidence = (
        "a collective on a group its caller passed completes once every member of the "
        f"group has entered it, so a member of the group of {rank_phrase(ranks_of(few))} is not in "
        "it, and every other rank is in the others' op: the order each rank issued its "
        "ops (the flight recorder's sequence numbers, through the in-process probe: `hangdoc run -- CMD`, or "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL logs) names the rank that skipped one"
    )
    return summary, evidence


def _left_structure(s: Structure, culprits: Sequence[int]) -> tuple[str, str]:
    """The summary and an evidence line for ranks on WORLD that left a structure of groups."""
    named = set(culprits)
    world = [vs for vs in s.world if vs and vs[0].rank in named]
    where = " / ".join(sorted({op_site(vs[0].op) for vs in world})) or "a WORLD op"
    structure = [v for vs in s.part for v in vs]
    summary = (
        f"collective mismatch: {rank_phrase(culprits)} {verb_for(culprits, 'is', 'are')} in {where} on "
        f"WORLD, which waits for every rank, while the other {_count(structure)} wait in "
        f"{len(s.part)} ops on groups their callers passed: {verb_for(culprits, 'it', 'they')} "
        "left the group structure"
    )
    evidence = (
        "a collective on a group its caller passed waits only for that group's members, "
        f"so the {_count(structure)} at {len(s.part)} places wait apart legitimately; one on "
        f"WORLD waits for every rank: the groups of {rank_phrase(culprits)} wait for "
        f"{verb_for(culprits, 'it', 'them')} in their ops, and {verb_for(culprits, 'it waits', 'they wait')} "
        "for everyone"
    )
    return summary, evidence


def _groups_apart(f: GroupsApart) -> Said:
    ranks = [v for vs in f.groups for v in vs]
    where = _apart(f.groups)
    evidence = [
        f"{_count(vs)} ({rank_phrase(ranks_of(vs))}) {verb_for(vs, 'waits', 'wait')} in {w}"
        for vs, w in zip(f.groups, where, strict=False)
    ]
    evidence.append(
        f"each op runs on a group its caller passed, and each holds a multiple of "
        f"{f.size} ranks: every place may hold whole groups; stacks do not show which "
        "ranks each group has, nor what a whole group waits for"
    )
    return Said(
        f"every rank in an op ({_count(ranks)}) waits on a group its caller passed, at "
        f"{len(f.groups)} places: ranks of different groups wait apart legitimately, and no small "
        "set of ranks is outside that structure, so no rank is named",
        evidence,
    )


def _brief(ranks: Sequence[int]) -> str:
    """``ranks 0-3,8`` where that is short to read, else how many (``1,997 ranks``): a
    summary names the ranks of each side, not thousands of numbers."""
    said = rank_phrase(ranks)
    return said if len(said) <= _BRIEF else _count(ranks)


_BRIEF = 80  # characters: one line of a terminal


def _count(views: Sequence[object]) -> str:
    """``1 rank`` / ``1,997 ranks``."""
    return f"{len(views):,} rank{'' if len(views) == 1 else 's'}"


def p2p_line(p: P2PFact) -> str:
    """One send/recv that cannot complete."""
    if isinstance(p, AllReceive):
        return f"{rank_phrase(p.receivers)} all receive and no rank sends"
    op = p.op
    return (
        f"rank {p.rank} {'receives from' if p.receiving else 'sends to'} rank {p.peer} "
        f"({op.call_site.location if op.call_site else op.name}), but rank {p.peer} "
        f"is in {op_site(p.peer_op) if p.peer_op else 'no distributed op'}"
    )


def _same_op(f: SameOp) -> Said:
    op = f.waiting[0].op
    assert op is not None
    return Said(
        f"transport hang: every rank ({rank_phrase(ranks_of(f.waiting))}) waits in the same {op_site(op)} "
        "and no data moves",
        op_lines(f.waiting),
    )


def _seen_in_one_op(f: SeenInOneOp) -> Said:
    op = f.waiting[0].op
    assert op is not None
    return Said(
        f"every rank seen ({rank_phrase(ranks_of(f.waiting))}) waits in the same {op_site(op)}, and "
        f"{_unseen_words(f.unseen)}: if they wait there too, suspect the transport "
        "(nccl_timeout); one that is elsewhere is what the others wait for",
        op_lines(f.waiting),
    )


def _unseen_words(unseen: Sequence[int]) -> str:
    if not unseen:
        return "the job's other ranks were not seen"
    return f"{rank_phrase(unseen)} {verb_for(unseen, 'was', 'were')} not seen"


def _teardown(f: Teardown) -> Said:
    op = f.waiting[0].op
    assert op is not None
    return Said(
        f"teardown hang: every rank ({rank_phrase(ranks_of(f.waiting))}) waits in the same {op_site(op)} on "
        "its way out, and no data moves",
        op_lines(f.waiting),
    )


NOT_VISIBLE = (
    "stacks cannot tell which collective a device waits in: a transport problem and "
    "ranks that queued different collectives before their host sync look alike"
)


def _device_waits(f: DeviceWaits) -> Said:
    ranks = ranks_of([*f.device, *f.known])
    evidence = op_lines([*f.known, *f.device])
    evidence.append(
        f"{rank_phrase(ranks_of(f.device))} {verb_for(f.device, 'spins', 'spin')} or "
        f"{verb_for(f.device, 'sleeps', 'sleep')} "
        "at a host sync, with no torch.distributed frame on the stack: collectives on a GPU "
        "are asynchronous, so a rank blocks at the next point that waits for its device; "
        "its CPU there is no progress"
    )
    if f.one_site:
        evidence.append(NOT_VISIBLE)
        return Said(
            f"transport hang?: every rank ({rank_phrase(ranks)}) waits for device work at the same "
            f"{op_site(f.device[0].op)} and nothing moves; {NOT_VISIBLE}",
            evidence,
        )
    evidence.append(
        NOT_VISIBLE + "; ranks at different host syncs may still wait in one "
        "collective, so no mismatch is inferred from where they stopped"
    )
    apart = "; ".join(f"{rank_phrase(r)} {k}" for k, r in _by_where([*f.known, *f.device]).items())
    return Said(
        f"every rank waits, but not all in a collective stacks can name: {apart}; which "
        "collective each device waits in is not visible, so a transport hang cannot be told "
        "from a mismatch",
        evidence,
    )


def _by_where(views: Sequence[RankView]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = defaultdict(list)
    said = once_per_object(in_op)
    for v in views:
        if v.op is not None:
            found[said(v.op)].append(v.rank)
    return {k: sorted(r) for k, r in found.items()}


RACE_NEXT_STEPS = (
    (
        "Give the side thread a process group of its own: create it with dist.new_group() on "
        "every rank (every rank creates every group, in the same order) and pass it to that "
        "thread's collectives (group=...); or issue those collectives from the main thread."
    ),
    (
        "Relaunch with TORCH_DISTRIBUTED_DEBUG=DETAIL to log every collective with ranks and "
        "shapes, and the thread that issued it."
    ),
)

GROUPS_NEXT_STEPS = (
    (
        "Stacks cannot tell which ranks each process group holds: relaunch with the flight "
        "recorder (TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1) and read its "
        "dump (torchfrtrace), which matches every group's collectives by member."
    ),
    *NEXT_STEPS[Verdict.UNKNOWN],
)


DEVICE_NEXT_STEPS = (
    (
        "Stacks cannot tell which collective the GPUs wait in: relaunch with the flight recorder "
        "(TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1) and read its dump "
        "(torchfrtrace), or with NCCL_DEBUG=INFO; `py-spy dump --native` shows the CUDA call "
        "each rank blocks in."
    ),
    (
        "Check that every rank queues the same collectives in the same order before the host "
        "sync quoted above; if they do, suspect the transport (NCCL_DEBUG=INFO, "
        "NCCL_SOCKET_IFNAME, link state) or GPU health (nvidia-smi, dmesg for Xid errors)."
    ),
)


# the sentences of each rule outcome
_SAY: dict[type, Callable[[Any], Said]] = {
    NothingCaptured: _nothing_captured,
    Progressing: _progressing,
    DataMoving: _data_moving,
    Working: _working,
    RanksGone: _ranks_gone,
    InitSplit: _init_split,
    InitStuck: _init_stuck,
    CleanupStuck: _cleanup_stuck,
    Straggling: _straggling,
    Unseen: _unseen,
    Mismatch: _mismatch,
    SameOp: _same_op,
    Unexplained: _unexplained,
    WaitsOutside: _waits_outside,
    DeviceWaits: _device_waits,
    SeenInOneOp: _seen_in_one_op,
    Teardown: _teardown,
    GroupsApart: _groups_apart,
    ThreadsRace: _threads_race,
}
