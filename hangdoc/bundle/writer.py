"""Writing a bundle: ``snapshot_to_dict`` (version 2, with tables; or version 1), its bytes
(``snapshot_bytes``, gzip or not) and ``save_snapshot``.

``_Writer`` numbers the strings, frames, stacks and rows of one bundle being written; a
``_TableWriter`` keeps one table's distinct rows and writes them as columns.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import gzip
import json
import typing
from collections.abc import Callable
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Any

from .. import __version__
from ..memo import collections_paused
from ..model import Frame, JobSnapshot
from ..outfiles import write_file
from .adders import _inline_key, _record_adder
from .codec import _codec
from .columns import _column_json, _shorter, _text_length
from .files import _save_error
from .layout import (
    BUNDLE_SCHEMA_VERSION,
    KIND,
    _Column,
    _table_name,
    _table_order,
    _table_spec,
    _TableSpec,
)
from .stacks import StackTable

# gzip level 6: for the 15 MB of a 100k-rank version 2 bundle, level 9 took 2.2 s for 4%
# less than level 6 (0.4 s, 1.7 MB), level 1 0.1 s for 50% more; each inflates in 0.03 s.
# zlib is in the standard library; zstd is not (before Python 3.14), and 30 ms of
# inflating out of seconds of loading leaves nothing for it to win.
GZIP_LEVEL = 6


def _float_key(cell: Any) -> Any:
    """A row's cell as a dict key: a float by its exact bits (-0.0 is not 0.0)."""
    return cell.hex() if type(cell) is float else cell


class _Numbering(dict[Any, int]):
    """Distinct values numbered in first-seen order: ``numbering[value]`` is its number,
    a new one for a value not seen before (looked up without a Python call when seen)."""

    def __missing__(self, key: Any) -> int:
        idx = self[key] = len(self)
        return idx


class _Lengths(dict[int, int]):
    """The length of each column's JSON text, written out when first asked for."""

    def __init__(self, columns: dict[int, Any]) -> None:
        super().__init__()
        self._columns = columns

    def __missing__(self, i: int) -> int:
        length = self[i] = _text_length(self._columns[i])
        return length


class _Writer(StackTable):
    """The strings, frames, stacks and tables of one bundle being written."""

    def __init__(self) -> None:
        super().__init__()
        self._string_index = _Numbering()
        self.string_id = self._string_index.__getitem__
        self.tables: dict[Any, _TableWriter] = {}

    @property
    def strings(self) -> list[str]:
        return list(self._string_index)

    def table(self, key: Any) -> _TableWriter:
        table = self.tables.get(key)
        if table is None:
            table = self.tables[key] = _TableWriter(_table_spec(key), self)
        return table

    def release(self) -> None:
        """Lets the tables go. A table and its compiled ``add`` refer to each other, so
        left alone its rows would wait for the cycle collector: 2 million objects at 100k
        ranks, 0.8 s of collecting when collections resume."""
        for table in self.tables.values():
            table.__dict__.clear()
        self.tables.clear()

    def tables_json(self) -> dict[str, Any]:
        return {
            _table_name(key): self.tables[key].to_json()
            for key in _table_order()
            if key in self.tables and self.tables[key].rows
        }


def _cell_encoder(col: _Column, w: _Writer) -> Callable[[Any], Any] | None:
    """What a column holds for a value: an index into a table (None: the value itself)."""
    kind = col.kind
    enc: Callable[[Any], Any]
    if kind in ("int", "float", "bool"):
        return None
    if kind == "str":
        enc = w.string_id
    elif kind == "enum":
        enc = _enum_value
    elif kind == "frame":
        enc = w.frame_id
    elif kind == "stack":
        enc = w.stack_id
    elif kind == "ref":
        enc = w.table(col.target).add
    else:  # inline: its codec handles None itself
        inline, _ = _codec(col.target, "v2")
        return lambda v: inline(v, w)
    if col.optional:
        inner = enc
        return lambda v: None if v is None else inner(v)
    return enc


@functools.cache
def _only_strings(key: Any) -> bool:
    """Values of ``key`` are (tuples of) strings, equal exactly when they are equal."""
    if key is str:
        return True
    args = typing.get_args(key)
    return typing.get_origin(key) is tuple and bool(args) and all(a is Ellipsis or _only_strings(a) for a in args)


def _enum_value(member: enum.Enum) -> Any:
    return member.value


class _Memo(dict[Any, int]):
    """A table's rows by value: a value seen before is looked up without a Python call."""

    def __init__(self, add: Callable[[Any], int]) -> None:
        super().__init__()
        self._new = add

    def __missing__(self, value: Any) -> int:
        idx = self[value] = self._new(value)
        return idx


