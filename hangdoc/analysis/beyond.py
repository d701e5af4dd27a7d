"""The wait past the ranks: which ranks' waits capture should follow (``needs_waits``), and
the chain a rank's wait makes through the processes capture followed (``chain_of``), to the
process and thread that holds it.

A link is read, never guessed: a rank's thread is blocked in a system call on a socket, a
pipe, a child or a file lock whose other end the kernel's tables name (``ThreadWait``), and
the process there was sampled (``JobSnapshot.beyond``). In that process, the thread that
holds the wait is chosen by what its threads do, in this order:

1. blocked on a descriptor whose other end is another process (a socket read, a pipe, a
   child, a file lock): the wait goes on there, or ends there on a file that does not
   return;
2. blocked on a lock (``locks``: a ``with``/``acquire`` line it cannot pass);
3. on CPU;
4. waiting for another thread of its process (a ``Condition``, ``Event``, ``Queue``,
   ``Future`` or ``join``): a consumer of what another thread makes;

and never a thread idle in a server's loop (``accept``, ``poll``/``epoll`` on several
descriptors, a sleep), which waits for work rather than holding any. A process whose stack
changed between its two samples runs: the chain ends there. A process already in the chain
ends it as a cycle: a deadlock across processes.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..model import (
    Frame,
    JobSnapshot,
    LinkKind,
    Origin,
    RankProcess,
    RankSnapshot,
    RankState,
    RootCause,
    Sample,
    ThreadStack,
    ThreadWait,
    Verdict,
    WaitKind,
    WaitLink,
)
from .locks import lock_wait_frame
from .ops import Recogniser
from .progress import relevant_thread
from .views import RankView

# waits whose other end is another process, which the chain goes on to
_LEADS = (WaitKind.PIPE, WaitKind.SOCKET, WaitKind.CHILD, WaitKind.FILE_LOCK)
# calls a server's idle loop waits in: for work, not holding anything
_IDLE_CALLS = frozenset({"accept", "accept4"})
_LOOP = "(event loop)"  # marks a poll of an idle event loop, read as a wait on its one onward connection
_IDLE_KINDS = (WaitKind.POLL, WaitKind.SLEEP, WaitKind.OTHER, WaitKind.LISTEN)
_MAX_LINKS = 8  # a chain longer than capture follows (fleet.follow's depth, with room)
_COMMAND_WORDS = 8
_CONSUMER = 3  # ``_order`` of a thread that itself waits for another thread


def needs_waits(samples: Sequence[Sample], process: RankProcess, code: Callable[[Frame], str | None]) -> frozenset[int]:
    """The native ids of a rank's threads whose waits capture should read and follow: none
    when its relevant thread is in a distributed op or on CPU, or its stack moved between
    its last two samples; else every thread of its last sample that is off CPU and in no
    distributed op (the one it waits on may be another than the one it waits in: a
    ``Future`` of a worker thread)."""
    good = [s for s in samples if s.error is None and s.threads]
    if not good:
        return frozenset()
    last = good[-1]
    if len(good) > 1 and good[-2].python_stacks != last.python_stacks:
        return frozenset()
    rec = Recogniser(None)
    thread, op = relevant_thread(last, recogniser=rec)
    if thread is None or op is not None or thread.active:
        return frozenset()
    return frozenset(
        th.native_id for th in last.threads if th.native_id is not None and not th.active and rec.recognise(th) is None
    )


@dataclass(frozen=True, slots=True)
class Chain:
    """A rank's wait followed: the links from the rank to the end, how each was read, and
    whether it came back to a process already in it (``cycle``) or ends at a rank of the
    job (``to_rank``: not past the ranks at all)."""

    links: tuple[WaitLink, ...]
    how: tuple[str, ...]
    cycle: bool = False
    to_rank: bool = False
    runs: bool = False  # the process at the end runs (on CPU, or its stack moved): slow, or a loop

    @property
    def end(self) -> WaitLink:
        return self.links[-1]

    @property
    def within_a_rank(self) -> bool:
        """It goes from the thread a rank waits in to another thread of the same rank."""
        first = self.links[0]
        return (
            not self.to_rank
            and all(link.pid == first.pid for link in self.links)
            and len({link.thread for link in self.links}) > 1
        )

    @property
    def leaves_the_ranks(self) -> bool:
        """It ends at a process that is not a rank, or at an address off the node."""
        return not self.to_rank and (len({link.pid for link in self.links}) > 1 or bool(self.end.on))


class Chains:
    """The chains of one snapshot's ranks, from the processes capture followed."""

    def __init__(self, snapshot: JobSnapshot) -> None:
        self.snapshot = snapshot
        self.processes: dict[tuple[str, int], RankSnapshot] = {
            (r.process.host, r.process.pid): r for r in (*snapshot.ranks, *snapshot.beyond)
        }

    def of(self, snap: RankSnapshot, thread: ThreadStack | None) -> Chain | None:
        """The chain of a rank whose ``thread`` waits outside torch.distributed; None when
        capture read no wait of it."""
        sample = _with_waits(snap)
        if sample is None or not sample.waits or thread is None:
            return None
        links: list[WaitLink] = []
        how: list[str] = []
        seen: set[tuple[str, int]] = set()
        current, at = snap, thread
        loop: ThreadWait | None = None  # an idle event loop's one connection onward
        while True:
            host = current.process.host
            seen.add((host, current.process.pid))
            waits = {w.native_id: w for w in sample.waits}
            wait, loop = loop or _wait_of(at, waits), None
            if current is snap and not _leads(wait):
                # the rank's thread waits for another of its threads (a Future, a queue)
                # that waits on another process: the chain goes through that thread
                other = next((t for t in sample.threads if t is not at and _leads(_wait_of(t, waits))), None)
                if other is None and _waits_for_a_thread(at, wait):
                    held = _holding_thread(sample, seen, host, exclude=at)
                    other = held[1] if held is not None and held[0] <= _CONSUMER else None
                if other is not None:
                    links.append(_link(current, at, _thread_kind(at), f"thread '{other.name or other.thread_id}'"))
                    how.append("its stack waits for another thread of its process")
                    at, wait = other, _wait_of(other, waits)
            if wait is None or not _leads(wait):
                end = _link(current, at, _end_kind(at, wait), _end_on(wait))
                links.append(dataclasses.replace(end, certain=wait is not None and wait.kind is WaitKind.FILE))
                how.append(_end_how(wait, at))
                return Chain(tuple(links), tuple(how), runs=at is not None and at.active)
            target = self._next(host, wait, seen)
            step = _link(current, at, _link_kind(wait, at), _on(wait, target))
            links.append(dataclasses.replace(step, certain=not wait.syscall.endswith(_LOOP)))
            how.append(_how(wait))
            if target is None:
                there = wait.peer_host or host
                return Chain(tuple(links), tuple(how), to_rank=self._rank_of(there, wait.peers) is not None)
            if (target.process.host, target.process.pid) in seen:
                return Chain(tuple(links), tuple(how), cycle=True)
            if target.process.rank is not None:
                return Chain(tuple(links), tuple(how), to_rank=True)
            if len(links) >= _MAX_LINKS:
                return Chain(tuple(links), tuple(how))
            tsample = _with_waits(target)
            if tsample is None:
                links.append(_link(target, None, None, ""))
                how.append("it could not be sampled")
                return Chain(tuple(links), tuple(how))
            if _moved(target):
                busy = next((t for t in tsample.threads if t.active), tsample.main_thread)
                links.append(_link(target, busy, None, ""))
                how.append("its stack changed between two samples: it runs")
                return Chain(tuple(links), tuple(how), runs=True)
            nxt = _holding_thread(tsample, seen, target.process.host)
            if nxt is None:
                onward = self._event_loop(tsample, seen, target.process.host)
                if onward is None:
                    links.append(_link(target, None, None, ""))
                    how.append("none of its threads holds anything: each waits for work to come")
                    return Chain(tuple(links), tuple(how))
                nxt, loop = onward
            current, at, sample = target, nxt[1], tsample

    def _event_loop(
        self, sample: Sample, seen: set[tuple[str, int]], host: str
    ) -> tuple[tuple[int, ThreadStack], ThreadWait] | None:
        """A process whose threads all wait for work, one of them in an event loop polling
        its connections: where exactly one of those leads to a process followed outside the
        chain (a server's front end waiting on its scheduler process over a socket), the
        wait goes on there, as a socket wait of that thread."""
        for thread in sample.threads:
            wait = _wait_of(thread, {w.native_id: w for w in sample.waits})
            if wait is None or wait.kind is not WaitKind.POLL:
                continue
            onward = sorted(
                pid
                for pid in wait.peers
                if (host, pid) not in seen
                and (p := self.processes.get((host, pid))) is not None
                and p.process.rank is None
            )
            if len(onward) == 1:
                loop = dataclasses.replace(
                    wait, syscall=f"{wait.syscall} {_LOOP}", kind=WaitKind.SOCKET, peers=(onward[0],)
                )
                return (_CONSUMER, thread), loop
        return None

    def _next(self, host: str, wait: ThreadWait, seen: set[tuple[str, int]]) -> RankSnapshot | None:
        """The process at the other end of ``wait`` that holds it most surely (the order of
        the module doc; one that runs after one that waits; then the lowest pid)."""
        best: tuple[int, int] | None = None
        chosen = None
        host = wait.peer_host or host  # the far end of a TCP connection, named by its node's agent
        for pid in wait.peers:
            p = self.processes.get((host, pid))
            if p is None:
                continue
            if p.process.rank is not None or (host, pid) in seen:
                order = -1  # back to a rank or into the chain: said as such
            else:
                sample = _with_waits(p)
                held = _holding_thread(sample, seen, host) if sample is not None and not _moved(p) else None
                order = held[0] if held is not None else 6
            if best is None or (order, pid) < best:
                best, chosen = (order, pid), p
        return chosen

    def _rank_of(self, host: str, pids: Sequence[int]) -> int | None:
        for pid in pids:
            r = self.processes.get((host, pid))
            if r is not None and r.process.rank is not None:
                return r.process.rank
        return None


