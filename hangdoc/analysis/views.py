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
    ThreadStack,
)
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


def rank_state(snap: RankSnapshot, op: DistOp | None, move: Movement | None) -> RankState:
    if snap.samples and snap.samples[-1].gone:
        return RankState.EXITED  # also when it was seen alive earlier in the window
    if not snap.good_samples:
        return RankState.UNREADABLE
    assert move is not None
    if move.status in STOPPED_STATUSES:
        return RankState.STOPPED
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
    thread, op = relevant_thread(latest, recogniser=rec) if latest else (None, None)
    move = movement(snap, recogniser=rec)
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
    return RankView(-1 if rank is None else rank, snap, state, op, thread, move, cleanup,
                    code_world)
