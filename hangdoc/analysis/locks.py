"""Threads of one rank that wait on locks, who holds those locks, and lock-order deadlocks.

Within one sample of one rank (py-spy pauses every thread at once, so it is one instant):

- **a thread waits on a lock** when it is off CPU and its innermost Python frame of the
  job's or a library's code is on a ``with EXPR:`` line or an ``EXPR.acquire(`` call
  (``threading``'s own ``Condition.__enter__``/``acquire`` frames above it are looked
  through to their caller). Where native frames were captured, they must show the
  interpreter's lock acquire (``PyThread_acquire_lock_timed``, ``lock_PyThread_acquire_lock``,
  ``rlock_acquire``, a futex or semaphore wait): a ``with`` line whose thread is elsewhere
  in C is not waiting on a lock.
- **a thread holds a lock** when one of its frames' current line lies inside a
  ``with EXPR:`` block of that frame's function (read from the source lines capture kept,
  by indentation), or follows an ``EXPR.acquire()`` statement of an enclosing block with
  no ``EXPR.release()`` after it. This is inferred from the code, not read from the lock:
  py-spy reads memory without running code, so a lock's ``locals`` show only its type and
  address (``<_thread.lock at 0x7f..>``), never whether it is locked or, for an RLock, by
  whom. A lock taken in a function that has returned, or by a thread that ended, has no
  holder on any stack; hangdoc then says so and names none.
- **which lock** an expression names (``LockId``): capture keeps, for frames of the job's
  and libraries' code, the object address of each local variable that a ``with`` or
  ``acquire`` line of the function starts from (``FrameLocals`` entries named
  ``@NAME``: ``0x7f..``, with the type for the standard library's lock types; ``-`` for a
  name that is not a local). ``self._lock`` in a frame whose ``self`` is the object at
  0x7f..10 and ``loader._lock`` in a frame whose ``loader`` is that same object are the
  same lock: two live frames cannot hold different objects at one address. A name that is
  not a local is the module's global (``(file, name)``), except in a nested function
  (``outer.<locals>.inner``), where it may be a closure's variable: no identity then.
  Expressions that name a lock through different roots (``lock = self._lock``; ``with
  lock:``) are not matched: a missed edge, never a false one.

The wait-for graph goes thread -> the lock it waits on -> the thread that holds it. A
cycle is a lock-order deadlock: no thread in it can go on. A thread that waits on a lock it
holds itself is a self-deadlock only when the lock is known to be a plain ``Lock``
(an ``RLock`` re-enters; a lock reached through an attribute has no known type).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ..model import MAX_LINES_BEFORE, DistOp, Frame, FrameLocals, Origin, Sample, ThreadStack
from .source_lines import Lines, SourceIndex

# capture's prefix for the kept identities of a frame's locals (``capture.read.pyspy``)
OBJECT_PREFIX = "@"
NOT_A_LOCAL = "-"
_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_WITH = re.compile(r"^\s*(?:async\s+)?with\s+(?P<items>.+?)\s*:\s*(?:#.*)?$")
_ITEM = re.compile(rf"(?P<expr>{_DOTTED})(?:\s+as\s+[A-Za-z_]\w*)?")
_ACQUIRE = re.compile(rf"^\s*(?:(?:if|while)\s+(?:not\s+)?|[A-Za-z_]\w*\s*=\s*)?(?P<expr>{_DOTTED})\.acquire\s*\(")
_RELEASE = re.compile(rf"^\s*(?P<expr>{_DOTTED})\.release\s*\(")
_DEF = re.compile(r"^\s*(async\s+def|def|class)\s")
# the interpreter blocked acquiring a lock, by CPython's own function names (and the libc
# waits under them), where native frames were captured
_NATIVE_ACQUIRE = re.compile(
    r"PyThread_acquire_lock|lock_PyThread_acquire_lock|rlock_acquire|acquire_timed"
    r"|_PySemaphore_Wait|futex|sem_(?:timed|clock)?wait|pthread_cond_(?:timed)?wait",
    re.IGNORECASE,
)
# threading's own frames a waiter passes through on its way into the lock
_THREADING_ENTRY = frozenset({"__enter__", "acquire", "_acquire_restore"})
REENTRANT = frozenset({"_thread.RLock", "RLock", "_RLock"})
PLAIN = frozenset({"_thread.lock", "lock"})

# what names a lock: ("obj", address, attribute path) or ("global", file, expression)
LockId = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class LockWait:
    """A thread waiting to take a lock: where, the expression, and which lock if known."""

    thread: ThreadStack
    frame: Frame
    expr: str | None  # the lock expression on the line; None when it names several
    lock: LockId | None
    kind: str | None = None  # the lock's type when the expression is a local holding it


@dataclass(frozen=True, slots=True)
class Hold:
    """A lock a thread holds: the frame inside whose block it is, and the line that took it."""

    thread: ThreadStack
    frame: Frame
    line: int  # the ``with``/``acquire`` line
    expr: str
    lock: LockId

    @property
    def location(self) -> str:
        return f"{self.frame.short_filename}:{self.line}"


@dataclass(frozen=True, slots=True)
class LockEdge:
    """One waiter and who holds what it waits for."""

    wait: LockWait
    holder: Hold | None = None  # None: no thread's frames show it held (or no identity)
    holder_op: DistOp | None = None  # the distributed op the holder thread is in, if any
    reentry: bool = False  # the waiter holds that lock itself


@dataclass(frozen=True, slots=True)
class LockGraph:
    """The lock waits of one sample of one rank, and the cycles among them."""

    edges: tuple[LockEdge, ...]
    cycles: tuple[tuple[LockEdge, ...], ...] = ()  # each in wait-for order, main thread first
    self_deadlocks: tuple[LockEdge, ...] = ()  # a thread waiting on a plain Lock it holds

    def edge_of(self, thread: ThreadStack) -> LockEdge | None:
        for edge in self.edges:
            if edge.wait.thread.thread_id == thread.thread_id:
                return edge
        return None

    def cycle_of(self, thread: ThreadStack) -> tuple[LockEdge, ...] | None:
        for cycle in self.cycles:
            if any(e.wait.thread.thread_id == thread.thread_id for e in cycle):
                return cycle
        for edge in self.self_deadlocks:
            if edge.wait.thread.thread_id == thread.thread_id:
                return (edge,)
        return None

    @property
    def deadlocked(self) -> tuple[tuple[LockEdge, ...], ...]:
        """Every deadlock: the cycles, then the self-deadlocks (a cycle of one)."""
        return self.cycles + tuple((e,) for e in self.self_deadlocks)


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())


def with_items(code: str | None) -> list[str] | None:
    """The lock-like items of a ``with`` line (dotted names, ``as`` dropped); None when the
    line is no ``with``. ``with open(p) as f:`` and ``with torch.no_grad():`` give []."""
    m = _WITH.match(code or "")
    if not m:
        return None
    items = []
    for part in _split_items(m.group("items")):
        item = _ITEM.fullmatch(part.strip())
        if item:
            items.append(item.group("expr"))
    return items


def _split_items(text: str) -> list[str]:
    """``a, b(c, d) as e`` -> ``["a", " b(c, d) as e"]``: commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _acquired(code: str | None) -> str | None:
    m = _ACQUIRE.match(code or "")
    return m.group("expr") if m else None


