"""The phrases the sentences of a diagnosis are built from: a rank's state and op, what a
rank outside any op is doing, cleanup paths, counters, and who waits on whom for a lock.
Shared by ``wording`` (the sentences of each verdict), ``confidence`` and ``analyse``."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection, Sequence

from ..memo import once_per_object
from ..model import CaptureErrorKind, DistOp, Evidence, Frame, RankState, ThreadStack
from ..rankranges import rank_phrase
from .host_sync import waits_for_device
from .locks import REENTRANT, LockEdge, LockGraph
from .ops import exit_frame
from .views import RankView

# -- building blocks: ranks, ops, frames, counters --------------------------------------


def verb_for(ranks: Sequence[object], singular: str, plural: str) -> str:
    """The verb form agreeing with the number of ranks."""
    return singular if len(ranks) == 1 else plural


def op_site(op: DistOp | None) -> str:
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
    inner = v.thread.innermost_python if v.thread else None
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
    inner = v.thread.innermost_python if v.thread else None
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
        return (
            f"{'self-deadlock: ' if lead else ''}thread {_thread(edge.wait.thread)} waits at "
            f"{edge.wait.frame}{_code(edge.wait.frame)} for a plain Lock it already holds"
            f"{taken}: it can never get it"
        )
    parts = []
    for i, edge in enumerate(cycle):
        holder = edge.holder
        assert holder is not None
        who = f"thread {_thread(edge.wait.thread)} waits" if i == 0 else "which waits"
        parts.append(
            f"{who} at {edge.wait.frame}{_code(edge.wait.frame)} for a lock held by "
            f"thread {_thread(holder.thread)} (taken at {holder.location})"
        )
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
        return (
            text + f", a lock it already holds (taken at {holder.location}): a self-deadlock "
            "if it is a plain Lock, fine if it is an RLock"
        )
    if holder is None:
        if wait.lock is None:
            return text
        return (
            text + ", held by no thread whose stack shows it (taken in a function that "
            "returned, or by a thread that ended)"
        )
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
        found = [(deadlock_words(cycle), deadlock_words(cycle, lead=False)) for cycle in graph.deadlocked]
        found += [
            (f"thread {_thread(e.wait.thread)} is {lock_wait_words(e, graph)}", lock_wait_words(e, graph))
            for e in graph.edges
            if e.holder_op is not None
        ]
        lines += [f"rank {v.rank}: {words}" for words, core in found if not any(core in line for line in said)]
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
        return cleanup_op(v.op)
    return f"{v.cleanup}; {what_outside(v)}"


def cleanup_op(op: DistOp) -> str:
    return f"{op.cleanup_frame or op.call_site} -> {op.describe()}"


def cleanup_short(v: RankView) -> str:
    """The same, short, for a summary."""
    if v.op is not None:
        return v.op.describe()
    if v.thread is not None and (exiting := exit_frame(v.thread)) is not None:
        joining = " joining its non-daemon threads" if exiting.function.endswith("_shutdown") else ""
        return f"exiting: {exiting.function} ({exiting.location}){joining}"
    inner = v.thread.innermost_python if v.thread else None
    return f"{activity(v)} in {v.cleanup.location if v.cleanup else '?'}" + (f" at {inner.function}" if inner else "")


def progress_line(v: RankView) -> Evidence:
    """Why a rank counts as progressing."""
    m = v.move
    if m is not None and not (m.op_changed or m.left_op) and m.wakeups is not None:
        return Evidence(
            f"was seen only in {describe_rank(v)}, but its main thread woke "
            f"{m.wakeups} times on its own over {m.seconds:.1f} s: the call keeps completing "
            "and being issued again",
            v.rank,
        )
    return Evidence(f"went through different operations between samples (last: {describe_rank(v)})", v.rank)


def frame_tail(v: RankView) -> str:
    """`` [innermost: frame]`` when the rank's innermost frame says more than its op."""
    if v.thread is None:
        return ""
    inner = v.thread.innermost_python if v.thread else None
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
    return [f"{rank_phrase(r)} {verb_for(r, 'waits', 'wait')} {k}{tails[k]}" for k, r in classes.items()]


def move_line(v: RankView) -> Evidence:
    """A communicating rank's counters."""
    m = v.move
    if m is None:
        return Evidence(f"rank {v.rank}: no counters")
    cpu = f"{m.cpu_fraction:.0%} CPU" if m.cpu_fraction is not None else "CPU unknown"
    io = ""
    if m.bytes_per_second is not None:
        io = f"{m.bytes_per_second / 1e6:.1f} MB/s read+written"
    return Evidence(f"in {describe_rank(v)}: {cpu}, {io} over {m.seconds:.1f} s", v.rank)


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
    text = (
        f"nothing moved on the waiting ranks over {seconds:.1f} s: stacks unchanged, "
        f"at most {cpu:.1%} CPU and {io / 1024:.1f} KiB/s read+written"
    )
    if spinning:
        text += (
            f" ({rank_phrase(ranks_of(spinning))} at a host sync "
            f"{'spins' if len(spinning) == 1 else 'spin'} a core while "
            f"{'it waits' if len(spinning) == 1 else 'they wait'}: not counted)"
        )
    return text


def ranks_of(views: Sequence[RankView]) -> list[int]:
    return [v.rank for v in views]


_ERROR_MEANS = {
    CaptureErrorKind.TIMEOUT: "py-spy timed out",
    CaptureErrorKind.PTRACE_DENIED: "ptrace refused",
    CaptureErrorKind.NOT_PYTHON: "no Python interpreter found",
    CaptureErrorKind.PYSPY_FAILED: "py-spy failed",
    CaptureErrorKind.PYSPY_MISSING: "no py-spy",
}


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
