"""What analysis derives for each present rank: its state, op, thread and movement.

``Views`` turns each ``RankSnapshot`` of a snapshot into a ``RankView`` (``view_rank``: one
rank alone); ``classify`` decides the verdict from the views and ``analyse`` assembles the
``Diagnosis``. What a rank's stacks say is worked out once per distinct shape of stacks,
not once per rank (``Views``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter

from ..memo import once_per_object
from ..model import (
    STOPPED_STATUSES,
    DistOp,
    Frame,
    JobSnapshot,
    OpKind,
    RankSnapshot,
    RankSource,
    RankState,
    Sample,
    ThreadStack,
)
from .host_sync import env_gpu_evidence, stacks_gpu_evidence, sync_call, waits_for_device
from .locks import LockGraph, lock_graph, same_deadlock, waits_on_a_lock
from .ops import Recogniser, init_arguments_at, init_frame
from .progress import Movement, StackMotion, rank_movement, relevant_thread, stack_motion


@dataclass(frozen=True, slots=True)
class RankView:
    """Everything analysis derived for one present rank (input to ``classify``)."""

    rank: int
    snap: RankSnapshot
    state: RankState
    op: DistOp | None
    thread: ThreadStack | None
    move: Movement | None
    cleanup: Frame | None = None  # outside any op, but on a cleanup path (joins, waits in __exit__)
    # the world size the job's code passed to init_process_group, when its frame shows it
    code_world: int | None = None
    # the rank's threads that wait on locks in its latest sample, who holds those locks and
    # the lock-order deadlocks among them (``locks``); None when no thread waits on one
    locks: LockGraph | None = None
    # how many of the rank's samples show the same deadlocks (0 without one)
    deadlock_seen: int = 0
    # the rank's other threads that wait in a collective or send/recv too, with their ops
    side_ops: tuple[tuple[ThreadStack, DistOp], ...] = ()

    @property
    def deadlocked(self) -> bool:
        """Its relevant thread is in a lock-order deadlock seen in two samples or more:
        nothing in the rank can go on, however long it is watched."""
        return (
            self.locks is not None
            and self.thread is not None
            and self.deadlock_seen >= 2
            and self.locks.cycle_of(self.thread) is not None
        )


OpKey = tuple[str, tuple[str, ...]]  # ``DistOp.key``


def op_keys() -> Callable[[DistOp], OpKey]:
    """``DistOp.key`` worked out once per op object: the ranks of one stack share their op
    (``Recogniser``), and a key quotes every frame of the op's path."""
    return once_per_object(_KEY)


_KEY = attrgetter("key")


def rank_state(snap: RankSnapshot, op: DistOp | None, move: Movement | None) -> RankState:
    if snap.samples and snap.samples[-1].gone:
        return RankState.EXITED  # also when it was seen alive earlier in the window
    if move is None:  # no good sample: nothing was read (``movement`` is None exactly then)
        assert not snap.good_samples
        return RankState.UNREADABLE
    if move.status in STOPPED_STATUSES:
        return RankState.STOPPED
    if waits_for_device(op):
        # a host sync spins (or yields) a core while it waits: neither its CPU nor its
        # wake-ups are progress; leaving it, or bytes moving (NCCL over sockets), are
        if move.op_changed or move.left_op:
            return RankState.PROGRESSING
        return RankState.COMMUNICATING if move.moving_bytes else RankState.WAITING
    if op is not None:
        woke = move.woke and op.kind in (OpKind.COLLECTIVE, OpKind.P2P)
        if move.op_changed or move.left_op or woke:
            return RankState.PROGRESSING
        return RankState.COMMUNICATING if move.moving else RankState.WAITING
    return RankState.BUSY if move.busy else RankState.BLOCKED


def view_rank(snap: RankSnapshot, snapshot: JobSnapshot, recogniser: Recogniser | None = None) -> RankView:
    """One rank's view. ``analyse`` makes its views with one ``Views`` for all ranks; alone,
    a rank's view is made with a ``Views`` of its own (with ``recogniser``, the snapshot's,
    when given)."""
    return Views(snapshot, recogniser).view(snap)


