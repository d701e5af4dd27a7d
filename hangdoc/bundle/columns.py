"""One table column, as written and as read: a list of values, or integers as runs of equal
deltas (``{"runs": [first, delta, count, ...]}``); and the checks a column read passes as a
whole (types, ranges, indices, enum values), a column at a time.
"""

from __future__ import annotations

import enum
import functools
import json
from itertools import accumulate, chain, compress, islice, repeat
from operator import mul, ne, sub
from typing import Any

from ..errors import shown
from .invalid import _expect_list, _Invalid, _kind
from .limits import MAX_TABLE_ITEMS

_NONE = type(None)
_INT = frozenset({int})
_INT_OR_NONE = frozenset({int, _NONE})
# An integer column as read: a list, or a range where runs made one (a single run that
# counts up or down, as row numbers do)
Ints = list[Any] | range

_INDEX_KINDS = frozenset({"int", "str", "frame", "stack", "ref"})


def _column_json(kind: str, cells: list[Any] | tuple[Any, ...]) -> Any:
    """A column as written: a list, or for integers, ``{"runs": [first, delta, count,
    ...]}`` when that is shorter (numbers that count up by the same steps)."""
    if kind not in _INDEX_KINDS or len(cells) < 4:
        return list(cells)
    # indices into a table are ints the writer made, or None; other ints are checked
    if (None in cells) if kind != "int" else not set(map(type, cells)) <= _INT:
        return list(cells)
    deltas = list(map(sub, islice(cells, 1, None), cells))
    # where each run of equal deltas starts, and so how long it is; looked for only while
    # the runs would have fewer numbers than the column
    most = (len(cells) - 1) // 2
    starts = [0, *islice(compress(range(1, len(deltas)), map(ne, islice(deltas, 1, None), deltas)), most)]
    if 1 + 2 * len(starts) > len(cells):
        return list(cells)  # more numbers than the column
    counts = map(sub, chain(islice(starts, 1, None), (len(deltas),)), starts)
    runs = [cells[0], *chain.from_iterable(zip(map(deltas.__getitem__, starts), counts, strict=False))]
    # a run counts steadily up or down: the column's least and greatest values are among
    # those where runs start, and its last
    ends = [*map(cells.__getitem__, starts), cells[-1]]
    column = _int_list_bounds(len(cells), min(ends), max(ends))
    if not _bounded_shorter(_int_list_bounds(len(runs), min(runs), max(runs)), column, runs, cells):
        return list(cells)  # runs must be shorter, and have fewer numbers to parse
    return {"runs": runs}


