"""How sure a verdict is, and the evidence it rests on.

``classify.decide`` names the verdict; ``judge`` weighs it. The basis starts with what the
verdict rests on (how many ranks were read in how many samples, how the culprits were
named, what stayed still), then each rule of ``RULES`` that applies lowers the confidence
to its level and adds its phrase, which says what is missing or conflicts and, where it
can, what would settle it. No rule applies: ``HIGH``.

The rules are general: they read the ``Finding`` and the rank views (samples read, how
each op was recognised, whether culprits were seen or inferred, what moved), never a
verdict's name alone. A ``nccl_timeout`` read in five samples of every rank is as sure as
a ``collective_mismatch``; any verdict that rests on elimination is not. The rules and
their phrases live together here: each phrase is the reason of one rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..model import GIVEN_GROUP, Confidence, Origin, RankState, Verdict
from ..rankranges import rank_phrase
from . import settle
from .classify import IN_OP, OUTSIDE
from .facts import (
    CleanupStuck,
    DataMoving,
    DeviceWaits,
    GroupsApart,
    InitSplit,
    InitStuck,
    Mismatch,
    NothingCaptured,
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
from .finding import Classification, DeviceRole, Finding, FlightRole
from .host_sync import sync_call, waits_for_device
from .ops import COMPILED_MAYBE
from .phrases import deadlock_short, unseen_reason
from .views import RankView, op_keys
from .wording import NOT_VISIBLE

DIRECT_VIA = "c10d call"  # ``ops``: the op is a torch.distributed function on the stack
# A rank idle outside any op while the others wait, watched this long (capture watches an
# ambiguous job up to --max-window, 12 s by default), is stuck, not slow: a slow read or a
# contended lock returns sooner. Watched less, it may still return.
STILL_FOR = 10.0
SIZE_UNKNOWN = "the job's size is unknown: ranks not captured may be elsewhere"
_LEVEL = {Confidence.LOW: 0, Confidence.MEDIUM: 1, Confidence.HIGH: 2}


@dataclass(frozen=True)
class Judgement:
    confidence: Confidence
    basis: tuple[str, ...]


@dataclass(frozen=True)
class Case:
    """What the rules read: the finding, the views, and what follows from them."""

    found: Finding
    views: Sequence[RankView]
    unknown: Sequence[int]  # ranks on nodes that did not answer or were not asked
    silent_nodes: int  # nodes that did not answer
    read: Sequence[RankView]  # ranks with at least one good sample
    in_op: Sequence[RankView]  # waiting or communicating in a distributed op
    outside: Sequence[RankView]  # busy, blocked or stopped outside any op
    samples: Sequence[int]  # how many good samples each of ``read`` has, in its order
    world_known: bool = True  # the ranks' environment or code says the job's size
    coverage_unknown: bool = False  # one rank, or dumps, and nothing says the job's size

    @classmethod
    def of(
        cls,
        found: Finding,
        views: Sequence[RankView],
        unknown: Sequence[int],
        silent_nodes: int,
        world_known: bool = True,
        coverage_unknown: bool = False,
    ) -> Case:
        read = [v for v in views if v.state not in (RankState.UNREADABLE, RankState.EXITED)]
        return cls(
            found,
            views,
            unknown,
            silent_nodes,
            read=read,
            in_op=[v for v in views if v.state in IN_OP],
            outside=[v for v in views if v.state in OUTSIDE],
            samples=[len(v.snap.good_samples) for v in read],
            world_known=world_known,
            coverage_unknown=coverage_unknown,
        )

    @property
    def hang(self) -> bool:
        """The verdict says the job is stuck (not ``not_hung``, not ``unknown``)."""
        return self.found.verdict not in (Verdict.NOT_HUNG, Verdict.UNKNOWN)


def judge(
    result: Classification,
    views: Sequence[RankView],
    unknown: Sequence[int] = (),
    silent_nodes: int = 0,
    world_known: bool = True,
    coverage_unknown: bool = False,
) -> Judgement:
    """The confidence of ``result`` and its basis: what the stacks' finding rests on and
    what lowers it (``RULES``), then what the other sources that weighed in set
    (``SETTLED``), then the one doubt no source removes: a hang said of part of the job."""
    stacks = weigh_stacks(result.finding, views, unknown, silent_nodes, world_known, coverage_unknown)
    level, basis = settled(result, stacks)
    not_seen = sorted(set(unknown) - {v.rank for v in views})
    return _over_part(result.verdict, level, basis, not_seen, coverage_unknown)


def weigh_stacks(
    found: Finding,
    views: Sequence[RankView],
    unknown: Sequence[int] = (),
    silent_nodes: int = 0,
    world_known: bool = True,
    coverage_unknown: bool = False,
) -> Judgement:
    """The confidence of the stacks' own finding and its basis: what it rests on, then what
    lowers it."""
    case = Case.of(found, views, unknown, silent_nodes, world_known, coverage_unknown)
    level = Confidence.HIGH
    basis = rests_on(case)
    for cap, rule in RULES:
        phrase = rule(case)
        if phrase is not None:
            basis.append(phrase)
            level = min(level, cap, key=_LEVEL.__getitem__)
    return Judgement(level, tuple(basis))


# -- what the verdict rests on ----------------------------------------------------------


def rests_on(case: Case) -> list[str]:
    """The evidence behind the verdict, in phrases (no judgement)."""
    basis: list[str] = []
    if case.read:
        samples = sorted(case.samples)
        count = f"{samples[0]}" if samples[0] == samples[-1] else f"{samples[0]}-{samples[-1]}"
        complete = len(case.read) == len(case.views) and not case.unknown
        n = len(case.read)
        ranks = _who(case.read) if not complete or n == 1 else ("both ranks" if n == 2 else f"all {n} ranks")
        agree = " agree" if isinstance(case.found.facts, SameOp) and complete else ""
        plural = "" if count == "1" else "s"
        basis.append(f"stacks of {ranks} in {count} sample{plural}{agree}")
    named = _named_by(case)
    if named:
        basis.append(named)
    if isinstance(case.found.facts, WaitsOutside):
        ends = sorted({c.end.pid for c in case.found.facts.chains.values()})
        basis.append(f"each rank's wait followed past the ranks, to pid {', '.join(map(str, ends[:4]))}")
    if case.hang and case.in_op and all(v.op and v.op.via == DIRECT_VIA for v in case.in_op):
        basis.append("every op read from a torch.distributed frame")
    quiet = case.found.quiet_over
    if case.hang and quiet and not any(_moves_in_op(v) for v in quiet):
        seconds = _seconds(quiet)
        spinning = [v for v in quiet if waits_for_device(v.op)]
        if seconds and spinning:
            basis.append(
                f"no waiting rank's bytes or stack moved over {seconds:.1f} s "
                f"({_who(spinning)} at a host sync: CPU there is no progress)"
            )
        elif seconds:  # one sample compares nothing: _one_sample says so
            basis.append(f"no waiting rank's CPU, bytes or stack moved over {seconds:.1f} s")
    idle = _idle_for(case)
    if idle is not None and idle >= STILL_FOR:
        basis.append(
            f"{_who(case.outside)} stayed off CPU, without I/O, on one stack over {idle:.1f} s: stuck, not slow"
        )
    for v in case.outside if case.hang else ():
        if v.deadlocked and v.locks is not None and v.thread is not None:
            cycle = v.locks.cycle_of(v.thread)
            assert cycle is not None
            basis.append(
                f"rank {v.rank} {deadlock_short(cycle)} in {v.deadlock_seen} samples: "
                "stuck, not slow (waiting cannot resolve it)"
            )
    return basis


def _named_by(case: Case) -> str | None:
    """How the culprits (or the progress) were found: a stack, an absence, an environment."""
    f = case.found.facts
    culprits = case.found.culprits
    if isinstance(f, Progressing):
        moved = [v for v in f.ranks if v.move and (v.move.op_changed or v.move.left_op)]
        if moved:
            return f"{_who(moved)} went through different distributed ops between samples"
    elif isinstance(f, RanksGone):
        parts = []
        never = sorted(set(f.gone) - set(f.exited))
        if never:
            parts.append(f"{rank_phrase(never)} of world size {f.world} {_verb(never, 'has', 'have')} no process")
        if f.exited:
            parts.append(f"{rank_phrase(f.exited)} exited during the capture")
        return "; ".join(parts)
    elif isinstance(f, InitSplit):
        where = "went past" if f.went_past else "never reached"
        return f"{rank_phrase(culprits)} named by {_their(culprits)}: the smaller side ({_who(f.others)} {where} init)"
    elif isinstance(f, InitStuck) and f.differ:
        if f.env is not None:
            return f"{rank_phrase(f.differ)} named by the rendezvous environment ({f.env.key})"
        return f"{rank_phrase(f.differ)} named by {_their(f.differ)}: a different init call"
    elif isinstance(f, CleanupStuck):
        return f"{_who(f.cleanup)} named by {_their(f.cleanup)}: on a cleanup path"
    elif isinstance(f, Straggling):
        return f"{_who(f.outside)} named by {_their(f.outside)}: outside any distributed op"
    elif isinstance(f, ThreadsRace):
        return f"{_who(f.raced)} named by {_their(f.raced)}: two threads in collectives on one process group"
    elif isinstance(f, Mismatch) and culprits:
        if f.structure is not None:
            return (
                f"{rank_phrase(culprits)} named by the ops' process groups: on WORLD, which "
                "needs every rank, while the others wait on groups their callers passed"
            )
        if f.by_tree:
            return (
                f"{rank_phrase(culprits)} named by the merged call tree: one place off the "
                "others' path, with fewer ranks than any place of theirs"
            )
        if f.parted:
            return f"{rank_phrase(culprits)} named by where the stacks part: the smaller path ({f.parted[1][0]})"
        if _has_minority(f) and not f.by_peers:
            return f"{rank_phrase(culprits)} named by {_their(culprits)}: the minority op"
        return f"{rank_phrase(culprits)} named by the send/recv calls that do not pair up"
    return None


# -- what lowers it: the rules, most severe first -----------------------------------------


def _nothing_to_go_on(case: Case) -> str | None:
    f = case.found.facts
    if isinstance(f, NothingCaptured):
        return "no rank could be captured"
    if isinstance(f, Unexplained):
        return (
            "no rank is in a distributed op and nothing moves: native frames (--native) "
            "or a longer --window may settle it"
        )
    return None


def _by_elimination(case: Case) -> str | None:
    f = case.found.facts
    if not isinstance(f, Unseen):
        return None
    reasons = "; ".join(sorted({unseen_reason(v) for v in f.unseen}))
    return (
        f"{_who(f.unseen)} could not be read ({reasons}): culprit by elimination, "
        "not by a stack; reading it would settle it"
    )


def _members_unknown(case: Case) -> str | None:
    f = case.found.facts
    if isinstance(f, Mismatch) and f.waiting_for_members:
        return (
            f"{_who(f.waiting_for_members)} wait on a process group whose other members "
            "wait in the others' op: which rank skipped an op rests on the order each rank "
            "issued them, which stacks do not show (the flight recorder's sequence numbers "
            "would)"
        )
    return None


def _no_minority(case: Case) -> str | None:
    f = case.found.facts
    if isinstance(f, Mismatch) and len(f.groups) > 1 and not case.found.culprits and not f.waiting_for_members:
        sizes = sorted((len(g) for g in f.groups), reverse=True)
        if sizes[0] == sizes[-1]:
            return (
                f"ranks split evenly between {len(f.groups)} ops: no minority to blame, "
                "and ops of different process groups are not told apart"
            )
        return (
            f"no op holds most of the ranks ({sizes[0]:,} of {sum(sizes):,} in the largest of "
            f"{len(f.groups)}) and no small set is off the others' path: ranks of different "
            "process groups may wait apart legitimately, and stacks do not tell the groups apart"
        )
    if isinstance(f, GroupsApart):
        return (
            f"every op runs on a group its caller passed, at {len(f.groups)} places that may "
            "each hold whole groups: no small set of ranks explains the hang, and stacks do "
            "not show what each group waits for (the flight recorder would)"
        )
    if isinstance(f, InitStuck) and not f.differ:
        key = op_keys()
        calls = {key(v.op) for v in f.init if v.op is not None}
        if len(calls) > 1:
            return f"ranks split evenly between {len(calls)} init calls: no minority to blame"
    return None


def _silent_nodes(case: Case) -> str | None:
    if not case.unknown:
        return None
    if case.silent_nodes:
        answered = len({v.snap.process.host for v in case.views})
        return (
            f"{case.silent_nodes} of {answered + case.silent_nodes} nodes did not answer: "
            f"{rank_phrase(case.unknown)} unknown"
        )
    return f"{rank_phrase(case.unknown)} not seen"


def _hang_over_part(case: Case) -> str | None:
    """A hang verdict said of part of the job, or one the ranks not seen decide: those
    ranks may change it."""
    f = case.found.facts
    if not case.unknown and (isinstance(f, SeenInOneOp) or (isinstance(f, CleanupStuck) and not f.training)):
        return "one rank seen, and nothing says how many the job has: its peers were not seen"
    return _silent_nodes(case) if case.hang or isinstance(f, SeenInOneOp) else None


def _progress_over_part(case: Case) -> str | None:
    """``not_hung`` over part of the job resting on counters or a working rank, with no
    completed op: a busy straggler looks exactly so while the ranks not seen wait for it."""
    if case.found.verdict is not Verdict.NOT_HUNG or not (case.unknown or case.coverage_unknown):
        return None
    if _counters_only(case) is None:
        return None
    return "the ranks not seen may be waiting for the ones that move: no op completed"


def _other_part(case: Case) -> str | None:
    return None if case.hang or isinstance(case.found.facts, SeenInOneOp) else _silent_nodes(case)


def _size_unknown(case: Case) -> str | None:
    """ "Every rank waits in the same op" with nothing to say how many ranks the job has."""
    if case.world_known:
        return None
    if isinstance(case.found.facts, (SameOp, Teardown)) or (case.hang and case.coverage_unknown):
        return SIZE_UNKNOWN
    return None


def _unread(case: Case) -> str | None:
    if isinstance(case.found.facts, Unseen):
        return None  # said by _by_elimination
    unread = [v for v in case.views if v.state is RankState.UNREADABLE]
    if not unread:
        return None
    return f"{_who(unread)} could not be read: what {_verb(unread, 'it does', 'they do')} is unknown"


def _one_sample(case: Case) -> str | None:
    few = [v for v, n in zip(case.read, case.samples, strict=True) if n < 2]
    if not few:
        return None
    return (
        f"{_who(few)} read in 1 sample only: nothing to compare; a second look (a longer "
        "--window, or a second dump of each process) would show whether it moves"
    )


def _device_collective_unseen(case: Case) -> str | None:
    f = case.found.facts
    if not isinstance(f, DeviceWaits):
        return None
    return (
        f"{_who(f.device)} {_verb(f.device, 'waits', 'wait')} for device work at a host "
        f"sync: {NOT_VISIBLE}; the flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE) would tell"
    )


def _device_waiters(case: Case) -> str | None:
    if not case.hang or isinstance(case.found.facts, DeviceWaits):
        return None
    device = [v for v in case.in_op if waits_for_device(v.op)]
    if not device:
        return None
    return (
        f"{_who(device)} {_verb(device, 'waits', 'wait')} for device work at a host sync, "
        "not in a torch.distributed frame: which collective is not visible from stacks"
    )


def _maybe_device(case: Case) -> str | None:
    spinning = [v for v in case.views if _spins_at_sync(v)]
    if not spinning:
        return None
    inner = spinning[0].thread.innermost_python if spinning[0].thread else None
    line = f" (`{inner.code}`)" if inner is not None and inner.code else ""
    return (
        f"{_who(spinning)} {_verb(spinning, 'spins', 'spin')} on one line that waits for "
        f"a GPU if its tensors are on one{line}, and nothing shows whether the rank uses "
        "one: it may be waiting for device work, not computing; --native would show a "
        "CUDA call"
    )


def _line_unseen(case: Case) -> str | None:
    """A culprit outside any op, read from a dump file (no counters, no source lines), sits
    on a line of the job with no native frames: the line may be a host sync (``.item()``),
    where a rank on a GPU waits for the collective it has issued, not computes. Neither
    reading can be ruled out. (A live capture reads the line, and ``device`` judges it.)"""
    if not case.hang:
        return None
    culprits = set(case.found.culprits)
    unseen = [v for v in case.outside if v.rank in culprits and _line_not_had(v)]
    if not unseen:
        return None
    inner = unseen[0].thread.innermost_python if unseen[0].thread else None
    where = f" ({inner.location})" if inner is not None else ""
    return (
        f"{_who(unseen)} {_verb(unseen, 'is', 'are')} on a line of the job that capture "
        f"does not show{where}: if it waits for a GPU (`.item()`, `.cpu()`, "
        "`synchronize()`), the rank has issued its collective and waits, and is no "
        "straggler; the source lines (`hangdoc diagnose` on the job) or native frames "
        "(`py-spy dump --native`) would tell"
    )


def _line_not_had(v: RankView) -> bool:
    thread = v.thread
    inner = thread.innermost_python if thread is not None else None
    return (
        v.op is None
        and thread is not None
        and inner is not None
        and inner.code is None
        and v.move is not None
        and v.move.marked_active is not None
        and inner.origin.kind in (Origin.USER, Origin.LIBRARY)
        and not any(f.native for f in thread.frames)
    )


def _spins_at_sync(v: RankView) -> bool:
    """Outside any op, on CPU, on one unchanged stack whose line syncs with a device: read
    as computing only because nothing showed a GPU (``device.gpu_evidence``)."""
    if v.op is not None or v.state is not RankState.BUSY:
        return False
    inner = v.thread.innermost_python if v.thread is not None else None
    return (
        inner is not None
        and sync_call(inner.code) is not None
        and v.move is not None
        and not v.move.stack_changed
        and len(v.snap.good_samples) >= 2
    )


def _indirect_ops(case: Case) -> str | None:
    if not case.hang:
        return None
    by_via: dict[str, list[RankView]] = {}
    for v in case.in_op:
        if v.op is not None and v.op.via != DIRECT_VIA and not waits_for_device(v.op):
            by_via.setdefault(v.op.via, []).append(v)
    if not by_via:
        return None
    return "; ".join(
        f"{_who(vs)}: {'/'.join(sorted({v.op.name for v in vs if v.op}))} recognised by {via}; "
        "the call that issued it is not on the stack"
        for via, vs in by_via.items()
    )


def _still_working(case: Case) -> str | None:
    if not case.hang:
        return None
    working = [v for v in case.outside if _working(v)]
    if not working:
        return None
    return f"{_who(working)} still {_verb(working, 'works', 'work')} (CPU, I/O or stack): it may be slow, not stuck"


def _briefly_idle(case: Case) -> str | None:
    if all(len(v.snap.good_samples) < 2 for v in case.outside):
        return None  # seen once: no idle time at all (``_one_sample`` says so)
    idle = _idle_for(case)
    if idle is None or idle >= STILL_FOR:
        return None
    return (
        f"{_who(case.outside)} idle for only {idle:.1f} s: a slow read or lock may still "
        "return; a longer --max-window would settle it"
    )


def _waiting_moves(case: Case) -> str | None:
    if not case.hang:
        return None
    moving = [v for v in case.in_op if _moves_in_op(v)]
    if not moving:
        return None
    return (
        f"{_who(moving)} still {_verb(moving, 'moves', 'move')} data or stack inside "
        f"{_verb(moving, 'its', 'their')} op: the op may yet complete"
    )


def _counters_only(case: Case) -> str | None:
    f = case.found.facts
    if isinstance(f, Progressing):
        if any(v.move and (v.move.op_changed or v.move.left_op) for v in f.ranks):
            return None
        return f"{_who(f.ranks)} stayed in one op: progress rests on wake-up counters, not a completed op"
    if isinstance(f, DataMoving):
        return f"{_who(f.communicating)} stayed in one op: progress rests on byte and CPU counters, not a completed op"
    if isinstance(f, Working):
        return "no rank is in a distributed op: progress rests on CPU and changing stacks, not a completed op"
    return None


def _groups_unseen(case: Case) -> str | None:
    f = case.found.facts
    if not isinstance(f, Mismatch) or not f.culprits or f.by_peers or f.parted or f.structure:
        return None
    common = f.groups[0]
    if not all(v.op is not None and v.op.group == GIVEN_GROUP for v in common):
        return None  # the others wait on WORLD (or a group hangdoc cannot see): it needs everyone
    return (
        f"{_who(common)} wait on a process group their caller passed, whose members "
        "py-spy cannot see: the minority may be in its own group's collective "
        "(the flight recorder would tell)"
    )


def _race_from_lines(case: Case) -> str | None:
    f = case.found.facts
    if not isinstance(f, ThreadsRace):
        return None
    ops = [op for v in f.raced for op in (v.op, *(o for _, o in v.side_ops)) if op is not None]
    if all(op.group is not None for op in ops):
        return None
    return (
        "that the threads' collectives run on one group was read from the call lines (no "
        "`group=` passed), not from call arguments: a wrapper that passes its own group on "
        "may pass another; call arguments (py-spy --locals) would tell"
    )


def _maybe_compiled(case: Case) -> str | None:
    if not case.hang:
        return None
    maybe = [v for v in case.in_op if v.op is not None and v.op.via == COMPILED_MAYBE]
    if not maybe:
        return None
    return (
        f"{_who(maybe)} {_verb(maybe, 'is', 'are')} idle in a C++ op of a compiled graph, "
        "read as a collective: native frames (--native) or the graph's locals (py-spy "
        "--locals) would say which op it is"
    )


def _groups_from_lines(case: Case) -> str | None:
    f = case.found.facts
    if not isinstance(f, Mismatch) or f.structure is None or not f.structure.from_lines:
        return None
    return (
        "which ops run on WORLD and which on passed groups was read from the call lines "
        "(`group=`), not from call arguments: a wrapper that passes its own group on may "
        "pass None; call arguments (py-spy --locals) would tell"
    )


def _by_tree_shape(case: Case) -> str | None:
    f = case.found.facts
    if isinstance(f, Mismatch) and f.by_tree:
        return (
            "the culprits rest on the merged tree's shape alone: the ops do not say which "
            "process groups they run on, so ranks at different places may each be whole "
            "groups; call arguments (py-spy --locals), the call lines or the flight "
            "recorder would tell"
        )
    return None


def _by_parting(case: Case) -> str | None:
    f = case.found.facts
    if isinstance(f, Mismatch) and f.parted and not f.by_tree:
        return (
            "the ops name no minority: the culprits are the smaller path where the stacks "
            "part, and ranks in different ops on one path may still wait for each other"
        )
    return None


def _few_moving(case: Case) -> str | None:
    f = case.found.facts
    if isinstance(f, Progressing) and len(f.waiting) > len(f.ranks):
        return (
            f"only {_who(f.ranks)} completed ops while {_who(f.waiting)} waited "
            "throughout: they may be stuck around the ones moving"
        )
    return None


Rule = tuple[Confidence, Callable[[Case], str | None]]


def _wait_ends_running(case: Case) -> str | None:
    f = case.found.facts
    if not isinstance(f, WaitsOutside):
        return None
    running = sorted({c.end.pid for c in f.chains.values() if c.runs})
    if not running:
        return None
    return (
        f"the ranks wait on pid {', '.join(map(str, running))}, which runs: slow work or a loop looks the same "
        "for a while; a longer --window tells them apart"
    )


def _wait_inferred(case: Case) -> str | None:
    f = case.found.facts
    if not isinstance(f, WaitsOutside):
        return None
    inferred = [v for v in f.views if v.rank in f.chains and not all(x.certain for x in f.chains[v.rank].links[:-1])]
    if not inferred:
        return None
    return f"{_who(inferred)}: a link of the wait read from stacks, not named by the kernel's tables"


RULES: tuple[Rule, ...] = (
    # unknown: nothing was captured, or nothing points anywhere; no verdict to trust
    (Confidence.LOW, _nothing_to_go_on),
    # the culprits were never seen: named only because every rank that was read waits, and
    # a rank py-spy cannot read may be waiting too
    (Confidence.LOW, _by_elimination),
    # the ranks split evenly between ops, or over places none of which holds most of them:
    # nobody to blame, and ops in different process groups (not told apart from stacks) may
    # each be legitimate
    (Confidence.LOW, _no_minority),
    # the few wait on passed groups while the rest are in another op: who skipped which
    # rests on the order of issue, which stacks do not show
    (Confidence.LOW, _members_unknown),
    # culprits from the merged tree's shape only (a small path off a possible structure of
    # groups), the ops' groups not known
    (Confidence.LOW, _by_tree_shape),
    # every rank waits for device work at a host sync (or some in one c10d op): which
    # collective the GPUs wait in is not on any stack; a transport hang and ranks that
    # queued different collectives before the same line look the same
    (Confidence.LOW, _device_collective_unseen),
    # a rank spinning on one line that syncs with a GPU, with nothing showing a GPU: read
    # as computing, it may be waiting for device work (the culprits or the progress may be
    # wrong)
    (Confidence.LOW, _maybe_device),
    # a rank idle in a compiled graph's C++ op, with nothing that says it is a collective
    (Confidence.LOW, _maybe_compiled),
    # a culprit on a line of the job whose text was not captured (a dump file): it may be a
    # host sync, where the rank waits for its own collective rather than computes
    (Confidence.LOW, _line_unseen),
    # a hang said of part of the job: ranks not seen (nodes not searched or not answering,
    # ranks not in the dumps) may be anywhere, the culprits' place included
    (Confidence.LOW, _hang_over_part),
    # "every rank in one op" where nothing says how many ranks the job has
    (Confidence.LOW, _size_unknown),
    # a job said to move, over part of it, with no op completed
    (Confidence.LOW, _progress_over_part),
    # a job that moves, or nothing to say, while some ranks were not seen
    (Confidence.MEDIUM, _other_part),
    # a rank that could not be read may be the one the others wait for
    (Confidence.MEDIUM, _unread),
    # two threads' collectives on one group, read from their call lines
    (Confidence.MEDIUM, _race_from_lines),
    # one sample shows where a rank is, not whether it moves
    (Confidence.MEDIUM, _one_sample),
    # an op inferred from a .wait() line, native frames or DDP's sync may not be the
    # collective, or the call site, the rank actually waits in
    (Confidence.MEDIUM, _indirect_ops),
    # ranks of the hang wait for device work at a host sync: they wait, but for which
    # collective is not visible
    (Confidence.MEDIUM, _device_waiters),
    # a rank outside the op still works: the others may be waiting for a slow rank
    (Confidence.MEDIUM, _still_working),
    # a rank outside the op idle for a short while only: a slow read or lock may return
    (Confidence.MEDIUM, _briefly_idle),
    # a rank of the hang still moves inside its op: the evidence conflicts with "stuck"
    (Confidence.MEDIUM, _waiting_moves),
    # not_hung without a completed op: counters also move in a spin or a retry loop
    (Confidence.MEDIUM, _counters_only),
    # the majority waits on a passed group: the minority's different op may be its own
    # group's, legitimately apart (a WORLD op, by contrast, needs every rank)
    (Confidence.MEDIUM, _groups_unseen),
    # culprits from where the stacks part, not from the ops they wait in
    (Confidence.MEDIUM, _by_parting),
    # the culprits left a structure of groups read from call lines, not arguments
    (Confidence.MEDIUM, _groups_from_lines),
    # a few ranks completed ops while more waited: the job may be stuck around them
    (Confidence.MEDIUM, _few_moving),
    # the ranks wait on a process that runs: slow work looks the same for a while
    (Confidence.MEDIUM, _wait_ends_running),
    # a link of the wait the ranks are in was read from stacks, not named by the kernel
    (Confidence.MEDIUM, _wait_inferred),
)


# -- what the other sources set, where they weighed in ----------------------------------

# The flight recorder's dumps, by how they weighed on the stacks' verdict: the level they
# set (None: the stacks' own stands). The stacks' basis stays, said after the dumps' own
# phrase; their doubts no longer lower a verdict the dumps decided.
SETTLED_BY_FLIGHT: dict[FlightRole, Callable[[Classification], Confidence | None]] = {
    # the dumps show the stacks' culprits past the collective the others wait in: nobody is named
    FlightRole.OVERRULES: lambda r: Confidence.LOW,
    # agreeing dumps that name the culprits settle them; a rank still working (ambiguous)
    # stays as unsure as the stacks leave it: the dumps show it has not issued the
    # collective, not that it never will
    FlightRole.AGREES: lambda r: (
        Confidence.HIGH if r.flight and r.flight.finding.culprits and not r.finding.ambiguous else None
    ),
    # the dumps decide: sure where they name the culprits
    FlightRole.OVERRIDES: lambda r: Confidence.HIGH if r.culprits else Confidence.MEDIUM,
    # dumps and no stacks: one dump per rank cannot show whether the ranks still wait
    FlightRole.ALONE: lambda r: Confidence.MEDIUM if r.culprits else Confidence.LOW,
}
# culprits no evidence shows (no dump, no stacks) are named on their peers' word: their
# peers' dumps say the collective waits on them, not what they do
FLIGHT_UNSEEN = Confidence.LOW
ALONE_UNSURE = "no stacks: one dump per rank cannot show whether the ranks still wait"
# RAS's launch counts turned a transport hang into a straggler: one reading, and the stacks
# could not see which host sync the ranks behind wait at
RAS_BEHIND = Confidence.MEDIUM


def settled(result: Classification, stacks: Judgement) -> tuple[Confidence, list[str]]:
    """The level and basis once the flight recorder, then the GPUs and RAS, weighed in."""
    level, basis = stacks.confidence, list(stacks.basis)
    said = result.flight
    if said is not None and said.role not in (FlightRole.NOT_WEIGHED, FlightRole.EVIDENCE):
        basis = [
            said.finding.basis,
            *((ALONE_UNSURE,) if said.role in (FlightRole.ALONE, FlightRole.ALONE_SAYS) else basis),
        ]
        row = SETTLED_BY_FLIGHT.get(said.role)
        if row is not None:
            level = FLIGHT_UNSEEN if said.finding.unseen else (row(result) or level)
    devices = result.devices
    if devices is not None:
        basis = [*devices.agreeing, *basis]
        if devices.role is DeviceRole.BEHIND:
            basis.insert(0, settle.RAS_BEHIND)
            level = RAS_BEHIND
        elif devices.role is DeviceRole.NAMED:
            basis.insert(0, f"culprits named by transport evidence: {'; '.join(devices.named_how)}")
    return level, basis


def _over_part(
    verdict: Verdict, level: Confidence, basis: list[str], not_seen: Sequence[int], coverage_unknown: bool
) -> Judgement:
    """A hang verdict said of part of the job, or of a part of unknown size, stays low,
    whichever source decided it."""
    if not (not_seen or coverage_unknown) or verdict in (Verdict.NOT_HUNG, Verdict.UNKNOWN) or level is Confidence.LOW:
        return Judgement(level, tuple(basis))
    said = f"{rank_phrase(not_seen)} not seen" if not_seen else SIZE_UNKNOWN
    if not any(said in b for b in basis):
        basis.append(said)
    return Judgement(Confidence.LOW, tuple(basis))


# -- helpers -------------------------------------------------------------------------------


def _working(v: RankView) -> bool:
    """On CPU, moving bytes or changing its stack (wake-ups alone are not work: a rank
    polling a stale lock wakes forever without getting anywhere)."""
    move = v.move
    return v.state is RankState.BUSY or (move is not None and (move.moving or move.stack_changed))


def _moves_in_op(v: RankView) -> bool:
    """A rank in an op whose counters or stack move: it is not simply stuck."""
    return v.state is RankState.COMMUNICATING or (v.move is not None and v.move.stack_changed)


def _idle_for(case: Case) -> float | None:
    """How long the ranks outside any op of an ambiguous hang were watched doing nothing;
    None when the finding is not ambiguous or one of them works (``_still_working``)."""
    if not (case.hang and case.found.ambiguous and case.outside):
        return None
    if any(_working(v) for v in case.outside):
        return None
    return _seconds(case.outside) or 0.0


def _seconds(views: Sequence[RankView]) -> float | None:
    moves = [v.move.seconds for v in views if v.move is not None]
    return min(moves) if moves else None


def _has_minority(f: Mismatch) -> bool:
    sizes = sorted((len(g) for g in f.groups), reverse=True)
    return len(sizes) > 1 and sizes[0] > sizes[1]


def _who(views: Sequence[RankView]) -> str:
    return rank_phrase([v.rank for v in views])


def _their(ranks: Sequence[object]) -> str:
    return "its stack" if len(ranks) == 1 else "their stacks"


def _verb(ranks: Sequence[object], singular: str, plural: str) -> str:
    return singular if len(ranks) == 1 else plural