class Views:
    """The views of one snapshot's ranks.

    What a rank's stacks say (which sample stands for it, its relevant thread and op, how
    its stacks moved, a cleanup path, its ``init_process_group`` frame, whether a thread
    waits on a lock) is worked out once per *shape*: ranks whose good samples hold the same
    stack objects (bundles intern them), with the same kept arguments, on-CPU marks and
    thread names, thread by thread. Only what differs per rank is read per rank: counters,
    thread and process ids, environment, GPUs, capture errors and lock identities. So the
    cost grows with the number of distinct shapes, and per rank with a few lookups. (Equal
    stacks that are not one object, from a capture that did not intern them, make shapes of
    their own: the same views, each worked out on its own.)"""

    def __init__(self, snapshot: JobSnapshot | None, recogniser: Recogniser | None = None) -> None:
        self.rec = recogniser if recogniser is not None else Recogniser(snapshot)
        self._shapes: dict[tuple[object, ...], _Stacks] = {}

    def view(self, snap: RankSnapshot) -> RankView:
        good = snap.good_samples
        if not good:  # nothing read: no thread, op nor movement
            rank = snap.rank
            return RankView(-1 if rank is None else rank, snap, rank_state(snap, None, None), None, None, None)
        stacks = self._stacks(good)
        at = stacks.latest_at(good)
        latest = good[at]
        # a host-syncing line of the job's code counts only on a rank that runs on a GPU
        # (``gpu_evidence``: NVML, its stacks, its environment)
        gpu = stacks.sync_line(at) and (
            bool(snap.gpus) or stacks.gpu_frames() is not None or env_gpu_evidence(snap.process) is not None
        )
        said = stacks.said(at, gpu)
        thread = latest.threads[said.relevant] if said.relevant is not None else None
        op = said.op
        move = rank_movement(snap, good, said.motion)
        rank, code_world = snap.rank, None
        if thread is not None and said.init_at is not None:
            code_rank, code_world = init_arguments_at(thread, said.init_at)
            # a rank number the launcher did not put in the environment nor Ray Train record
            # (inferred from the spawn order, or not known at all) yields to the one the code
            # gave init_process_group
            if code_rank is not None and snap.process.rank_source not in (RankSource.ENV, RankSource.RAY):
                rank = code_rank
        graph, seen = _locks(snap, latest, self.rec) if said.locked else (None, 0)
        side = tuple((latest.threads[i], o) for i, o in said.side_ops)
        return RankView(
            -1 if rank is None else rank,
            snap,
            rank_state(snap, op, move),
            op,
            thread,
            move,
            said.cleanup,
            code_world,
            graph,
            seen,
            side,
        )

    def _stacks(self, good: tuple[Sample, ...]) -> _Stacks:
        """What the stacks of ``good`` (a rank's good samples) say: by their shape.

        The shape holds how many threads each sample has, then each thread's stack (by
        identity: the ``_Stacks`` of a shape holds its first rank's samples, so no identity
        is reused while this lives), on-CPU mark and name, and the identities of its kept
        arguments (``Recogniser.kept_locals``) where any are kept. Where every sample holds
        the same tuple of threads (a bundle interns them; a hung rank's samples alike), the
        shape is the number of samples and that one tuple's key: a third of the work."""
        each = tuple(map(_THREADS, good))
        first = each[0]
        if all(t is first for t in each):
            # every sample has the same threads, one object (a bundle interns them: a hung
            # rank's samples): the key of one sample says it for all, tagged by their count
            threads = first
            shape: tuple[object, ...] = (
                len(each),
                tuple(map(id, map(_FRAMES, threads))),
                tuple(map(_ACTIVE, threads)),
                tuple(map(_NAME, threads)),
                self._kept(threads),
            )
        else:
            threads = tuple(chain.from_iterable(each))
            shape = (
                tuple(map(len, each)),
                tuple(map(id, map(_FRAMES, threads))),
                tuple(map(_ACTIVE, threads)),
                tuple(map(_NAME, threads)),
                self._kept(threads),
            )
        stacks = self._shapes.get(shape)
        if stacks is None:
            stacks = self._shapes[shape] = _Stacks(good, self.rec)
        return stacks

    def _kept(self, threads: tuple[ThreadStack, ...]) -> tuple[int, ...]:
        """The identities of the threads' kept arguments (0: none), () where none has any."""
        if not any(map(_LOCALS, threads)):
            return ()
        kept = tuple(id(self.rec.kept_locals(th.locals)) if th.locals else 0 for th in threads)
        return kept if any(kept) else ()


_TRAFFIC = (OpKind.COLLECTIVE, OpKind.P2P)
_THREADS = attrgetter("threads")
_FRAMES = attrgetter("frames")
_ACTIVE = attrgetter("active")
_NAME = attrgetter("name")
_LOCALS = attrgetter("locals")
_THREAD_ID = attrgetter("thread_id")


@dataclass(frozen=True, slots=True)
class _Said:
    """What one shape's stacks say with one sample standing for the rank, with or without
    a GPU: positions in the rank's own samples, and values every rank of the shape shares."""

    relevant: int | None  # the relevant thread's position in the sample
    op: DistOp | None
    motion: StackMotion
    cleanup: Frame | None  # ``RankView.cleanup``
    init_at: int | None  # where the init_process_group frame is when the op is init
    locked: bool  # some thread waits on a lock (the rank's lock graph is worked out then)
    side_ops: tuple[tuple[int, DistOp], ...] = ()  # other threads in a collective or p2p op


