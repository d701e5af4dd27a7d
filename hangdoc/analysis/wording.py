"""The words of a diagnosis: summary, evidence lines, next steps, one line per rank.

``classify`` decides the verdict and returns the facts it found (the types below, one per
rule outcome); this module turns those facts into sentences and knows nothing of the rules.
It imports only the model and the views, never ``classify``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..memo import once_per_object
from ..model import (
    CaptureErrorKind,
    DistOp,
    Frame,
    RankState,
    ThreadStack,
    Verdict,
)
from ..rankranges import rank_phrase
from .device import waits_for_device
from .locks import REENTRANT, LockEdge, LockGraph
from .ops import exit_frame
from .structure import Scope, Structure, op_scope
from .views import RankView, op_keys

NEXT_STEPS: dict[Verdict, tuple[str, ...]] = {
    Verdict.NOT_HUNG: (
        ("The job is moving; if it is slower than expected, profile a step (py-spy record) "
        "rather than looking for a hang."),
    ),
    Verdict.CLEANUP_DEADLOCK: (
        ("Find the exception on the culprit ranks: it was raised in the training loop and is now "
        "being handled by cleanup code; look at their logs for a traceback."),
        ("Do not synchronise (barrier, destroy_process_group, collective checkpointing) in "
        "__exit__/finally/atexit paths that only some ranks reach; let the launcher tear the job down."),
        "Relaunch with TORCH_DISTRIBUTED_DEBUG=DETAIL to log every collective with ranks and shapes.",
    ),
    Verdict.COLLECTIVE_MISMATCH: (
        ("Make every rank of the group issue the same collectives in the same order: look for "
        "rank-dependent branches, uneven batches per rank and early exits around the call sites "
        "quoted above."),
        ("Relaunch with TORCH_DISTRIBUTED_DEBUG=DETAIL (checks that collectives match across ranks) "
        "and NCCL_DEBUG=INFO."),
        ("For uneven data with DDP, use the Join context manager or drop_last=True in the "
        "DistributedSampler."),
    ),
    Verdict.NCCL_TIMEOUT: (
        ("Every rank is in the same collective: suspect the transport, not the code. Check the "
        "network between the nodes (NCCL_DEBUG=INFO, NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, "
        "firewalls, link state) and GPU health."),
        ("Lower the collective timeout so the job fails fast instead of hanging "
        "(init_process_group(timeout=...), NCCL_TIMEOUT=300)."),
    ),
    Verdict.STRAGGLER: (
        ("Look at what the culprit ranks are doing (quoted above): an endless loop, a lock held "
        "by another thread, I/O that never returns."),
        ("Attach to a culprit with `py-spy dump --pid PID --locals` (add --native for C "
        "extensions) to see the values involved."),
    ),
    Verdict.RANK_MISSING: (
        ("Find out why the missing ranks have no process: their launcher's log, `dmesg` (OOM "
        "killer), the scheduler's record of the node."),
        ("Lower the collective timeout so the job fails fast when a rank dies "
        "(init_process_group(timeout=...), NCCL_TIMEOUT=300), and let the launcher restart it."),
    ),
    Verdict.INIT_DEADLOCK: (
        ("Check that every rank calls init_process_group/new_group with the same arguments, in "
        "the same order, and that MASTER_ADDR, MASTER_PORT and WORLD_SIZE agree."),
        ("Relaunch with TORCH_DISTRIBUTED_DEBUG=DETAIL and TORCH_CPP_LOG_LEVEL=INFO to log "
        "rendezvous."),
    ),
    Verdict.UNKNOWN: (
        "Run again with a longer window (--window) and native frames (--native).",
    ),
}


# -- the facts the rules found (one type per outcome of ``classify``) -------------------


@dataclass(frozen=True)
class NothingCaptured:
    """No rank could be captured at all."""


@dataclass(frozen=True)
class Progressing:
    """These ranks completed distributed operations during the window (``waiting``: the
    ranks that did not, and sat in one op the whole window)."""

    ranks: Sequence[RankView]
    waiting: Sequence[RankView] = ()


@dataclass(frozen=True)
class DataMoving:
    """Nobody waits; these ranks are inside an op and bytes or CPU move."""

    communicating: Sequence[RankView]


@dataclass(frozen=True)
class Unseen:
    """Every readable rank waits in one op; ``unseen`` could not be read at all."""

    unseen: Sequence[RankView]
    waiting: Sequence[RankView]


@dataclass(frozen=True)
class Working:
    """Nobody is in a distributed op; these ranks work (CPU, I/O, changing stacks)."""

    busy: Sequence[RankView]


@dataclass(frozen=True)
class RanksGone:
    """``gone`` (missing or ``exited``) have no process while ``waiting`` wait in an op."""

    gone: Sequence[int]
    exited: Sequence[int]
    world: int
    waiting: Sequence[RankView]


@dataclass(frozen=True)
class InitSplit:
    """``init`` wait in init/rendezvous; ``others`` went past it or never reached it."""

    init: Sequence[RankView]
    others: Sequence[RankView]
    went_past: bool


@dataclass(frozen=True)
class EnvSplit:
    """Ranks disagree on one rendezvous variable: value -> ranks, in the order first seen."""

    key: str
    values: Mapping[str | None, Sequence[int]]


@dataclass(frozen=True)
class InitStuck:
    """Every rank waits in init/rendezvous; ``differ`` are the odd ones out, if any."""

    init: Sequence[RankView]
    differ: Sequence[int]
    env: EnvSplit | None = None


@dataclass(frozen=True)
class CleanupStuck:
    """``cleanup`` left the training loop and wait in cleanup while ``training`` wait in an op;
    with no ``training`` rank seen, cleanup seen from one side: ``unseen`` were not seen."""

    cleanup: Sequence[RankView]
    training: Sequence[RankView]
    unseen: Sequence[int] = ()


@dataclass(frozen=True)
class ThreadsRace:
    """``raced`` have two threads or more waiting in collectives on one process group at
    once (``RankView.side_ops``): the order they reach the group is a race between ranks;
    ``others`` are the other ranks in an op."""

    raced: Sequence[RankView]
    others: Sequence[RankView]


@dataclass(frozen=True)
class Straggling:
    """``outside`` are outside any op (computing, blocked, stopped) while ``waiting`` wait."""

    outside: Sequence[RankView]
    waiting: Sequence[RankView]


@dataclass(frozen=True)
class Unpaired:
    """``rank`` sends to / receives from ``peer``, which is in ``peer_op`` (or none)."""

    rank: int
    op: DistOp
    receiving: bool
    peer: int
    peer_op: DistOp | None


@dataclass(frozen=True)
class AllReceive:
    """Every rank in an op receives, and none sends."""

    receivers: Sequence[int]


P2PFact = Unpaired | AllReceive


@dataclass(frozen=True)
class Mismatch:
    """Ranks wait in different ops: ``groups`` by op, largest first; ``p2p``: unpaired calls."""

    groups: Sequence[Sequence[RankView]]
    culprits: Sequence[int]
    p2p: Sequence[P2PFact] = ()
    by_peers: bool = False  # the culprits are named by the p2p calls, not as the minority
    # where the ranks' paths part when their ops name no minority: (frame, ranks), largest first
    parted: Sequence[tuple[Frame, Sequence[RankView]]] = ()
    # the culprits are on WORLD and the others wait on groups their callers passed, at
    # several places (``structure``): the culprits left that structure
    structure: Structure | None = None
    # the culprits are a path smaller than each place of a structure of groups, where the
    # paths part: named by the tree's shape alone
    by_tree: bool = False
    # the few ranks in collectives on groups their callers passed, while the rest wait in a
    # WORLD op: they wait for fellow members who are in the WORLD op, not named by stacks
    waiting_for_members: Sequence[RankView] = ()


@dataclass(frozen=True)
class GroupsApart:
    """Every rank in an op waits on a group its caller passed, at several places, and each
    place could hold whole groups of ``size`` ranks: ranks of different groups wait apart
    legitimately, and no small set of ranks is outside that structure. ``from_lines``: the
    groups were read from call lines, not arguments."""

    groups: Sequence[Sequence[RankView]]
    size: int
    from_lines: bool = False


@dataclass(frozen=True)
class SameOp:
    """Every rank in an op waits in the same one and nothing moves."""

    waiting: Sequence[RankView]


@dataclass(frozen=True)
class SeenInOneOp:
    """Every rank seen waits in the same op; ``unseen`` ranks of the job were not seen, and
    what they do decides between a transport hang and a rank the others wait for."""

    waiting: Sequence[RankView]
    unseen: Sequence[int]


@dataclass(frozen=True)
class Teardown:
    """Every rank of the job waits in the same op on its way out (``destroy_process_group``,
    a barrier in ``__exit__``/``finally``, atexit)."""

    waiting: Sequence[RankView]


@dataclass(frozen=True)
class DeviceWaits:
    """Every rank in an op waits in it or at a host sync, at least one at a host sync
    (``device``), and their ops do not disagree: ``device`` wait for device work whose
    collective stacks do not show; ``known`` are in a torch.distributed op (one)."""

    device: Sequence[RankView]
    known: Sequence[RankView] = ()

    @property
    def one_site(self) -> bool:
        """Every rank waits at the same host sync (none in a torch.distributed op)."""
        key = op_keys()
        return not self.known and len({key(v.op) for v in self.device if v.op}) == 1


@dataclass(frozen=True)
class Unexplained:
    """Nobody is in a distributed op and nothing moves."""

    views: Sequence[RankView]


Facts = (
    NothingCaptured | Progressing | DataMoving | Working | RanksGone | InitSplit | InitStuck
    | CleanupStuck | Straggling | Unseen | Mismatch | SameOp | DeviceWaits | Unexplained
    | GroupsApart
    | SeenInOneOp | Teardown | ThreadsRace
)


class Words(NamedTuple):
    summary: str
    evidence: list[str]


# -- sentences from facts --------------------------------------------------------------


def words(facts: Facts) -> Words:
    """The summary and the evidence lines of one rule's facts (without the quiet line or notes)."""
    return _SAY[type(facts)](facts)