def chains_of(snapshot: JobSnapshot, views: Sequence[RankView]) -> dict[int, Chain]:
    """The chain of each rank off CPU outside any distributed op, where capture read its
    waits (none at all for a snapshot without them: no cost)."""
    if not any(s.waits for r in snapshot.ranks for s in r.samples):
        return {}
    chains = Chains(snapshot)
    out = {}
    for v in views:
        if v.state is RankState.BLOCKED:
            chain = chains.of(v.snap, v.thread)
            if chain is not None:
                out[v.rank] = chain
    return out


def root_cause(
    chains: Mapping[int, Chain], verdict: Verdict, culprits: Sequence[int], views: Sequence[RankView]
) -> RootCause | None:
    """The process at the end of the culprits' waits, where those leave the ranks: the end
    most of their chains reach (then the lowest pid), with the chain of the first culprit
    that reaches it (``unknown``, which names none: of the ranks seen). A straggler's chain
    starts at a rank that waits for it in a collective. None for a job that is not hung, or
    culprits whose waits stay in the ranks."""
    if verdict is Verdict.NOT_HUNG:
        return None
    # ``unknown`` names no culprit: the waits of the ranks seen still end somewhere
    ranks = culprits if culprits or verdict is not Verdict.UNKNOWN else sorted(chains)
    candidates = [chains[r] for r in ranks if r in chains and chains[r].leaves_the_ranks]
    if not candidates:
        # a wait that stays in its rank (a queue fed by a thread of its own that waits on a
        # condition): the thread at its end, where the chain names another thread than the
        # one the rank waits in
        candidates = [c for r in ranks if (c := chains.get(r)) is not None and c.within_a_rank]
    if not candidates:
        return None
    ends = Counter((c.end.host, c.end.pid) for c in candidates)
    top = min(ends, key=lambda k: (-ends[k], k[1]))
    chain = next(c for c in candidates if (c.end.host, c.end.pid) == top)
    links, how = chain.links, chain.how
    waiting = [v for v in views if v.op is not None and v.state in (RankState.WAITING, RankState.COMMUNICATING)]
    if verdict is Verdict.STRAGGLER and waiting:
        v = min(waiting, key=lambda w: w.rank)
        first = WaitLink(
            v.snap.process.pid,
            v.snap.process.host,
            v.rank,
            (v.thread.name or str(v.thread.thread_id)) if v.thread is not None else None,
            v.op.call_site if v.op is not None else None,
            LinkKind.COLLECTIVE,
            f"rank {links[0].rank}",
            v.snap.process.cmdline[:_COMMAND_WORDS],
        )
        links, how = (first, *links), (f"its stack: in {v.op.name if v.op else 'a collective'}", *how)
    end = links[-1]
    return RootCause(end.pid, end.host, end.rank, end.thread, end.frame, links, chain.cycle, how)