def lock_wait_frame(thread: ThreadStack) -> int | None:
    """The index of the frame where ``thread`` waits on a lock, or None."""
    if thread.active:
        return None
    frames = thread.frames
    innermost = len(frames) - 1
    while innermost >= 0 and frames[innermost].native:
        innermost -= 1
    if innermost < 0:
        return None
    code = frames[innermost].code or ""
    if "with" not in code and "acquire" not in code and "__enter__" not in frames[innermost].function:
        return None  # the common case, cheaply: no lock on its innermost line
    below = frames[innermost + 1 :]
    if below and not any(_NATIVE_ACQUIRE.search(f.function) for f in below):
        return None  # native frames say it is somewhere else in C
    for index in range(innermost, -1, -1):
        frame = frames[index]
        if frame.native:
            continue
        kind = frame.origin.kind
        if (
            kind is Origin.STDLIB
            and frame.origin.module_path == "threading.py"
            and frame.function.rsplit(".", 1)[-1] in _THREADING_ENTRY
        ):
            continue  # Condition.__enter__ / a Python-level acquire: its caller's line says which
        if kind not in (Origin.USER, Origin.LIBRARY):
            return None
        items = with_items(frame.code)
        if items or _acquired(frame.code):
            return index
        return None
    return None


def _identity(expr: str, frame: Frame, found: FrameLocals | None) -> tuple[LockId | None, str | None]:
    """Which lock ``expr`` names in ``frame`` (see the module doc), and its type when the
    expression is a local holding the lock itself."""
    root, _, rest = expr.partition(".")
    value = found.get(OBJECT_PREFIX + root) if found is not None else None
    if value is None:
        return None, None  # not captured: no locals, or an older capture
    if value == NOT_A_LOCAL:
        if "<locals>" in frame.function or "<lambda>" in frame.function:
            return None, None  # a nested function: the name may be a closure's variable
        return ("global", frame.filename, expr), None
    address, _, kind = value.partition(" ")
    if not address.startswith("0x"):
        return None, None
    return ("obj", address, rest), (kind or None) if not rest else None


def holds(thread: ThreadStack, sources: SourceIndex) -> list[Hold]:
    """The locks ``thread`` holds, by the blocks its frames are inside (module doc)."""
    found: list[Hold] = []
    waiting = lock_wait_frame(thread)
    for index, frame in enumerate(thread.frames):
        if frame.native or not frame.line or frame.origin.kind not in (Origin.USER, Origin.LIBRARY):
            continue
        lines = sources.lines(frame.filename)
        current = (lines.get(frame.line) if lines else None) or frame.code
        if current is None or lines is None:
            continue
        if index != waiting and with_items(current) is not None:
            continue  # entering or leaving a with block: not inside it
        for expr, line in _held_exprs(lines, frame.line, current):
            lock, _ = _identity(expr, frame, thread.locals_at(index))
            if lock is not None:
                found.append(Hold(thread, frame, line, expr, lock))
    return found


