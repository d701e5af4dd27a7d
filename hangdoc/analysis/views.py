"""What analysis derives for each present rank: its state, op, thread and movement.

``view_rank`` turns one ``RankSnapshot`` into a ``RankView``; ``classify`` decides the
verdict from the views and ``analyse`` assembles the ``Diagnosis``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model import (
    STOPPED_STATUSES,
    CaptureErrorKind,
    DistOp,
    Frame,
    JobSnapshot,
    OpKind,
    RankSnapshot,
    RankState,
    ThreadStack,
)
from .ops import Recogniser
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


def rank_state(snap: RankSnapshot, op: DistOp | None, move: Movement | None) -> RankState:
    if not snap.good_samples:
        errors = [s.error for s in snap.samples if s.error is not None]
        if errors and errors[-1].kind is CaptureErrorKind.PROCESS_GONE:
            return RankState.EXITED
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
    return RankView(snap.rank if snap.rank is not None else -1, snap, state, op, thread, move, cleanup)