SEE_THE_REST = ("See the ranks that were not seen: diagnose the live job through an agent on "
                "every node (`hangdoc agent` there, then --agents NODE:7420,... or --hostfile FILE), "
                "or dump every rank (py-spy dump --pid PID for each).")


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
        lines.append(f"{rank_phrase(unknown)} {_v(unknown, 'was', 'were')} not seen (on a node not searched, "
                     "not in the dumps, or on a node that did not answer): nothing is concluded "
                     f"about {_v(unknown, 'it', 'them')}")
    if unreadable:
        lines.append(
            f"{rank_phrase([v.rank for v in unreadable])} could not be read: "
            + "; ".join(sorted({describe_rank(v) for v in unreadable}))
        )
    return lines


def partial_suffix(unknown: Sequence[int]) -> str:
    """Appended to a hang's summary when some ranks' state is unknown."""
    return f" (partial evidence: {rank_phrase(unknown)} unknown)"


def _ranks(views: Sequence[RankView]) -> list[int]:
    return [v.rank for v in views]


def _nothing_captured(_f: NothingCaptured) -> Words:
    return Words("No rank could be captured.", [])


def _unexplained(f: Unexplained) -> Words:
    return Words(
        "No rank is in a distributed operation and nothing moves; hangdoc cannot tell why.",
        [f"rank {v.rank}: {describe_rank(v)}" for v in f.views],
    )