def _held_exprs(lines: Lines, lineno: int, current: str) -> list[tuple[str, int]]:
    """(expression, line) of the ``with`` blocks around ``lineno`` and the ``acquire()``
    statements before it, in enclosing blocks, not released since."""
    level = _indent(current)
    released: set[str] = set()
    held: list[tuple[str, int]] = []
    for n in range(lineno - 1, lineno - MAX_LINES_BEFORE, -1):
        text = lines.get(n)
        if text is None:
            break
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        ind = _indent(text)
        if ind > level:
            continue  # inside an earlier block: may not have run
        if ind == level:
            if m := _RELEASE.match(text):
                released.add(m.group("expr"))
            elif (expr := _acquired(text)) is not None and expr not in released:
                held.append((expr, n))
            continue
        level = ind  # a header around the current line
        if _DEF.match(text):
            break
        for expr in with_items(text) or ():
            held.append((expr, n))
    return held


def waits_on_a_lock(sample: Sample) -> bool:
    """Some thread of ``sample`` waits on a lock: ``lock_graph`` has something to tell."""
    return any(lock_wait_frame(thread) is not None for thread in sample.threads)


def lock_graph(sample: Sample, sources: SourceIndex, op_of: Callable[[ThreadStack], DistOp | None]) -> LockGraph | None:
    """The lock waits of ``sample``'s threads, their holders and cycles; None when no
    thread waits on a lock. ``op_of`` tells the distributed op a holder thread is in."""
    waits: list[LockWait] = []
    for thread in sample.threads:
        index = lock_wait_frame(thread)
        if index is None:
            continue
        frame = thread.frames[index]
        items = with_items(frame.code) or []
        expr = items[0] if len(items) == 1 else (_acquired(frame.code) if not items else None)
        lock, kind = _identity(expr, frame, thread.locals_at(index)) if expr else (None, None)
        waits.append(LockWait(thread, frame, expr, lock, kind))
    if not waits:
        return None
    held = {th.thread_id: holds(th, sources) for th in sample.threads}
    edges = []
    for wait in waits:
        edge = LockEdge(wait)
        if wait.lock is not None:
            own = [h for h in held[wait.thread.thread_id] if h.lock == wait.lock]
            others = [h for th, hs in held.items() if th != wait.thread.thread_id for h in hs if h.lock == wait.lock]
            if own:
                edge = replace(edge, reentry=True, holder=own[0])
            elif len({h.thread.thread_id for h in others}) == 1:
                edge = replace(edge, holder=others[0], holder_op=op_of(others[0].thread))
            # held by several threads at once: the inference is wrong somewhere; name none
        edges.append(edge)
    cycles = _cycles(edges)
    selfish = tuple(e for e in edges if e.reentry and e.wait.kind in PLAIN)
    return LockGraph(tuple(edges), cycles, selfish)


def _cycles(edges: Sequence[LockEdge]) -> tuple[tuple[LockEdge, ...], ...]:
    """The cycles of the wait-for graph (each thread waits on one lock: one path each)."""
    by_thread = {e.wait.thread.thread_id: e for e in edges}
    found: list[tuple[LockEdge, ...]] = []
    seen: set[int] = set()
    for start in sorted(by_thread):
        path: list[LockEdge] = []
        on_path: set[int] = set()
        tid: int | None = start
        while tid is not None and tid in by_thread and tid not in on_path and tid not in seen:
            edge = by_thread[tid]
            if edge.reentry or edge.holder is None:
                break
            path.append(edge)
            on_path.add(tid)
            tid = edge.holder.thread.thread_id
        if tid is not None and tid in on_path:
            cycle = path[[e.wait.thread.thread_id for e in path].index(tid) :]
            # told from the main thread when it is in it, else from the lowest thread id
            first = min(
                range(len(cycle)), key=lambda i: (not cycle[i].wait.thread.is_main, cycle[i].wait.thread.thread_id)
            )
            found.append(tuple(cycle[first:] + cycle[:first]))
        seen |= on_path
    return tuple(found)


def same_deadlock(a: LockGraph | None, b: LockGraph | None) -> bool:
    """``a`` and ``b`` (two samples) show the same deadlocks: the same threads waiting at
    the same lines."""

    def shape(graph: LockGraph | None) -> set[tuple[tuple[int, int | None, str], ...]]:
        if graph is None:
            return set()
        return {
            tuple((e.wait.thread.thread_id, e.wait.frame.line, e.wait.frame.filename) for e in cycle)
            for cycle in graph.deadlocked
        }

    return bool(shape(a)) and shape(a) == shape(b)
