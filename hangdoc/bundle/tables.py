"""``_Tables``: the strings, frames, stacks and tables of one bundle being read, and what
the snapshot has used of them, counted against the caps in ``limits``; and the weights
(the records and frames each row of a table reaches) those counts add up.
"""

from __future__ import annotations

from itertools import repeat
from operator import add, mul
from typing import Any

from ..model import Frame
from .columns import Ints, _lookup
from .invalid import _index, _Invalid
from .layout import _table_name
from .limits import MAX_RECORDS, MAX_TABLE_ITEMS, MAX_TABLE_ROWS, MAX_THREAD_FRAMES
from .stacks import StackTable

# What the rows of a table reach, counted for the caps: a list with one count per row, or
# one int when every row reaches the same (0: nothing).
Weights = list[int] | int


class _Tables(StackTable):
    """The strings, frames, stacks and tables of one bundle being read, and what the
    snapshot has used of them so far (each use counted, for the caps)."""

    def __init__(self) -> None:
        super().__init__()
        self.thread_frames = 0  # frames of every stack reference decoded so far
        self.records = 0  # table records reached from the snapshot, each use counted
        self.stored = [0, 0]  # rows in all tables, and items of the tuples among them
        self.strings: list[str] = []
        self.rows: dict[Any, list[Any]] = {}
        # per table: the records and frames each row reaches (itself and what it refers to)
        self.weights: dict[Any, tuple[Weights, Weights]] = {}
        self._lengths: list[int] = []

    def stack_lengths(self) -> list[int]:
        if len(self._lengths) != len(self.stacks):
            self._lengths = list(map(len, self.stacks))
        return self._lengths

    def frame_at(self, idx: object) -> Frame:
        return self.frames[_index(idx, len(self.frames), "frame")]

    def stack_at(self, idx: object) -> tuple[Frame, ...]:
        stack = self.stacks[_index(idx, len(self.stacks), "stack")]
        self.use(0, len(stack))
        return stack

    def row_at(self, key: Any, idx: object) -> Any:
        rows = self.rows.get(key, [])
        i = _index(idx, len(rows), _table_name(key))
        records, frames = self.weights[key]
        self.use(_weight_at(records, i), _weight_at(frames, i))
        return rows[i]

    def use(self, records: int, frames: int) -> None:
        self.records += records
        self.thread_frames += frames
        if self.thread_frames > MAX_THREAD_FRAMES:
            raise _Invalid(
                f"the threads of all samples hold more than {MAX_THREAD_FRAMES:,} "
                "frames in all, more than hangdoc analyses"
            )
        if self.records > MAX_RECORDS:
            raise _Invalid(
                f"the snapshot holds more than {MAX_RECORDS:,} records (threads, "
                "samples, ...) counted each time they are used, more than hangdoc "
                "analyses"
            )

    def store(self, rows: int, items: bool = False) -> None:
        self.stored[items] += rows
        cap = MAX_TABLE_ITEMS if items else MAX_TABLE_ROWS
        if self.stored[items] > cap:
            what = "items of tuples" if items else "rows"
            raise _Invalid(f"the tables hold more than {cap:,} {what} in all, more than any snapshot")


def _total(w: Weights, n: int) -> int:
    return w * n if isinstance(w, int) else sum(w)


def _weight_at(w: Weights, i: int) -> int:
    return w if isinstance(w, int) else w[i]


def _weights_of(w: Weights, idx: Ints, has_none: bool) -> Weights:
    """The weights of the rows ``idx`` refers to (None: no row, weighing nothing)."""
    if isinstance(w, int):
        return w if not has_none or not w else [0 if i is None else w for i in idx]
    return _lookup(w, idx, has_none, 0)


def _add_weights(a: Weights, b: Weights) -> Weights:
    if isinstance(a, int):
        if isinstance(b, int):
            return a + b
        a, b = b, a
    if isinstance(b, int):
        return list(map(add, a, repeat(b))) if b else a
    return list(map(add, a, b))


def _tuple_weights(w: Weights, spans: list[slice], lengths: Ints) -> Weights:
    """Each tuple's weight: the sum of its items' (``spans``: where each tuple's items are)."""
    if isinstance(w, int):
        return list(map(mul, lengths, repeat(w))) if w else 0
    return list(map(sum, map(w.__getitem__, spans)))


def _width_weights(w: Weights, positions: list[slice], width: int) -> Weights:
    """Each tuple's weight, for tuples of one length stored position after position."""
    if isinstance(w, int):
        return w * width
    return list(map(sum, zip(*map(w.__getitem__, positions), strict=False)))


_new = object.__new__