def _progressing(f: Progressing) -> Words:
    evidence = [progress_line(v) for v in f.ranks[:4]]
    if len(f.waiting) > len(f.ranks):
        # a few moving among many stuck: say so, not "the job progresses"
        return Words(
            f"not hung, for now: only {rank_phrase(_ranks(f.ranks))} completed distributed operations "
            f"during the window while {rank_phrase(_ranks(f.waiting))} waited "
            f"{in_ops(f.waiting)} throughout",
            [*evidence, (f"{rank_phrase(_ranks(f.waiting))} did not move: if they wait for "
                         f"{rank_phrase(_ranks(f.ranks))}, they are slow; if not, the job is stuck "
                         "around them")],
        )
    return Words(
        f"not hung: {rank_phrase(_ranks(f.ranks))} completed distributed operations during the window",
        evidence,
    )


def _data_moving(f: DataMoving) -> Words:
    return Words(
        f"not hung: {rank_phrase(_ranks(f.communicating))} are inside "
        f"{op_summary(f.communicating)} and data is moving",
        [move_line(v) for v in f.communicating[:4]],
    )


def _working(f: Working) -> Words:
    return Words(
        f"not hung: no rank waits in a distributed operation; {rank_phrase(_ranks(f.busy))} "
        f"{_v(f.busy, 'is', 'are')} working (CPU, I/O or changing stacks)",
        [f"rank {v.rank} is {describe_rank(v)}" for v in f.busy[:4]],
    )


def _ranks_gone(f: RanksGone) -> Words:
    gone, waiting = f.gone, f.waiting
    evidence = [f"{rank_phrase(gone)} of world size {f.world} {_v(gone, 'has', 'have')} no process"]
    if f.exited:
        evidence.append(f"{rank_phrase(f.exited)} exited during the capture")
    evidence += op_lines(waiting)
    waiting_on = in_ops(waiting)
    return Words(
        f"rank missing: {rank_phrase(gone)} {_v(gone, 'has', 'have')} no process while "
        f"{rank_phrase(_ranks(waiting))} {_v(waiting, 'waits', 'wait')} {waiting_on}",
        evidence,
    )


def _init_split(f: InitSplit) -> Words:
    init_ranks, other_ranks = _ranks(f.init), _ranks(f.others)
    evidence = op_lines(f.init) + [f"rank {v.rank} is {describe_rank(v)}" for v in f.others]
    return Words(
        f"init deadlock: {rank_phrase(init_ranks)} {_v(init_ranks, 'waits', 'wait')} in "
        f"{op_summary(f.init)} while "
        f"{rank_phrase(other_ranks)} {'went past it' if f.went_past else 'never reached it'}",
        evidence,
    )


def _init_stuck(f: InitStuck) -> Words:
    evidence = op_lines(f.init)
    if f.env is not None:
        evidence.insert(0, env_line(f.env))
    summary = f"init deadlock: every rank waits in {op_summary(f.init)}"
    if f.differ:
        summary += f"; {rank_phrase(f.differ)} differ"
    return Words(summary, evidence)


def env_line(env: EnvSplit) -> str:
    desc = ", ".join(f"{env.key}={val} on {rank_phrase(r)}" for val, r in env.values.items())
    return f"ranks disagree on the rendezvous: {desc}"


def _cleanup_stuck(f: CleanupStuck) -> Words:
    culprits, training = _ranks(f.cleanup), f.training
    where, short = once_per_object(_cleanup_op), once_per_object(DistOp.describe)
    evidence = [f"rank {v.rank} is on a cleanup path: "
                f"{where(v.op) if v.op is not None else cleanup_where(v)}" for v in f.cleanup]
    evidence += op_lines(training)
    shorts = {short(v.op) if v.op is not None else cleanup_short(v) for v in f.cleanup}
    if not training:
        return Words(
            f"cleanup seen from one side: {rank_phrase(culprits)} left the training loop and "
            f"{_v(culprits, 'waits', 'wait')} in cleanup ({' / '.join(sorted(shorts))}); "
            f"{_unseen_words(f.unseen)}: if they wait in the training loop, this is a cleanup deadlock",
            evidence,
        )
    return Words(
        f"cleanup deadlock: {rank_phrase(culprits)} left the training loop and "
        f"{_v(culprits, 'waits', 'wait')} in cleanup "
        f"({' / '.join(sorted(shorts))}) "
        f"while {rank_phrase(_ranks(training))} {_v(training, 'waits', 'wait')} "
        f"{in_ops(training)}",
        evidence,
    )