# ------------------------------------------------------------------ threads and links


def _with_waits(snap: RankSnapshot) -> Sample | None:
    """The last sample whose waits were read (the stacks are those of the same moment)."""
    for sample in reversed(snap.samples):
        if sample.waits and sample.threads:
            return sample
    good = snap.good_samples
    return good[-1] if good and snap.process.rank is None else None


def _moved(snap: RankSnapshot) -> bool:
    good = snap.good_samples
    return len(good) > 1 and good[-1].python_stacks != good[-2].python_stacks


def _wait_of(thread: ThreadStack | None, waits: Mapping[int, ThreadWait]) -> ThreadWait | None:
    return waits.get(thread.native_id) if thread is not None and thread.native_id is not None else None


def _leads(wait: ThreadWait | None) -> bool:
    """The wait has another process, or an address off the node, at its other end."""
    return wait is not None and wait.kind in _LEADS and bool(wait.peers or wait.remote)


def _holding_thread(
    sample: Sample, back: set[tuple[str, int]], host: str, exclude: ThreadStack | None = None
) -> tuple[int, ThreadStack] | None:
    """The thread of a process that holds what waits on it, with its place in the module
    doc's order (lower: surer; among alike, one running the job's own code before the
    machinery of a library or the standard library: a queue's feeder thread); None when
    every thread is idle."""
    waits = {w.native_id: w for w in sample.waits}
    best: tuple[int, bool, int] | None = None
    chosen = None
    for index, thread in enumerate(sample.threads):
        if thread is exclude:
            continue
        order = _order(thread, _wait_of(thread, waits), back, host)
        if order is None:
            continue
        key = (order, not _runs_job_code(thread), index)
        if best is None or key < best:
            best, chosen = key, thread
    return (best[0], chosen) if best is not None and chosen is not None else None


