"""What analysis derives for each present rank: its state, op, thread and movement.

``view_rank`` turns one ``RankSnapshot`` into a ``RankView``; ``classify`` decides the
verdict from the views and ``analyse`` assembles the ``Diagnosis``.
"""

from __future__ import annotations

from dataclasses import dataclass

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
from .device import gpu_evidence, sync_call, waits_for_device
from .locks import LockGraph, lock_graph, same_deadlock
from .ops import Recogniser, init_arguments
from .progress import Movement, movement, relevant_thread


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

    @property
    def deadlocked(self) -> bool:
        """Its relevant thread is in a lock-order deadlock seen in two samples or more:
        nothing in the rank can go on, however long it is watched."""
        return (self.locks is not None and self.thread is not None and self.deadlock_seen >= 2
                and self.locks.cycle_of(self.thread) is not None)


def rank_state(snap: RankSnapshot, op: DistOp | None, move: Movement | None) -> RankState:
    if snap.samples and snap.samples[-1].gone:
        return RankState.EXITED  # also when it was seen alive earlier in the window
    if not snap.good_samples:
        return RankState.UNREADABLE
    assert move is not None
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


def view_rank(
    snap: RankSnapshot, snapshot: JobSnapshot, recogniser: Recogniser | None = None
) -> RankView:
    """One rank's view. ``analyse`` passes the ``recogniser`` of ``snapshot`` it made for all
    ranks (each distinct thread is recognised once); without one, one is made."""
    rec = recogniser if recogniser is not None else Recogniser(snapshot)
    latest = snap.latest
    # a host-syncing line of the job's code counts only on a rank that runs on a GPU
    gpu = latest is not None and _sync_line(latest) and gpu_evidence(snap) is not None
    thread, op = relevant_thread(latest, recogniser=rec, gpu=gpu) if latest else (None, None)
    move = movement(snap, recogniser=rec, gpu=gpu)
    state = rank_state(snap, op, move)
    # outside any op, an ``except`` block is as often a retry loop as error handling: only
    # __exit__/close-like functions, ``finally:`` and exit handlers count as cleanup there
    cleanup = rec.cleanup_marker(thread, ("finally",)) if thread and op is None else None
    rank, code_world = snap.rank, None
    if thread is not None and op is not None and op.kind is OpKind.INIT:
        code_rank, code_world = init_arguments(thread)
        # a rank number the launcher did not put in the environment nor Ray Train record
        # (inferred from the spawn order, or not known at all) yields to the one the code
        # gave init_process_group
        if code_rank is not None and snap.process.rank_source not in (RankSource.ENV, RankSource.RAY):
            rank = code_rank
    graph, seen = _locks(snap, latest, rec)
    return RankView(-1 if rank is None else rank, snap, state, op, thread, move, cleanup,
                    code_world, graph, seen)


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
    seen = sum(1 for sample in snap.good_samples
               if sample is latest or same_deadlock(graph, lock_graph(sample, rec.sources, rec.recognise)))
    return graph, seen