def _threads_race(f: ThreadsRace) -> Words:
    culprits = _ranks(f.raced)
    by_text: dict[str, list[int]] = {}
    for v in f.raced:
        text = "; ".join(_thread_in_op(th, op) for th, op in _raced_ops(v))
        by_text.setdefault(text, []).append(v.rank)
    evidence = [f"{rank_phrase(ranks)}: {text}" for text, ranks in by_text.items()]
    evidence += op_lines(f.others)
    first = f.raced[0]
    pair = " and ".join(_thread_in_op(th, op) for th, op in _raced_ops(first)[:2])
    each = "each have" if len(culprits) > 1 else "has"
    return Words(
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


def _straggling(f: Straggling) -> Words:
    culprits, waiting = _ranks(f.outside), f.waiting
    evidence = [f"rank {v.rank} is {describe_rank(v)}" for v in f.outside]
    evidence += op_lines(waiting)
    doing = sorted({activity(v) for v in f.outside})
    return Words(
        f"straggler: {rank_phrase(culprits)} {_v(culprits, 'is', 'are')} {'/'.join(doing)} while "
        f"{rank_phrase(_ranks(waiting))} {_v(waiting, 'waits', 'wait')} {in_ops(waiting)}",
        evidence,
    )


_ERROR_MEANS = {
    CaptureErrorKind.TIMEOUT: "py-spy timed out",
    CaptureErrorKind.PTRACE_DENIED: "ptrace refused",
    CaptureErrorKind.NOT_PYTHON: "no Python interpreter found",
    CaptureErrorKind.PYSPY_FAILED: "py-spy failed",
    CaptureErrorKind.PYSPY_MISSING: "no py-spy",
}

# what a process's kernel state says about why py-spy could not read it
_STATUS_MEANS = {
    "disk-sleep": "in uninterruptible sleep (D): stuck in the kernel, on a dead filesystem or device",
    "stopped": "stopped (SIGSTOP or a debugger)",
    "tracing-stop": "stopped by a tracer",
    "zombie": "exited, not yet reaped",
}


def unseen_reason(v: RankView) -> str:
    """Why a rank could not be read, with what its process state says: ``py-spy timed out;
    process in uninterruptible sleep (D): ...``."""
    last = v.snap.samples[-1] if v.snap.samples else None
    error = last.error if last is not None else None
    reason = _ERROR_MEANS.get(error.kind, error.kind.value) if error is not None else "no stack"
    status = last.state.status if last is not None and last.state is not None else None
    if status in _STATUS_MEANS:
        reason += f"; process {_STATUS_MEANS[status]}"
    elif status:
        reason += f"; process {status}"
    return reason


def _unseen(f: Unseen) -> Words:
    unseen, waiting = _ranks(f.unseen), f.waiting
    evidence = [f"rank {v.rank} (pid {v.snap.process.pid}) could not be read: {unseen_reason(v)}"
                for v in f.unseen]
    evidence += op_lines(waiting)
    evidence.append(
        f"every rank that could be read waits {in_ops(waiting)}; "
        f"{rank_phrase(unseen)} {_v(unseen, 'is', 'are')} the only one{'' if len(unseen) == 1 else 's'} "
        "not seen there: the likely rank(s) the others wait for, by elimination, not by a stack"
    )
    return Words(
        f"straggler: {rank_phrase(unseen)} could not be read while {rank_phrase(_ranks(waiting))} "
        f"{_v(waiting, 'waits', 'wait')} {in_ops(waiting)}: likely the rank(s) they wait for",
        evidence,
    )


def _apart(groups: Sequence[Sequence[RankView]]) -> list[str]:
    """Each group's op in words that tell the groups apart: where two read alike (one wrapper
    called from different places), the frame where their paths part is named."""
    plain = [_where(vs[0].op) for vs in groups]
    if len(set(plain)) == len(plain):
        return plain
    paths = [[f.location for f in vs[0].op.path] if vs[0].op else [] for vs in groups]
    out = []
    for i, (vs, text) in enumerate(zip(groups, plain)):
        op = vs[0].op
        others = [p for j, p in enumerate(paths) if j != i]
        depth = next((d for d in range(len(paths[i]))
                      if all(d >= len(p) or p[d] != paths[i][d] for p in others)), None)
        if op is None or op.call_site is None or depth is None or plain.count(text) == 1:
            out.append(text)
        else:
            out.append(f"{op.name} ({op.call_site.location} from {paths[i][depth]})")
    return out


def _mismatch(f: Mismatch) -> Words:
    groups, culprits = f.groups, f.culprits
    where = _apart(groups)
    evidence = [
        f"{rank_phrase(_ranks(vs))} {_v(vs, 'waits', 'wait')} in {w}" + frame_tail(vs[0])
        for vs, w in zip(groups, where)
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
        left = " / ".join(sorted({_where(v.op) for _, vs in others for v in vs[:1]}))
        summary = (f"collective mismatch: {rank_phrase(culprits)} left the others' path for {left}, "
                   f"while the other {_count(common)} wait in {len(groups) - 1} ops at "
                   "different places, as ranks of different process groups may")
        evidence.append("the paths part at the first frame where the ranks call different "
                        "functions: " + "; ".join(f"{_count(vs)} in {frame}" for frame, vs in f.parted)
                        + f"; {rank_phrase(culprits)} are fewer than the ranks at any one place of the others")
    elif f.parted:
        (_, common), *others = f.parted
        left = " / ".join(str(frame) for frame, _ in others)
        summary = (f"collective mismatch: {rank_phrase(culprits)} left the others' path into {left} "
                   f"while {rank_phrase(_ranks(common))} are in {f.parted[0][0]}")
        evidence.append("the paths part at the first frame where the ranks call different "
                        "functions: " + "; ".join(f"{rank_phrase(_ranks(vs))} in {frame}"
                                                  for frame, vs in f.parted))
    elif len(groups) > 1:
        minority = [v for vs in groups[1:] for v in vs] if culprits else []
        if culprits and minority:
            majority = groups[0]
            told_apart = where != [_where(vs[0].op) for vs in groups]  # a wrapper's callers named
            minority_where = " / ".join(sorted(set(where[1:]))) if told_apart else op_summary(minority)
            summary = (
                f"collective mismatch: {rank_phrase(culprits)} "
                f"{'is' if len(culprits) == 1 else 'are'} in {minority_where} while "
                f"{rank_phrase(_ranks(majority))} are in {where[0]}"
            )
        elif len(groups) > 2 and 2 * len(groups[0]) <= sum(map(len, groups)):
            total = sum(map(len, groups))
            summary = (f"collective mismatch: ranks wait in {len(groups)} ops and none holds most "
                       f"of them (the largest, {where[0]}, {len(groups[0]):,} of {total:,}): ranks "
                       "of different process groups may wait apart legitimately, and no small set "
                       "of ranks is off the others' path, so no rank is named")
        else:
            summary = "collective mismatch: " + "; ".join(
                f"{_brief(_ranks(vs))} in {w}" for vs, w in zip(groups, where)
            )
    else:
        summary = "collective mismatch: point-to-point calls do not pair up: " + (
            p2p[0] if p2p else ""
        )
    return Words(summary, evidence)


def _members_elsewhere(few: Sequence[RankView], groups: Sequence[Sequence[RankView]],
                       where: Sequence[str]) -> tuple[str, str]:
    """The summary and an evidence line for ranks in collectives on passed groups whose
    fellow members wait in the others' op."""
    named = {v.rank for v in few}
    theirs = [w for vs, w in zip(groups, where) if vs[0].rank in named]
    rest = [v for vs in groups for v in vs if v.rank not in named]
    others = [w for vs, w in zip(groups, where) if vs[0].rank not in named]
    on_world = all((read := op_scope(v.op)) is not None and read.scope is Scope.WORLD for v in rest)
    scope = "on WORLD" if on_world else "(on WORLD or a group of theirs)"
    summary = (f"collective mismatch: {rank_phrase(_ranks(few))} {_v(few, 'waits', 'wait')} in "
               f"{' / '.join(theirs)} on a group {_v(few, 'its', 'their')} caller passed, while "
               f"{rank_phrase(_ranks(rest))} are in {' / '.join(others)} {scope}: a member of "
               f"{_v(few, 'its', 'their')} group is in the others' op, so either it skipped "
               f"this collective (or calls it later) or {rank_phrase(_ranks(few))} skipped the others' "
               "op; stacks do not say which, so no rank is named")
    evidence = ("a collective on a group its caller passed completes once every member of the "
                f"group has entered it, so a member of the group of {rank_phrase(_ranks(few))} is not in "
                "it, and every other rank is in the others' op: the order each rank issued its "
                "ops (the flight recorder's sequence numbers, through `hangdoc probe`, or "
                "TORCH_DISTRIBUTED_DEBUG=DETAIL logs) names the rank that skipped one")
    return summary, evidence


def _left_structure(s: Structure, culprits: Sequence[int]) -> tuple[str, str]:
    """The summary and an evidence line for ranks on WORLD that left a structure of groups."""
    named = set(culprits)
    world = [vs for vs in s.world if vs and vs[0].rank in named]
    where = " / ".join(sorted({_where(vs[0].op) for vs in world})) or "a WORLD op"
    structure = [v for vs in s.part for v in vs]
    summary = (f"collective mismatch: {rank_phrase(culprits)} {_v(culprits, 'is', 'are')} in {where} on "
               f"WORLD, which waits for every rank, while the other {_count(structure)} wait in "
               f"{len(s.part)} ops on groups their callers passed: {_v(culprits, 'it', 'they')} "
               "left the group structure")
    evidence = ("a collective on a group its caller passed waits only for that group's members, "
                f"so the {_count(structure)} at {len(s.part)} places wait apart legitimately; one on "
                f"WORLD waits for every rank: the groups of {rank_phrase(culprits)} wait for "
                f"{_v(culprits, 'it', 'them')} in their ops, and {_v(culprits, 'it waits', 'they wait')} "
                "for everyone")
    return summary, evidence


def _groups_apart(f: GroupsApart) -> Words:
    ranks = [v for vs in f.groups for v in vs]
    where = _apart(f.groups)
    evidence = [f"{_count(vs)} ({rank_phrase(_ranks(vs))}) {_v(vs, 'waits', 'wait')} in {w}"
                for vs, w in zip(f.groups, where)]
    evidence.append(f"each op runs on a group its caller passed, and each holds a multiple of "
                    f"{f.size} ranks: every place may hold whole groups; stacks do not show which "
                    "ranks each group has, nor what a whole group waits for")
    return Words(
        f"every rank in an op ({_count(ranks)}) waits on a group its caller passed, at "
        f"{len(f.groups)} places: ranks of different groups wait apart legitimately, and no small "
        "set of ranks is outside that structure, so no rank is named", evidence)


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
        f"is in {_where(p.peer_op) if p.peer_op else 'no distributed op'}"
    )


def _same_op(f: SameOp) -> Words:
    op = f.waiting[0].op
    assert op is not None
    return Words(
        f"transport hang: every rank ({rank_phrase(_ranks(f.waiting))}) waits in the same {_where(op)} "
        "and no data moves",
        op_lines(f.waiting),
    )


def _seen_in_one_op(f: SeenInOneOp) -> Words:
    op = f.waiting[0].op
    assert op is not None
    return Words(
        f"every rank seen ({rank_phrase(_ranks(f.waiting))}) waits in the same {_where(op)}, and "
        f"{_unseen_words(f.unseen)}: if they wait there too, suspect the transport "
        "(nccl_timeout); one that is elsewhere is what the others wait for",
        op_lines(f.waiting),
    )


def _unseen_words(unseen: Sequence[int]) -> str:
    if not unseen:
        return "the job's other ranks were not seen"
    return f"{rank_phrase(unseen)} {_v(unseen, 'was', 'were')} not seen"


def _teardown(f: Teardown) -> Words:
    op = f.waiting[0].op
    assert op is not None
    return Words(
        f"teardown hang: every rank ({rank_phrase(_ranks(f.waiting))}) waits in the same {_where(op)} on "
        "its way out, and no data moves",
        op_lines(f.waiting),
    )


NOT_VISIBLE = ("stacks cannot tell which collective a device waits in: a transport problem and "
               "ranks that queued different collectives before their host sync look alike")


def _device_waits(f: DeviceWaits) -> Words:
    ranks = _ranks([*f.device, *f.known])
    evidence = op_lines([*f.known, *f.device])
    evidence.append(
        f"{rank_phrase(_ranks(f.device))} {_v(f.device, 'spins', 'spin')} or {_v(f.device, 'sleeps', 'sleep')} "
        "at a host sync, with no torch.distributed frame on the stack: collectives on a GPU "
        "are asynchronous, so a rank blocks at the next point that waits for its device; "
        "its CPU there is no progress")
    if f.one_site:
        evidence.append(NOT_VISIBLE)
        return Words(
            f"transport hang?: every rank ({rank_phrase(ranks)}) waits for device work at the same "
            f"{_where(f.device[0].op)} and nothing moves; {NOT_VISIBLE}", evidence)
    evidence.append(NOT_VISIBLE + "; ranks at different host syncs may still wait in one "
                    "collective, so no mismatch is inferred from where they stopped")
    apart = "; ".join(f"{rank_phrase(r)} {k}" for k, r in _by_where([*f.known, *f.device]).items())
    return Words(
        f"every rank waits, but not all in a collective stacks can name: {apart}; which "
        "collective each device waits in is not visible, so a transport hang cannot be told "
        "from a mismatch", evidence)


def _by_where(views: Sequence[RankView]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = defaultdict(list)
    said = once_per_object(in_op)
    for v in views:
        if v.op is not None:
            found[said(v.op)].append(v.rank)
    return {k: sorted(r) for k, r in found.items()}


RACE_NEXT_STEPS = (
    ("Give the side thread a process group of its own: create it with dist.new_group() on "
     "every rank (every rank creates every group, in the same order) and pass it to that "
     "thread's collectives (group=...); or issue those collectives from the main thread."),
    ("Relaunch with TORCH_DISTRIBUTED_DEBUG=DETAIL to log every collective with ranks and "
     "shapes, and the thread that issued it."),
)

GROUPS_NEXT_STEPS = (
    ("Stacks cannot tell which ranks each process group holds: relaunch with the flight "
     "recorder (TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1) and read its "
     "dump (torchfrtrace), which matches every group's collectives by member."),
    *NEXT_STEPS[Verdict.UNKNOWN],
)


DEVICE_NEXT_STEPS = (
    ("Stacks cannot tell which collective the GPUs wait in: relaunch with the flight recorder "
     "(TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1) and read its dump "
     "(torchfrtrace), or with NCCL_DEBUG=INFO; `py-spy dump --native` shows the CUDA call "
     "each rank blocks in."),
    ("Check that every rank queues the same collectives in the same order before the host "
     "sync quoted above; if they do, suspect the transport (NCCL_DEBUG=INFO, "
     "NCCL_SOCKET_IFNAME, link state) or GPU health (nvidia-smi, dmesg for Xid errors)."),
)


# the sentences of each rule outcome
_SAY: dict[type, Callable[[Any], Words]] = {
    NothingCaptured: _nothing_captured, Progressing: _progressing, DataMoving: _data_moving,
    Working: _working, RanksGone: _ranks_gone, InitSplit: _init_split, InitStuck: _init_stuck,
    CleanupStuck: _cleanup_stuck, Straggling: _straggling, Unseen: _unseen,
    Mismatch: _mismatch, SameOp: _same_op, Unexplained: _unexplained,
    DeviceWaits: _device_waits, SeenInOneOp: _seen_in_one_op, Teardown: _teardown,
    GroupsApart: _groups_apart, ThreadsRace: _threads_race,
}


# -- building blocks: ranks, ops, frames, counters --------------------------------------


def _v(ranks: Sequence[object], singular: str, plural: str) -> str:
    """The verb form agreeing with the number of ranks."""
    return singular if len(ranks) == 1 else plural


def _where(op: DistOp | None) -> str:
    return op.describe() if op is not None else "?"


def describe_rank(v: RankView) -> str:
    """One line on what a rank is doing, quoting its frames."""
    if v.op is not None:
        text = in_op(v.op)
        if v.op.via != "c10d call":
            text += f", recognised by {v.op.via}"
        if v.op.in_cleanup and v.op.cleanup_frame is not None:
            text += f", on a cleanup path: {v.op.cleanup_frame}"
        return text
    if v.thread is None:
        errors = [s.error for s in v.snap.samples if s.error]
        return errors[-1].message if errors else "no stack"
    return what_outside(v)


_LOCK = re.compile(r"(\.acquire\(|\bwith\b.*\block\b|Lock\(|\.wait\(|Condition)", re.IGNORECASE)
_IO = re.compile(r"(\.read\w*\(|\.recv\w*\(|\.accept\(|\bopen\(|\.readline|select\(|\.get\()")


def activity(v: RankView) -> str:
    """What a rank outside any op is doing, in a few words (computing, blocked on a lock...)."""
    move = v.move
    if v.state is RankState.STOPPED:
        return _STATUS_MEANS["stopped"]
    cycle = v.locks.cycle_of(v.thread) if v.locks is not None and v.thread is not None else None
    if cycle is not None:
        return deadlock_short(cycle)
    if move is not None and move.busy:
        if move.cpu_fraction is None:
            return "on CPU (py-spy marked its thread active)"
        return f"computing ({move.cpu_fraction:.0%} of a core)"
    inner = (v.thread.innermost_python if v.thread else None)
    code = (inner.code or "") if inner else ""
    func = inner.function if inner else ""
    if move is not None and move.status == "disk-sleep":
        return "blocked on I/O (uninterruptible disk sleep)"
    if v.locks is not None and v.thread is not None and v.locks.edge_of(v.thread) is not None:
        return "blocked on a lock"
    in_threading = inner is not None and "threading" in inner.filename
    if func in ("acquire", "wait") and in_threading or _LOCK.search(code):
        return "blocked on a lock"
    if _IO.search(code) or func in ("read", "readinto", "recv", "recv_into", "accept", "select"):
        return "blocked on I/O"
    if "sleep(" in code:
        return "sleeping"
    return "idle outside any distributed op"


def what_outside(v: RankView) -> str:
    """A rank outside any op: its activity, relevant thread, innermost frame, other threads."""
    inner = (v.thread.innermost_python if v.thread else None)
    name = v.thread.name if v.thread else "?"
    where = f" at {inner}" if inner else ""
    code = f" `{inner.code}`" if inner and inner.code else ""
    graph = v.locks
    cycle = graph.cycle_of(v.thread) if graph is not None and v.thread is not None else None
    edge = graph.edge_of(v.thread) if graph is not None and v.thread is not None else None
    if cycle is not None:
        # the chain names every thread of it and where each waits and holds
        kind = "self-deadlock" if len(cycle) == 1 else "lock-order deadlock"
        text = f"in a {kind}, not in any collective: {deadlock_words(cycle, lead=False)}"
        others = other_threads(v, skip={e.wait.thread.thread_id for e in cycle})
        return text + (f"; other threads: {others}" if others else "")
    if edge is not None and graph is not None:
        # where it waits, on what, and who holds it
        text = f"{activity(v)}, not in any collective: thread '{name}' {lock_wait_words(edge, graph)}"
    else:
        text = f"{activity(v)}, not in any collective: thread '{name}'{where}{code}"
    others = other_threads(v)
    return text + (f"; other threads: {others}" if others else "")


# -- locks: who waits on whom (``locks``) ----------------------------------------------


def _thread(thread: ThreadStack) -> str:
    return f"'{thread.name or thread.thread_id}'"


def _code(frame: Frame) -> str:
    return f" `{frame.code}`" if frame.code else ""


def deadlock_short(cycle: Sequence[LockEdge]) -> str:
    """``in a lock-order deadlock between threads 'A' (a.py:4) and 'B' (b.py:9)``."""
    if len(cycle) == 1:
        wait = cycle[0].wait
        return f"in a self-deadlock: thread {_thread(wait.thread)} ({wait.frame.location}) waits on a Lock it holds"
    names = [f"{_thread(e.wait.thread)} ({e.wait.frame.location})" for e in cycle]
    listed = ", ".join(names[:-1]) + f" and {names[-1]}"
    return f"in a lock-order deadlock between threads {listed}"


def deadlock_words(cycle: Sequence[LockEdge], lead: bool = True) -> str:
    """Each thread of a deadlock, where it waits and where the one it waits for took the
    lock: both threads and both lines (``lead``: said to be a deadlock first)."""
    if len(cycle) == 1:
        edge = cycle[0]
        taken = f" (taken at {edge.holder.location})" if edge.holder else ""
        return (f"{'self-deadlock: ' if lead else ''}thread {_thread(edge.wait.thread)} waits at "
                f"{edge.wait.frame}{_code(edge.wait.frame)} for a plain Lock it already holds"
                f"{taken}: it can never get it")
    parts = []
    for i, edge in enumerate(cycle):
        holder = edge.holder
        assert holder is not None
        who = f"thread {_thread(edge.wait.thread)} waits" if i == 0 else "which waits"
        parts.append(f"{who} at {edge.wait.frame}{_code(edge.wait.frame)} for a lock held by "
                     f"thread {_thread(holder.thread)} (taken at {holder.location})")
    return ("lock-order deadlock: " if lead else "") + ", ".join(parts) + "; none of them can go on"


def lock_wait_words(edge: LockEdge, graph: LockGraph) -> str:
    """``waiting on a lock at a.py:4 (f) `with x:`, held by thread 'B' (taken at b.py:9),
    which ...``: the holder and what it does, as far as the stacks tell."""
    wait = edge.wait
    text = f"waiting on a lock at {wait.frame.location} ({wait.frame.function}){_code(wait.frame)}"
    holder = edge.holder
    if edge.reentry and holder is not None:
        if wait.kind in REENTRANT:
            return text + f", an RLock it already holds (taken at {holder.location}): re-entering it"
        return (text + f", a lock it already holds (taken at {holder.location}): a self-deadlock "
                "if it is a plain Lock, fine if it is an RLock")
    if holder is None:
        if wait.lock is None:
            return text
        return (text + ", held by no thread whose stack shows it (taken in a function that "
                "returned, or by a thread that ended)")
    text += f", held by thread {_thread(holder.thread)} (taken at {holder.location})"
    onward = graph.edge_of(holder.thread)
    if edge.holder_op is not None:
        return text + f", which is in {edge.holder_op.describe()}"
    if onward is not None:
        return text + f", which waits on another lock at {onward.wait.frame.location}"
    inner = holder.thread.innermost_python
    state = "running" if holder.thread.active else "blocked"
    return text + (f", which is {state} at {inner}" if inner is not None else "")


def lock_notes(views: Sequence[RankView], said: Sequence[str] = ()) -> list[str]:
    """Evidence lines on lock waits that the lines ``said`` do not already tell: every
    deadlock, and every wait on a lock held by a thread in a distributed op; at most six."""
    lines: list[str] = []
    for v in views:
        graph = v.locks
        if graph is None:
            continue
        # (what a line says, the part of it that tells whether a line says it already)
        found = [(deadlock_words(cycle), deadlock_words(cycle, lead=False))
                 for cycle in graph.deadlocked]
        found += [(f"thread {_thread(e.wait.thread)} is {lock_wait_words(e, graph)}",
                   lock_wait_words(e, graph)) for e in graph.edges if e.holder_op is not None]
        lines += [f"rank {v.rank}: {words}" for words, core in found
                  if not any(core in line for line in said)]
        if len(lines) >= 6:
            break
    return lines[:6]


def other_threads(v: RankView, skip: Collection[int] = ()) -> str:
    """Up to three other threads of the rank's latest sample (but ``skip``), where they are."""
    sample = v.snap.latest
    if sample is None or v.thread is None:
        return ""
    parts = []
    for th in sample.threads:
        if th.thread_id == v.thread.thread_id or th.thread_id in skip:
            continue
        inner = th.innermost_python
        if inner is not None:
            parts.append(f"'{th.name}' {'running' if th.active else 'waiting'} at {inner}")
    return "; ".join(parts[:3])


def cleanup_where(v: RankView) -> str:
    """Where a rank on a cleanup path is: the cleanup frame and its op, or its activity."""
    if v.op is not None:
        return _cleanup_op(v.op)
    return f"{v.cleanup}; {what_outside(v)}"


def _cleanup_op(op: DistOp) -> str:
    return f"{op.cleanup_frame or op.call_site} -> {op.describe()}"


def cleanup_short(v: RankView) -> str:
    """The same, short, for a summary."""
    if v.op is not None:
        return v.op.describe()
    if v.thread is not None and (exiting := exit_frame(v.thread)) is not None:
        joining = " joining its non-daemon threads" if exiting.function.endswith("_shutdown") else ""
        return f"exiting: {exiting.function} ({exiting.location}){joining}"
    inner = (v.thread.innermost_python if v.thread else None)
    return f"{activity(v)} in {v.cleanup.location if v.cleanup else '?'}" + (
        f" at {inner.function}" if inner else ""
    )


def progress_line(v: RankView) -> str:
    """Why a rank counts as progressing."""
    m = v.move
    if m is not None and not (m.op_changed or m.left_op) and m.wakeups is not None:
        return (
            f"rank {v.rank} was seen only in {describe_rank(v)}, but its main thread woke "
            f"{m.wakeups} times on its own over {m.seconds:.1f} s: the call keeps completing "
            "and being issued again"
        )
    return (
        f"rank {v.rank} went through different operations between samples "
        f"(last: {describe_rank(v)})"
    )


def frame_tail(v: RankView) -> str:
    """`` [innermost: frame]`` when the rank's innermost frame says more than its op."""
    if v.thread is None:
        return ""
    inner = (v.thread.innermost_python if v.thread else None)
    if inner is None or v.op is None or inner == v.op.call_site or inner.function == v.op.name:
        return ""
    return f" [innermost: {inner}]"


def op_summary(views: Sequence[RankView]) -> str:
    """The ops the ranks are in, sorted and deduplicated: ``all_gather (a.py:3) / barrier``."""
    describe = once_per_object(DistOp.describe)
    ops = sorted({describe(v.op) for v in views if v.op})
    return " / ".join(ops) if ops else "?"


def in_op(op: DistOp) -> str:
    """``in all_reduce (a.py:3)``, or ``for device work at .item() (a.py:9)`` for a host sync."""
    if waits_for_device(op):
        return f"for device work at {op.describe()}"
    return f"in {op.describe()}"


def in_ops(views: Sequence[RankView]) -> str:
    """``in`` the ops the ranks are in (``op_summary``), host syncs said as device waits."""
    said = once_per_object(in_op)
    ops = sorted({said(v.op) for v in views if v.op})
    return " / ".join(ops) if ops else "in their last operation"


def op_lines(views: Sequence[RankView]) -> list[str]:
    """One line per op (and recogniser): which ranks wait in it, in the order first seen."""
    classes: dict[str, list[int]] = defaultdict(list)
    tails: dict[str, str] = {}
    def via(op: DistOp) -> str:
        return in_op(op) + (f" via {op.via}" if op.via != "c10d call" else "")

    keyed = once_per_object(via)
    for v in views:
        if v.op is None:
            continue
        key = keyed(v.op)
        classes[key].append(v.rank)
        if key not in tails:
            tails[key] = frame_tail(v)
    return [f"{rank_phrase(r)} {_v(r, 'waits', 'wait')} {k}{tails[k]}" for k, r in classes.items()]


def move_line(v: RankView) -> str:
    """A communicating rank's counters."""
    m = v.move
    if m is None:
        return f"rank {v.rank}: no counters"
    cpu = f"{m.cpu_fraction:.0%} CPU" if m.cpu_fraction is not None else "CPU unknown"
    io = ""
    if m.bytes_per_second is not None:
        io = f"{m.bytes_per_second / 1e6:.1f} MB/s read+written"
    return f"rank {v.rank} in {describe_rank(v)}: {cpu}, {io} over {m.seconds:.1f} s"


def quiet_line(waiting: Sequence[RankView]) -> str:
    """The counters of the waiting ranks, which show that nothing moved on them."""
    moves = [v.move for v in waiting if v.move is not None]
    if not moves:
        return "no progress counters were available"
    seconds = min(m.seconds for m in moves)
    if seconds <= 0:  # one look at each (a dump file): no time passed to see anything move
        return "each waiting rank was seen once: whether anything moves on them is not shown"
    # a host sync spins a core while it waits: that CPU is said apart, as no progress
    spinning: list[RankView] = []
    cpus: list[float] = []
    for v in waiting:
        if waits_for_device(v.op):
            spinning.append(v)
        elif v.move is not None:
            cpus.append(v.move.cpu_fraction or 0.0)
    cpu = max(cpus, default=0.0)
    io = max((m.bytes_per_second or 0.0) for m in moves)
    text = (f"nothing moved on the waiting ranks over {seconds:.1f} s: stacks unchanged, "
            f"at most {cpu:.1%} CPU and {io / 1024:.1f} KiB/s read+written")
    if spinning:
        text += (f" ({rank_phrase(_ranks(spinning))} at a host sync "
                 f"{'spins' if len(spinning) == 1 else 'spin'} a core while "
                 f"{'it waits' if len(spinning) == 1 else 'they wait'}: not counted)")
    return text