class _Stacks:
    """What the stacks of one shape say; ``good`` are the good samples of its first rank."""

    def __init__(self, good: tuple[Sample, ...], rec: Recogniser) -> None:
        self.good = good
        self.rec = rec
        self._said: dict[tuple[int, bool], _Said] = {}
        self._motion: dict[bool, StackMotion] = {}
        self._sync: dict[int, bool] = {}
        self._gpu_frames: str | None = None
        self._gpu_seen = False
        # ``RankSnapshot.latest``: the last sample, or an earlier one with native frames
        # (a dump taken on demand) whose Python stacks are the last one's; the threads'
        # ids, which differ per rank, are compared per rank (``latest_at``)
        self.stand_in: int | None = None
        if not self._native(good[-1]):
            earlier = next((i for i in range(len(good) - 2, -1, -1) if self._native(good[i])), None)
            if earlier is not None and self._python_alike(good[earlier], good[-1]):
                self.stand_in = earlier

    def _native(self, sample: Sample) -> bool:
        """``Sample.has_native``, by the recogniser's stacks without native frames."""
        python = self.rec.python_frames
        return any(python(th.frames) is not th.frames for th in sample.threads)

    def _python_alike(self, a: Sample, b: Sample) -> bool:
        """The samples' ``python_stacks`` are equal but for the thread ids."""
        python = self.rec.python_frames
        return len(a.threads) == len(b.threads) and all(
            python(x.frames) == python(y.frames) for x, y in zip(a.threads, b.threads, strict=False)
        )

    def latest_at(self, good: tuple[Sample, ...]) -> int:
        """Which of a rank's ``good`` samples (of this shape) is its ``latest``."""
        if self.stand_in is not None:
            earlier, last = good[self.stand_in].threads, good[-1].threads
            if tuple(map(_THREAD_ID, earlier)) == tuple(map(_THREAD_ID, last)):
                return self.stand_in
        return len(good) - 1

    def gpu_frames(self) -> str | None:
        """What the stacks show of a GPU (``device.stacks_gpu_evidence``), or None."""
        if not self._gpu_seen:
            self._gpu_frames, self._gpu_seen = stacks_gpu_evidence(self.good), True
        return self._gpu_frames

    def sync_line(self, at: int) -> bool:
        sync = self._sync.get(at)
        if sync is None:
            sync = self._sync[at] = _sync_line(self.good[at])
        return sync

    def said(self, at: int, gpu: bool) -> _Said:
        said = self._said.get((at, gpu))
        if said is None:
            said = self._said[(at, gpu)] = self._work_out(self.good[at], gpu)
        return said

    def _work_out(self, latest: Sample, gpu: bool) -> _Said:
        rec = self.rec
        thread, op = relevant_thread(latest, recogniser=rec, gpu=gpu)
        motion = self._motion.get(gpu)
        if motion is None:
            motion = self._motion[gpu] = stack_motion(self.good, rec, gpu)
        return _Said(
            relevant=next((i for i, th in enumerate(latest.threads) if th is thread), None),
            op=op,
            motion=motion,
            # outside any op, an ``except`` block is as often a retry loop as error handling:
            # only __exit__/close-like functions, ``finally:`` and exit handlers count as
            # cleanup there
            cleanup=rec.cleanup_marker(thread, ("finally",)) if thread and op is None else None,
            init_at=init_frame(thread.frames)
            if thread is not None and op is not None and op.kind is OpKind.INIT
            else None,
            locked=waits_on_a_lock(latest),
            side_ops=self._side_ops(latest, thread, op),
        )

    def _side_ops(
        self, latest: Sample, thread: ThreadStack | None, op: DistOp | None
    ) -> tuple[tuple[int, DistOp], ...]:
        """The threads besides the relevant one that wait in a collective or send/recv, by
        position, when the relevant one does too (two ops of one process at once)."""
        if thread is None or op is None or op.kind not in _TRAFFIC:
            return ()
        found = []
        for index, other in enumerate(latest.threads):
            if other is not thread and (side := self.rec.recognise(other)) is not None and side.kind in _TRAFFIC:
                found.append((index, side))
        return tuple(found)


def _sync_line(sample: Sample) -> bool:
    """Some thread's innermost Python line calls a host-syncing tensor method."""
    for thread in sample.threads:
        inner = thread.innermost_python
        if inner is not None and sync_call(inner.code) is not None:
            return True
    return False


def _locks(snap: RankSnapshot, latest: Sample | None, rec: Recogniser) -> tuple[LockGraph | None, int]:
    """The lock graph of the rank's ``latest`` sample, and in how many of its samples the
    same deadlocks show (0 when there are none)."""
    graph = lock_graph(latest, rec.sources, rec.recognise) if latest is not None else None
    if graph is None or not graph.deadlocked:
        return graph, 0
    seen = sum(
        1
        for sample in snap.good_samples
        if sample is latest or same_deadlock(graph, lock_graph(sample, rec.sources, rec.recognise))
    )
    return graph, seen