class _TableWriter:
    """The distinct rows of one table, numbered in first-seen order."""

    def __init__(self, spec: _TableSpec, writer: _Writer) -> None:
        self.spec = spec
        self.writer = writer
        self.rows: list[tuple[Any, ...]] = []
        self._index: dict[Any, int] = {}
        # tuples by identity first: a shared tuple is encoded once. Every value added is part
        # of the snapshot being written, alive until the bundle is, so its id stays its own.
        # (Records are not: encoding one costs about what looking it up would.) Tuples of
        # strings (an environment, its variables) are looked up by value: equal ones abound.
        self._by_id: dict[int, int] = {}
        self._encoders = [_cell_encoder(f.column, writer) for f in spec.fields]
        # a tuple's items (``_add``) as its row's dict key holds them: floats by their bits,
        # objects as text (a record's or fixed tuple's cells: ``adders``)
        item = spec.fields[0].column.kind if spec.shape == "seq" else None
        self._item_key = _float_key if item == "float" else _inline_key if item == "inline" else None
        # the fields no row has held anything but the default of, yet: left out if it stays so
        self._unused: list[int] = []
        self._set_unused([i for i, f in enumerate(spec.fields) if f.default is not dataclasses.MISSING])
        # a new row of a record or a tuple of fixed length: ``add`` compiled for its fields
        self._add_row: Callable[[Any], int] = self._add if spec.shape == "seq" else _record_adder(self)
        self.add: Callable[[Any], int] = (
            self._add_row
            if spec.cls
            else _Memo(self._add_row).__getitem__
            if _only_strings(spec.key)
            else self._add_by_id
        )

    def _set_unused(self, unused: list[int]) -> None:
        self._unused = unused
        # the unused fields of a row, and their defaults: one comparison a new row while they are
        self._unused_of = (
            itemgetter(*unused)
            if len(unused) > 1
            else ((lambda parts: (parts[unused[0]],)) if unused else (lambda parts: ()))
        )
        self._defaults = tuple(self.spec.fields[i].default for i in unused)

    @property
    def used(self) -> list[bool]:
        return [i not in self._unused for i in range(len(self.spec.fields))]

    def _new_row(self, key: Any, cells: tuple[Any, ...], parts: tuple[Any, ...]) -> int:
        """Row ``cells`` (looked up as ``key``), not held before; ``parts``: its fields' values.
        Equal rows hold equal values, so a field's default is checked once per distinct row."""
        if self._unused and self._unused_of(parts) != self._defaults:
            self._set_unused([i for i in self._unused if parts[i] == self.spec.fields[i].default])
        idx = self._index[key] = len(self.rows)
        self.rows.append(cells)
        return idx

    def _add_by_id(self, value: Any) -> int:
        idx = self._by_id.get(id(value))
        if idx is None:
            idx = self._by_id[id(value)] = self._add_row(value)
        return idx

    def _add(self, value: Any) -> int:
        """The number of the row ``value`` (a tuple of any length) is, a new row if no row
        holds the same. (A record's or a fixed tuple's is compiled: ``adders``.)"""
        enc = self._encoders[0]
        cells = tuple(value) if enc is None else tuple(map(enc, value))
        key = cells if self._item_key is None else tuple(map(self._item_key, cells))
        idx = self._index.get(key)
        if idx is None:
            idx = self._index[key] = len(self.rows)
            self.rows.append(cells)
        return idx

    def to_json(self) -> dict[str, Any]:
        spec = self.spec
        n = len(self.rows)
        if spec.shape == "seq":
            kind = spec.fields[0].column.kind
            lengths = [len(r) for r in self.rows]
            by_row = {
                "n": n,
                "lengths": _column_json("int", lengths),
                "items": _column_json(kind, list(chain.from_iterable(self.rows))),
            }
            if n > 1 and lengths[0] and lengths.count(lengths[0]) == n:
                # tuples of one length (the ranks' environments) may be stored a position at
                # a time: "the pair at position 3 of every row", which mostly counts up
                by_position = {
                    "n": n,
                    "width": lengths[0],
                    "items": _column_json(kind, list(chain.from_iterable(zip(*self.rows, strict=False)))),
                }
                if _shorter(by_position, by_row):
                    return by_position
            return by_row
        cells = list(zip(*self.rows, strict=False)) if self.rows else [() for _ in spec.fields]
        kept = [i for i in range(len(spec.fields)) if self.used[i]]
        columns = {i: _column_json(spec.fields[i].column.kind, cells[i]) for i in kept}
        out: dict[str, Any] = {"n": n}
        group, shared = self._shared(kept, cells, columns) if spec.shape == "record" else ([], {})
        out["columns"] = {spec.fields[i].name: columns[i] for i in kept if i not in group}
        out.update(shared)
        return out

    def _shared(
        self, kept: list[int], cells: list[tuple[Any, ...]], columns: dict[int, Any]
    ) -> tuple[list[int], dict[str, Any]]:
        """The fields worth storing once per distinct combination (a thread's stack, name
        and flags) instead of once per row, and the table's ``shared`` and ``shared_row``
        that store them; none when that is not shorter.

        Fields join one by one, fewest distinct values first, while the text they take out
        of the rows is more than what they add: a longer ``shared_row`` (more combinations,
        more digits) and their values once per combination. Ids that differ in every row
        do not join."""
        n = len(self.rows)
        fields = self.spec.fields
        length = _Lengths(columns)  # written out for the fields that may join only
        keys = {
            i: [c.hex() if type(c) is float else c for c in cells[i]] if fields[i].column.kind == "float" else cells[i]
            for i in kept
            if fields[i].column.kind != "inline"
        }
        distinct = {i: len(set(column)) for i, column in keys.items()}
        group: list[int] = []
        rows = [0] * n
        cost = 0  # the text of shared and shared_row, estimated: a row number per row
        for i in sorted(distinct, key=distinct.__getitem__):  # fewest values first
            if distinct[i] > n // 4:
                break
            seen = _Numbering()
            # the combinations so far with this field's value (the first field's values alone)
            joined = list(map(seen.__getitem__, zip(rows, keys[i], strict=False) if group else keys[i]))
            m = len(seen)
            grown = n * (len(str(m)) + 1) + m * sum(length[j] // n + 1 for j in (*group, i))
            if m > n // 4 or grown - cost >= length[i]:
                continue
            group.append(i)
            rows, cost = joined, grown
        if not group:
            return [], {}
        # the first row of each combination (numbered in first-seen order)
        firsts = dict(zip(reversed(rows), range(n - 1, -1, -1), strict=False))
        combos = [firsts[combo] for combo in range(len(firsts))]
        shared = {
            "shared": {
                "n": len(combos),
                "columns": {
                    fields[i].name: _column_json(fields[i].column.kind, [cells[i][r] for r in combos]) for i in group
                },
            },
            "shared_row": _column_json("int", rows),
        }
        if _text_length(shared) >= sum(length[i] for i in group):
            return [], {}
        return group, shared


def snapshot_to_dict(snapshot: JobSnapshot, schema_version: int = BUNDLE_SCHEMA_VERSION) -> dict[str, Any]:
    """The bundle's JSON object for ``snapshot``: version 2 (tables), or 1 (what hangdoc
    read before version 2: records field for field, frames and stacks interned)."""
    if schema_version not in (1, 2):
        raise ValueError(f"bundle schema_version is 1 or 2, not {schema_version!r}")
    mode = f"v{schema_version}"
    writer = _Writer()
    try:
        encode_snapshot, _ = _codec(JobSnapshot, mode)
        body = encode_snapshot(snapshot, writer)
        encode_frame, _ = _codec(Frame, "plain")
        out: dict[str, Any] = {"kind": KIND, "schema_version": schema_version, "hangdoc_version": __version__}
        tables = writer.tables_json() if schema_version == 2 else None  # adds strings
        if tables is not None:
            out["strings"] = writer.strings
        out["frames"] = [encode_frame(f, writer) for f in writer.frames]
        out["stacks"] = [[writer.frame_id(f) for f in s] for s in writer.stacks]
        if tables is not None:
            out["tables"] = tables
        out["snapshot"] = body
        return out
    finally:
        writer.release()


def snapshot_bytes(snapshot: JobSnapshot, compress: bool) -> bytes:
    """``snapshot`` as the bytes of a bundle file, gzip-compressed or not."""
    with collections_paused():
        data = json.dumps(snapshot_to_dict(snapshot), ensure_ascii=False, separators=(",", ":"))
    # a lone surrogate (text that was not UTF-8) is written as its JSON escape, "\\udc80",
    # which reads back as the same string
    raw = data.encode("utf-8", "backslashreplace")
    return gzip.compress(raw, compresslevel=GZIP_LEVEL, mtime=0) if compress else raw


def save_snapshot(snapshot: JobSnapshot, path: str | Path) -> None:
    """Write ``snapshot`` to ``path`` as a bundle (gzip when the name ends in ``.gz``), a
    private file (0600: it holds source lines), never through a link nor over another
    user's file (``hangdoc.outfiles``)."""
    path = Path(path)
    raw = snapshot_bytes(snapshot, compress=path.name.endswith(".gz"))
    try:
        write_file(path, raw)
    except (OSError, ValueError) as err:  # ValueError: a NUL in the path
        raise _save_error(path, err) from None
