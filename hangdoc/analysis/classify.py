"""Name the hang: verdict, culprit ranks, evidence quoting frames, next steps.

Input is the per-rank view built by ``analyse`` (state, distributed op, relevant thread,
movement). The rules are checked in a fixed order, most specific first:
progress -> rank_missing -> init_deadlock -> cleanup_deadlock -> straggler ->
collective_mismatch -> nccl_timeout -> unknown.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..model import DistOp, JobSnapshot, OpKind, RankState, Verdict, compress_ranks
from .views import RankView

IN_OP = (RankState.WAITING, RankState.COMMUNICATING)
OUTSIDE = (RankState.BUSY, RankState.BLOCKED, RankState.STOPPED)

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


@dataclass
class Classification:
    verdict: Verdict
    culprits: list[int]
    summary: str
    evidence: list[str] = field(default_factory=list)
    next_steps: tuple[str, ...] = ()
    ambiguous: bool = False


def _r(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {compress_ranks(ranks)[1:-1]}"


def _v(ranks: Sequence[object], singular: str, plural: str) -> str:
    return singular if len(ranks) == 1 else plural


def _op_where(op: DistOp) -> str:
    return op.describe()


def describe_rank(v: RankView) -> str:
    """One line on what a rank is doing, quoting its frames."""
    if v.op is not None:
        text = f"in {_op_where(v.op)}"
        if v.op.via != "c10d call":
            text += f", recognised by {v.op.via}"
        if v.op.in_cleanup and v.op.cleanup_frame is not None:
            text += f", on a cleanup path: {v.op.cleanup_frame}"
        return text
    if v.thread is None:
        errors = [s.error for s in v.snap.samples if s.error]
        return errors[-1].message if errors else "no stack"
    return _what_outside(v)


_LOCK = re.compile(r"(\.acquire\(|\bwith\b.*\block\b|Lock\(|\.wait\(|Condition)", re.IGNORECASE)
_IO = re.compile(r"(\.read\w*\(|\.recv\w*\(|\.accept\(|\bopen\(|\.readline|select\(|\.get\()")


def _activity(v: RankView) -> str:
    move = v.move
    if v.state is RankState.STOPPED:
        return "stopped (SIGSTOP or a debugger)"
    if move is not None and move.busy:
        return f"computing ({move.cpu_fraction:.0%} of a core)"
    inner = (v.thread.innermost_python if v.thread else None)
    code = (inner.code or "") if inner else ""
    func = inner.function if inner else ""
    if move is not None and move.status == "disk-sleep":
        return "blocked on I/O (uninterruptible disk sleep)"
    if func in ("acquire", "wait") and inner and "threading" in inner.filename or _LOCK.search(code):
        return "blocked on a lock"
    if _IO.search(code) or func in ("read", "readinto", "recv", "recv_into", "accept", "select"):
        return "blocked on I/O"
    if "sleep(" in code:
        return "sleeping"
    return "idle outside any distributed op"


def _what_outside(v: RankView) -> str:
    inner = (v.thread.innermost_python if v.thread else None)
    name = v.thread.name if v.thread else "?"
    where = f" at {inner}" if inner else ""
    code = f" `{inner.code}`" if inner and inner.code else ""
    text = f"{_activity(v)}, not in any collective: thread '{name}'{where}{code}"
    others = _other_threads(v)
    return text + (f"; other threads: {others}" if others else "")


def _other_threads(v: RankView) -> str:
    sample = v.snap.latest
    if sample is None or v.thread is None:
        return ""
    parts = []
    for th in sample.threads:
        if th.thread_id == v.thread.thread_id:
            continue
        inner = th.innermost_python
        if inner is not None:
            parts.append(f"'{th.name}' {'running' if th.active else 'waiting'} at {inner}")
    return "; ".join(parts[:3])


def classify(
    views: Sequence[RankView], missing: Sequence[int], unknown: Sequence[int], snapshot: JobSnapshot
) -> Classification:
    by_state: dict[RankState, list[RankView]] = defaultdict(list)
    for v in views:
        by_state[v.state].append(v)
    waiting = by_state[RankState.WAITING]
    in_op = [v for v in views if v.state in IN_OP]
    outside = [v for v in views if v.state in OUTSIDE]
    exited = [v.rank for v in by_state[RankState.EXITED]]
    progressing = by_state[RankState.PROGRESSING]
    unreadable = by_state[RankState.UNREADABLE]
    notes: list[str] = []
    if unknown:
        notes.append(f"{_r(unknown)} are on nodes that did not answer: their state is unknown")
    if unreadable:
        notes.append(
            f"{_r([v.rank for v in unreadable])} could not be read: "
            + "; ".join(sorted({describe_rank(v) for v in unreadable}))
        )

    def done(c: Classification) -> Classification:
        c.evidence = c.evidence + notes
        c.next_steps = c.next_steps or NEXT_STEPS[c.verdict]
        if unknown and c.verdict is not Verdict.NOT_HUNG:
            c.summary += f" (partial evidence: {_r(unknown)} unknown)"
        return c

    if not views:
        return done(Classification(Verdict.UNKNOWN, [], "No rank could be captured.", []))

    # -- progress
    if progressing or not waiting:
        c = _not_hung(views, progressing, in_op, outside, waiting)
        if c is not None:
            return done(c)
    quiet = _quiet_line(in_op)

    # -- rank_missing
    gone = sorted(set(missing) | set(exited))
    if gone:
        world = len(views) + len(gone) + len(unknown)
        evidence = [f"{_r(gone)} of world size {world} {_v(gone, 'has', 'have')} no process"]
        if exited:
            evidence.append(f"{_r(exited)} exited during the capture")
        evidence += _op_lines(in_op)
        waiting_on = _op_summary(in_op) or "their last operation"
        return done(Classification(
            Verdict.RANK_MISSING, gone,
            f"rank missing: {_r(gone)} {_v(gone, 'has', 'have')} no process while "
            f"{_r([v.rank for v in in_op])} {_v(in_op, 'waits', 'wait')} in {waiting_on}",
            evidence + [quiet],
        ))

    # -- init_deadlock
    init = [v for v in in_op if v.op and v.op.kind is OpKind.INIT]
    if init:
        return done(_init_deadlock(views, init, in_op, outside, quiet))

    # -- cleanup_deadlock: in a collective on a cleanup path, or idle in cleanup code (joining
    #    a thread, waiting on a queue in __exit__) while the others wait in the training loop
    cleanup = [v for v in in_op if v.op and (v.op.in_cleanup or v.op.kind is OpKind.CLEANUP)]
    cleanup += [v for v in outside if v.state is RankState.BLOCKED and v.cleanup is not None]
    training = [v for v in in_op if v not in cleanup]
    if cleanup and training:
        culprits = [v.rank for v in cleanup]
        evidence = [f"rank {v.rank} is on a cleanup path: {_cleanup_where(v)}" for v in cleanup]
        evidence += _op_lines(training)
        return done(Classification(
            Verdict.CLEANUP_DEADLOCK, culprits,
            f"cleanup deadlock: {_r(culprits)} left the training loop and "
            f"{_v(culprits, 'waits', 'wait')} in cleanup ({' / '.join(sorted({_cleanup_short(v) for v in cleanup}))}) "
            f"while {_r([v.rank for v in training])} {_v(training, 'waits', 'wait')} in "
            f"{_op_summary(training)}",
            evidence + [quiet],
        ))

    # -- straggler
    if outside and in_op:
        culprits = [v.rank for v in outside]
        evidence = [f"rank {v.rank} is {describe_rank(v)}" for v in outside]
        evidence += _op_lines(in_op)
        activity = sorted({_activity(v) for v in outside})
        return done(Classification(
            Verdict.STRAGGLER, culprits,
            f"straggler: {_r(culprits)} {_v(culprits, 'is', 'are')} {'/'.join(activity)} while "
            f"{_r([v.rank for v in in_op])} {_v(in_op, 'waits', 'wait')} in {_op_summary(in_op)}",
            evidence + [quiet],
            ambiguous=True,  # a slow rank may still finish: observe longer
        ))

    # -- collective_mismatch / nccl_timeout
    classes: dict[tuple[str, str | None], list[RankView]] = defaultdict(list)
    for v in in_op:
        classes[v.op.key].append(v)  # type: ignore[union-attr]
    p2p_problem = _p2p_unpaired(in_op)
    if len(classes) > 1 or p2p_problem:
        return done(_mismatch(classes, p2p_problem, quiet))
    if in_op:
        op = in_op[0].op
        assert op is not None
        ranks = [v.rank for v in in_op]
        return done(Classification(
            Verdict.NCCL_TIMEOUT, [],
            f"transport hang: every rank ({_r(ranks)}) waits in the same {_op_where(op)} "
            "and no data moves",
            _op_lines(in_op) + [quiet],
        ))
    return done(Classification(
        Verdict.UNKNOWN, [],
        "No rank is in a distributed operation and nothing moves; hangdoc cannot tell why.",
        [f"rank {v.rank}: {describe_rank(v)}" for v in views],
    ))


def _cleanup_where(v: RankView) -> str:
    if v.op is not None:
        return f"{v.op.cleanup_frame or v.op.call_site} -> {_op_where(v.op)}"
    return f"{v.cleanup}; {_what_outside(v)}"


def _cleanup_short(v: RankView) -> str:
    if v.op is not None:
        return _op_where(v.op)
    inner = (v.thread.innermost_python if v.thread else None)
    return f"{_activity(v)} in {v.cleanup.location if v.cleanup else '?'}" + (
        f" at {inner.function}" if inner else ""
    )


def _not_hung(views, progressing, in_op, outside, waiting) -> Classification | None:
    """A job where something moves the way a healthy job moves; None when it is not."""
    if progressing:
        moved = [v.rank for v in progressing]
        return Classification(
            Verdict.NOT_HUNG, [],
            f"not hung: {_r(moved)} completed distributed operations during the window",
            [_progress_line(v) for v in progressing[:4]],
        )
    communicating = [v for v in in_op if v.state is RankState.COMMUNICATING]
    if communicating and not waiting:
        return Classification(
            Verdict.NOT_HUNG, [],
            f"not hung: {_r([v.rank for v in communicating])} are inside "
            f"{_op_summary(communicating)} and data is moving",
            [_move_line(v) for v in communicating[:4]],
            ambiguous=bool(outside),
        )
    busy = [v for v in outside if v.state is RankState.BUSY or (
        v.move is not None and (v.move.moving or v.move.stack_changed or v.move.woke))]
    if not in_op and busy:
        return Classification(
            Verdict.NOT_HUNG, [],
            f"not hung: no rank waits in a distributed operation; {_r([v.rank for v in busy])} "
            f"{_v(busy, 'is', 'are')} working (CPU, I/O or changing stacks)",
            [f"rank {v.rank} is {describe_rank(v)}" for v in busy[:4]],
        )
    return None


def _progress_line(v: RankView) -> str:
    m = v.move
    if m is not None and not (m.op_changed or m.left_op) and m.wakeups is not None:
        return (
            f"rank {v.rank} was seen only in {describe_rank(v)}, but its main thread woke "
            f"{m.wakeups} times on its own over {m.seconds:.1f} s: the call keeps completing "
            "and being issued again"
        )
    return f"rank {v.rank} went through different operations between samples (last: {describe_rank(v)})"


def _init_deadlock(views, init, in_op, outside, quiet) -> Classification:
    init_ranks = [v.rank for v in init]
    others = [v for v in views if v not in init and v.state is not RankState.UNREADABLE]
    evidence = _op_lines(init)
    evidence += [f"rank {v.rank} is {describe_rank(v)}" for v in others]
    if others:
        other_ranks = [v.rank for v in others]
        culprits = other_ranks if len(other_ranks) <= len(init_ranks) else init_ranks
        went_past = any(v.op is not None and v.op.kind is not OpKind.INIT for v in others)
        summary = (
            f"init deadlock: {_r(init_ranks)} {_v(init_ranks, 'waits', 'wait')} in {_op_summary(init)} while "
            f"{_r(other_ranks)} {'went past it' if went_past else 'never reached it'}"
        )
        ambiguous = any(v.state is RankState.BUSY for v in others)
        return Classification(
            Verdict.INIT_DEADLOCK, culprits, summary, evidence + [quiet], ambiguous=ambiguous
        )
    culprits, env_line = _env_disagreement(init)
    if env_line:
        evidence.insert(0, env_line)
    classes: dict[tuple[str, str | None], list[int]] = defaultdict(list)
    for v in init:
        classes[v.op.key].append(v.rank)
    if not culprits and len(classes) > 1:
        culprits = _minority(list(classes.values()))
    summary = f"init deadlock: every rank waits in {_op_summary(init)}"
    if culprits:
        summary += f"; {_r(culprits)} differ"
    return Classification(Verdict.INIT_DEADLOCK, culprits, summary, evidence + [quiet])


_RDZV_KEYS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "SLURM_NTASKS")


def _env_disagreement(init: Sequence[RankView]) -> tuple[list[int], str]:
    for key in _RDZV_KEYS:
        values: dict[str | None, list[int]] = defaultdict(list)
        for v in init:
            values[v.snap.process.env_get(key)].append(v.rank)
        if len(values) > 1:
            culprits = _minority(list(values.values()))
            desc = ", ".join(f"{key}={val} on {_r(r)}" for val, r in values.items())
            return culprits, f"ranks disagree on the rendezvous: {desc}"
    return [], ""


def _minority(classes: list[list[int]]) -> list[int]:
    """Ranks outside the unique largest class; [] when the largest class is not unique."""
    sizes = sorted((len(c) for c in classes), reverse=True)
    if len(sizes) < 2 or sizes[0] == sizes[1]:
        return []
    biggest = max(classes, key=len)
    return sorted(r for c in classes if c is not biggest for r in c)


def _mismatch(classes, p2p_problem: tuple[list[int], list[str]] | None, quiet: str) -> Classification:
    groups = sorted(classes.values(), key=lambda vs: (-len(vs), vs[0].rank))
    culprits = _minority([[v.rank for v in vs] for vs in groups])
    evidence = []
    for vs in groups:
        evidence.append(f"{_r([v.rank for v in vs])} {_v(vs, 'waits', 'wait')} in {_op_where(vs[0].op)}"
                        + _frame_tail(vs[0]))
    if p2p_problem is not None:
        p2p_culprits, lines = p2p_problem
        evidence += lines
        if not culprits:
            culprits = p2p_culprits
    if len(groups) > 1:
        minority = [v for vs in groups[1:] for v in vs] if culprits else []
        if culprits and minority:
            majority = groups[0]
            summary = (
                f"collective mismatch: {_r(culprits)} "
                f"{'is' if len(culprits) == 1 else 'are'} in {_op_summary(minority)} while "
                f"{_r([v.rank for v in majority])} are in {_op_where(majority[0].op)}"
            )
        else:
            summary = "collective mismatch: " + "; ".join(
                f"{_r([v.rank for v in vs])} in {_op_where(vs[0].op)}" for vs in groups
            )
    else:
        summary = "collective mismatch: point-to-point calls do not pair up: " + (
            p2p_problem[1][0] if p2p_problem else ""
        )
    return Classification(Verdict.COLLECTIVE_MISMATCH, culprits, summary, evidence + [quiet])


def _p2p_unpaired(in_op: Sequence[RankView]) -> tuple[list[int], list[str]] | None:
    """Send/recv that cannot complete: receivers whose peer is not sending to them."""
    p2p = [v for v in in_op if v.op and v.op.kind is OpKind.P2P]
    if not p2p:
        return None
    by_rank = {v.rank: v for v in in_op}
    lines: list[str] = []
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
                lines.append(
                    f"rank {v.rank} {'receives from' if receiving else 'sends to'} rank {op.peer} "
                    f"({op.call_site.location if op.call_site else op.name}), but rank {op.peer} "
                    f"is in {_op_where(peer_op) if peer_op else 'no distributed op'}"
                )
                culprits.append(op.peer)
    receivers = [v for v in p2p if "recv" in v.op.name]  # type: ignore[union-attr]
    senders = [v for v in p2p if "send" in v.op.name]  # type: ignore[union-attr]
    if receivers and not senders and not lines and len(p2p) == len(in_op):
        lines.append(f"{_r([v.rank for v in receivers])} all receive and no rank sends")
        culprits = [v.rank for v in receivers]
    if not lines:
        return None
    return sorted(set(culprits)), lines


def _frame_tail(v: RankView) -> str:
    if v.thread is None:
        return ""
    inner = (v.thread.innermost_python if v.thread else None)
    if inner is None or v.op is None or inner == v.op.call_site or inner.function == v.op.name:
        return ""
    return f" [innermost: {inner}]"


def _op_summary(views: Sequence[RankView]) -> str:
    ops = sorted({_op_where(v.op) for v in views if v.op})
    return " / ".join(ops) if ops else "?"


def _op_lines(views: Sequence[RankView]) -> list[str]:
    classes: dict[str, list[int]] = defaultdict(list)
    tails: dict[str, str] = {}
    for v in views:
        if v.op is None:
            continue
        key = _op_where(v.op) + (f" via {v.op.via}" if v.op.via != "c10d call" else "")
        classes[key].append(v.rank)
        tails.setdefault(key, _frame_tail(v))
    return [f"{_r(r)} {_v(r, 'waits', 'wait')} in {k}{tails[k]}" for k, r in classes.items()]


def _move_line(v: RankView) -> str:
    m = v.move
    if m is None:
        return f"rank {v.rank}: no counters"
    cpu = f"{m.cpu_fraction:.0%} CPU" if m.cpu_fraction is not None else "CPU unknown"
    io = f"{m.bytes_per_second / 1e6:.1f} MB/s read+written" if m.bytes_per_second is not None else ""
    return f"rank {v.rank} in {describe_rank(v)}: {cpu}, {io} over {m.seconds:.1f} s"


def _quiet_line(in_op: Sequence[RankView]) -> str:
    moves = [v.move for v in in_op if v.move is not None]
    if not moves:
        return "no progress counters were available"
    seconds = min(m.seconds for m in moves)
    cpu = max((m.cpu_fraction or 0.0) for m in moves)
    io = max((m.bytes_per_second or 0.0) for m in moves)
    return (
        f"nothing moved on the waiting ranks over {seconds:.1f} s: stacks unchanged, "
        f"at most {cpu:.1%} CPU and {io / 1024:.1f} KiB/s read+written"
    )