def _text_length(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def _shorter(a: Any, b: Any) -> bool:
    """``a``'s JSON text is shorter than ``b``'s: told by bounds on their lengths where
    those decide (writing out a list of 2 million ints takes 0.15 s, its least and greatest
    0.03 s), else by writing both out."""
    return _bounded_shorter(_length_bounds(a), _length_bounds(b), a, b)


def _bounded_shorter(a_bounds: tuple[int, int], b_bounds: tuple[int, int], a: Any, b: Any) -> bool:
    """``_shorter``, given bounds on the two lengths."""
    if a_bounds[1] < b_bounds[0]:
        return True
    if a_bounds[0] >= b_bounds[1]:
        return False
    return _text_length(a) < _text_length(b)


def _length_bounds(value: Any) -> tuple[int, int]:
    """Least and greatest length the JSON text of ``value`` can have: a list of ints bounded
    by its least and greatest items, an object by its parts; anything else written out."""
    if type(value) is dict:
        # braces, a colon per key, commas between; each key as written
        fixed = 2 + 2 * len(value) - 1 + sum(len(json.dumps(k)) for k in value)
        parts = [_length_bounds(v) for v in value.values()]
        return fixed + sum(p[0] for p in parts), fixed + sum(p[1] for p in parts)
    if type(value) not in (list, tuple) or not value or not set(map(type, value)) <= _INT:
        return (_text_length(value),) * 2
    return _int_list_bounds(len(value), min(value), max(value))


def _int_list_bounds(n: int, least: int, greatest: int) -> tuple[int, int]:
    """Least and greatest length of the JSON text of ``n`` ints from ``least`` to ``greatest``."""
    widths = len(str(least)), len(str(greatest))
    # an int between the two is as wide as the wider at most, and 1 wide (a digit) at
    # least where the range holds 0, else as wide as the end nearer 0
    narrowest = 1 if least <= 0 <= greatest else min(widths)
    brackets_and_commas = n + 1
    return brackets_and_commas + narrowest * n, brackets_and_commas + max(widths) * n


def _lookup(table: list[Any], idx: Ints, has_none: bool, none: Any = None) -> list[Any]:
    if has_none:
        return [none if i is None else table[i] for i in idx]
    if type(idx) is range and idx.step > 0:  # rows in order (a tuple table's items)
        return table[idx.start : idx.stop : idx.step]
    return list(map(table.__getitem__, idx))


def _ints(raw: object, n: int, optional: bool, what: str) -> tuple[Ints, bool, tuple[int, int] | None]:
    """An integer column of ``n`` values: a list of ints (None too when ``optional``), or
    runs. Also whether it holds a None, and its least and greatest values when they came
    for free (from runs)."""
    if type(raw) is dict:
        values, bounds = _runs(raw, n)
        return values, False, bounds
    raw = _expect_list(raw)
    if len(raw) != n:
        raise _Invalid(f"{len(raw):,} values for {n:,} rows")
    allowed = _INT_OR_NONE if optional else _INT
    found = set(map(type, raw))
    if not found <= allowed:
        i = next(i for i, v in enumerate(raw) if type(v) not in allowed)
        message = f"{what} reference must be an integer" if what else "expected int"
        raise _Invalid(f"{message}, got {_kind(raw[i])}", f"[{i}]")
    return raw, _NONE in found, None


def _runs(raw: dict[str, Any], n: int) -> tuple[Ints, tuple[int, int]]:
    """``{"runs": [first, delta, count, ...]}`` expanded to its ``n`` values, and their
    least and greatest."""
    if set(raw) != {"runs"}:
        raise _Invalid("expected a list, or an object with only the key 'runs'")
    runs = raw["runs"]
    try:
        _expect_list(runs)
        _check_types(runs, _INT, "int")
        if n == 0 or len(runs) % 2 == 0:
            raise _Invalid(f"{len(runs):,} numbers, not a first value and (delta, count) pairs for {n:,} rows")
        first, deltas, counts = runs[0], runs[1::2], runs[2::2]
        low, high = min(runs[:2]), max(runs[:2])  # the first value and deltas
        if deltas:
            low, high = min(low, min(deltas)), max(high, max(deltas))
        # bounded steps: no huge ints below
        _check_range(runs, -(2**64), 2**64, False, bounds=(low, high))
        _check_range(counts, 1, MAX_TABLE_ITEMS, False, offset=2, step=2)
    except _Invalid as err:
        raise err.under("runs") from None
    if 1 + sum(counts) != n:
        raise _Invalid(f"runs give {1 + sum(counts):,} values for {n:,} rows", "runs")
    if len(runs) <= 3:  # one run (or one value): a range, or one value n times
        step = deltas[0] if deltas else 0
        last = first + step * (n - 1)
        values: Ints = range(first, last + step, step) if step else [first] * n
        return values, (min(first, last), max(first, last))
    values = list(accumulate(chain.from_iterable(map(repeat, deltas, counts)), initial=first))
    if min(deltas) >= 0:  # counting up (ids, row numbers): the ends are the bounds
        return values, (first, values[-1])
    if max(deltas) <= 0:
        return values, (values[-1], first)
    # each run counts steadily up or down: the bounds are among the values where runs end
    ends = list(accumulate(map(mul, deltas, counts), initial=first))
    return values, (min(ends), max(ends))


def _check_types(values: list[Any], allowed: frozenset[type], name: str) -> None:
    if not set(map(type, values)) <= allowed:
        i = next(i for i, v in enumerate(values) if type(v) not in allowed)
        raise _Invalid(f"expected {name}, got {_kind(values[i])}", f"[{i}]")


def _check_range(
    values: Ints,
    lo: int,
    hi: int,
    has_none: bool,
    int64: bool = False,
    offset: int = 0,
    step: int = 1,
    bounds: tuple[int, int] | None = None,
) -> None:
    """Every int in ``values`` lies in ``lo..hi`` (``bounds``: their least and greatest,
    when known); else the first that does not, and where it is."""
    if bounds is None:
        present = list(filter(_not_none, values)) if has_none else values
        if not present:
            return
        bounds = min(present), max(present)
    if lo <= bounds[0] and bounds[1] <= hi:
        return
    i, v = next((i, v) for i, v in enumerate(values) if v is not None and not lo <= v <= hi)
    message = (
        f"integer {shown(v, 40)} does not fit in 64 bits" if int64 else f"{shown(v, 40)} is out of range ({lo} to {hi})"
    )
    raise _Invalid(message, f"[{offset + i * step}]")


def _not_none(value: object) -> bool:
    return value is not None


def _check_indices(idx: Ints, size: int, what: str, has_none: bool, bounds: tuple[int, int] | None = None) -> None:
    if bounds is None:
        present = list(filter(_not_none, idx)) if has_none else idx
        if not present:
            return
        bounds = min(present), max(present)
    if bounds[0] >= 0 and bounds[1] < size:
        return
    i, v = next((i, v) for i, v in enumerate(idx) if v is not None and not 0 <= v < size)
    raise _Invalid(f"{what} index {v} out of range (table has {size})", f"[{i}]")


def _floats(raw: list[Any], optional: bool) -> list[Any]:
    allowed: frozenset[type] = frozenset({float, int, _NONE} if optional else {float, int})
    found = set(map(type, raw))
    if not found <= allowed:
        _check_types(raw, allowed, "float")
    if int not in found:
        return raw
    out = []
    for i, v in enumerate(raw):
        try:
            out.append(float(v) if type(v) is int else v)
        except OverflowError:
            raise _Invalid(f"the number {shown(v, 40)} is too large", f"[{i}]") from None
    return out


@functools.cache
def _members(tp: type[enum.Enum], optional: bool) -> dict[Any, Any]:
    members: dict[Any, Any] = {m.value: m for m in tp}
    if optional:
        members[None] = None
    return members


_HASHABLE = frozenset({str, int, float, bool, _NONE})


def _enums(raw: list[Any], tp: type[enum.Enum], optional: bool) -> list[Any]:
    members = _members(tp, optional)
    if not set(map(type, raw)) <= _HASHABLE or not set(raw) <= members.keys():
        i, v = next((i, v) for i, v in enumerate(raw) if type(v) not in _HASHABLE or v not in members)
        known = ", ".join(repr(m.value) for m in tp)
        raise _Invalid(f"unknown {tp.__name__} {shown(v)} (known: {known})", f"[{i}]")
    return list(map(members.__getitem__, raw))