def _runs_job_code(thread: ThreadStack) -> bool:
    return any(not f.native and f.origin.kind is Origin.USER for f in thread.frames)


def _waits_for_a_thread(thread: ThreadStack, wait: ThreadWait | None) -> bool:
    """Blocked on a futex for something another thread of its process makes (a queue, a
    condition, a future, a join), not on a lock (whose holder the lock analysis names)."""
    return wait is not None and wait.kind is WaitKind.THREAD and _thread_kind(thread) is not LinkKind.LOCK


def _order(thread: ThreadStack, wait: ThreadWait | None, back: set[tuple[str, int]], host: str) -> int | None:
    """Lower holds the wait more surely; None: idle."""
    if thread.active:
        return 2
    if wait is not None:
        if wait.syscall in _IDLE_CALLS or wait.kind in _IDLE_KINDS:
            return None
        if wait.kind in _LEADS:
            # a wait back on a process of the chain: a cycle, or an idle reader of the one
            # that waits on it (a worker reading its next task): said only when nothing else
            # is; one whose other end no table names (a Unix socket): after every known wait
            if not (wait.peers or wait.remote):
                return 4
            return 5 if {(wait.peer_host or host, p) for p in wait.peers} & back else 0
        if wait.kind is WaitKind.FILE:
            return 0
    if lock_wait_frame(thread) is not None:
        return 1
    if wait is not None and wait.kind is WaitKind.THREAD:
        return _CONSUMER
    return None if wait is None else 4


def _link(snap: RankSnapshot, thread: ThreadStack | None, kind: LinkKind | None, on: str) -> WaitLink:
    return WaitLink(
        snap.process.pid,
        snap.process.host,
        snap.process.rank,
        (thread.name or str(thread.thread_id)) if thread is not None else None,
        _where(thread) if thread is not None else None,
        kind,
        on,
        snap.process.cmdline[:_COMMAND_WORDS],
    )


def _where(thread: ThreadStack) -> Frame | None:
    """The innermost frame of the job's own code, else the innermost Python frame."""
    lock = lock_wait_frame(thread)
    if lock is not None:
        return thread.frames[lock]
    python = [f for f in thread.frames if not f.native]
    for frame in reversed(python):
        if frame.origin.kind is Origin.USER:
            return frame
    return python[-1] if python else None


def _in(thread: ThreadStack | None, *paths: str) -> bool:
    return thread is not None and any(
        not f.native and f.origin.kind is Origin.STDLIB and f.origin.module_path.startswith(paths)
        for f in thread.frames
    )


def _thread_kind(thread: ThreadStack | None) -> LinkKind:
    """What a thread waiting for another thread of its process waits on, by its frames."""
    if lock_wait_frame(thread) is not None if thread is not None else False:
        return LinkKind.LOCK
    if _in(thread, "queue.py", "multiprocessing/queues.py"):
        return LinkKind.QUEUE
    if _in(thread, "concurrent/futures/"):
        return LinkKind.THREAD
    inner = thread.innermost_python if thread is not None else None
    if inner is not None and inner.origin.module_path == "threading.py":
        if inner.function.rsplit(".", 1)[-1] in ("wait", "wait_for"):
            return LinkKind.CONDITION
        if inner.function.rsplit(".", 1)[-1] in ("join", "_wait_for_tstate_lock"):
            return LinkKind.THREAD
    return LinkKind.THREAD


def _link_kind(wait: ThreadWait, thread: ThreadStack | None) -> LinkKind:
    if wait.kind is WaitKind.PIPE:
        return (
            LinkKind.QUEUE
            if _in(thread, "multiprocessing/queues.py", "multiprocessing/connection.py")
            else LinkKind.PIPE
        )
    return {
        WaitKind.SOCKET: LinkKind.SOCKET,
        WaitKind.CHILD: LinkKind.CHILD,
        WaitKind.FILE_LOCK: LinkKind.FILE_LOCK,
    }.get(wait.kind, LinkKind.THREAD)


def _end_kind(thread: ThreadStack | None, wait: ThreadWait | None) -> LinkKind | None:
    """What the last process waits on, where it is a lock or another thread of its own."""
    if thread is None or thread.active:
        return None
    if lock_wait_frame(thread) is not None:
        return LinkKind.LOCK
    if wait is not None and wait.kind is WaitKind.THREAD:
        return _thread_kind(thread)
    return None


def _on(wait: ThreadWait, target: RankSnapshot | None) -> str:
    if wait.remote and target is None:
        return wait.remote
    if target is not None:
        rank = target.process.rank
        where = f" on {target.process.host}" if wait.peer_host else ""
        return (
            f"rank {rank} (pid {target.process.pid}{where})" if rank is not None else f"pid {target.process.pid}{where}"
        )
    if wait.peers:
        return f"pid {', '.join(map(str, wait.peers[:4]))}"
    return wait.target


def _end_on(wait: ThreadWait | None) -> str:
    if wait is None or wait.kind in (WaitKind.THREAD, WaitKind.SLEEP, WaitKind.POLL, WaitKind.OTHER):
        return ""
    return wait.target


def _how(wait: ThreadWait) -> str:
    kind = wait.kind
    if wait.syscall.endswith(_LOOP):
        return (
            f"{wait.syscall.removesuffix(_LOOP).rstrip()}: an event loop whose threads wait on nothing else, "
            "with one connection to a process outside the chain"
        )
    if kind is WaitKind.SOCKET:
        if wait.remote and wait.peer_host:
            return (
                f"{wait.syscall} on {wait.target}: a TCP connection to {wait.remote}, whose holder the agent on "
                f"{wait.peer_host} names"
            )
        if wait.remote:
            return f"{wait.syscall} on {wait.target}: a TCP connection to {wait.remote}, off this node"
        return f"{wait.syscall} on {wait.target}: the kernel's TCP table names the process at the other end"
    if kind is WaitKind.PIPE:
        return f"{wait.syscall} on {wait.target}: the process holding the pipe's other end"
    if kind is WaitKind.CHILD:
        return f"{wait.syscall}: its child process"
    if kind is WaitKind.FILE_LOCK:
        return f"{wait.syscall} on {wait.target}: /proc/locks names the holder"
    return wait.syscall


def _end_how(wait: ThreadWait | None, thread: ThreadStack | None) -> str:
    if thread is not None and thread.active:
        return "it is on CPU"
    if thread is not None and lock_wait_frame(thread) is not None:
        return "it waits on a lock (its stack)"
    if wait is None:
        return "its stack"
    if wait.kind is WaitKind.FILE:
        return f"{wait.syscall} on {wait.target} does not return"
    if wait.kind is WaitKind.THREAD:
        return "it waits for another thread of its process (its stack)"
    return f"blocked in {wait.syscall}"
