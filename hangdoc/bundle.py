"""Save a ``JobSnapshot`` to a file and read it back (``diagnose --save``, ``analyze``).

A bundle is one JSON object (gzip-compressed when the path ends in ``.gz``). Version 2
stores every value that repeats once, in tables (docs/json-schema.md, "Snapshot files")::

    {"kind": "hangdoc-snapshot", "schema_version": 2, "hangdoc_version": "0.1.0",
     "strings": ["MainThread", "sleeping", ...],
     "frames": [{"function": ..., "filename": ..., "line": ..., "native": ..., "code": ...}],
     "stacks": [[0, 1, 2], ...],
     "tables": {"ThreadStack": {"n": 800000, "columns": {"thread_id": {"runs": [...]}, ...},
                                "shared": {"n": 259, "columns": {"frames": [...], ...}},
                                "shared_row": [...]},
                "ThreadStack[]": {"n": 100000, "lengths": [...], "items": {"runs": [...]}},
                "(str,str)[]": {"n": 100000, "width": 19, "items": {"runs": [...]}},
                ...},
     "snapshot": {"spec": ..., "ranks": [{"process": 0, "samples": 0}, ...], ...}}

- **Frames and stacks** are interned as in version 1: every distinct frame once in
  ``frames``, every distinct stack once in ``stacks`` as frame indices.
- **Records** of the types in ``TABLED`` (the per-rank, per-sample and per-thread ones:
  ``RankProcess``, ``Sample``, ``ProcessState``, ``ThreadCounters``, ``ThreadStack``,
  ``FrameLocals``, ``CaptureError``) live in one table per type, each distinct record once,
  and are referred to by row number. So are the tuples these records hold (a sample's
  threads ``ThreadStack[]``, an environment ``(str,str)[]``, a command line ``str[]``) and
  the fixed tuples inside them (an environment pair ``(str,str)``). A waiting rank's three
  samples share their threads; ranks share their command line and environment pairs.
- **Tables are columnar**: ``n`` rows, and one list of ``n`` values per field. A string is
  an index into ``strings``; a frame, stack or record an index into its table. A column of
  integers may be written ``{"runs": [first, delta, count, delta, count, ...]}`` (the
  deltas between rows, run-length coded), which makes thread ids, pids, ranks and row
  numbers that count up cost a few numbers per rank instead of one per row. A column left
  out holds the field's default on every row. Fields whose values repeat as a group (a
  thread's name, stack and flags) may be stored once per distinct combination under
  ``shared``, with ``shared_row`` giving each row's combination. A table of tuples holds
  their ``lengths`` and all their ``items`` in one column, or, when every tuple has the
  same length, its ``width`` and the items position after position (every rank's first
  environment variable, then every rank's second, ...).
- **The rest** (``snapshot``: the ``JobSnapshot`` and its ranks, flight records, GPU state,
  sources, ...) is written field for field as in version 1, a field of a tabled type
  holding a row number (a rank's ``process`` and ``samples``). A field equal to its
  dataclass default is left out of its object.

Version 1 (one JSON object per record, only frames and stacks interned) is still read,
and written by ``snapshot_to_dict(..., schema_version=1)``. On a synthetic 100k-rank job
(3 samples, 4 to 12 threads and 19 environment variables a rank) version 1 takes 3,430
bytes a rank (116 gzipped) and took 50 s and 2.4 GB to load before version 2 (32 s and
2.0 GB now); version 2 takes 151 bytes (17) and about 3 s and 380 MB (docs/benchmarks.md).

The conversion is driven by the model's type hints, not written field by field: each type
gets its converters (a codec for the ``snapshot`` part, a column layout for a table)
compiled once from its annotations, so a field added to ``model.py`` is saved and loaded
without touching this file. Tables are read a column at a time: a column's types and
ranges are checked in one pass over it and its records are built with the slot setters
of their classes (``TABLED`` classes are plain frozen slot dataclasses; this is checked),
without a Python call per field and row. A long list of objects written field for field
(a snapshot's ranks) is read the same way when they all have the same keys. Loading
shares what the file shares: one object per distinct stack, frame, string, record and
tuple, so equal threads of a rank's samples are the same object.

Reading a bad file raises ``BundleError`` with one line that says what is wrong and where
(``at tables.ThreadStack.columns.native_id[17]: ...``), and nothing else: only regular
files are opened (never blocking on a FIFO or reading ``/dev/zero``), the file and its
decompressed text are read up to a cap, integers are checked against the ranges below (a
bool is not an int), and since a shared record or stack can be used many times, the
records and frames reachable from the snapshot are counted each time they are used and
capped, so that no file can make the analysis allocate or walk without bound
(``world_size: 2e9`` would ask for two billion expected ranks).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import gzip
import json
import os
import stat
import types
import typing
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate, chain, compress, islice, repeat
from operator import add, attrgetter, itemgetter, mul, ne, sub
from pathlib import Path
from typing import Any, NamedTuple

from . import __version__
from .errors import BundleError, one_line, shown
from .model import (
    MAX_WORLD_SIZE,
    PID_MAX,
    CaptureError,
    Frame,
    FrameLocals,
    GpuState,
    Heartbeat,
    JobSnapshot,
    ProcessState,
    RankProcess,
    RasCommunicator,
    RasRank,
    Sample,
    Stack,
    ThreadCounters,
    ThreadStack,
    Unreachable,
    collections_paused,
)
from .outfiles import Refused, check_target, write_file

KIND = "hangdoc-snapshot"
# The version of the bundle layout: its own number, not ``hangdoc.SCHEMA_VERSION`` (the JSON
# report's and the agent API's), which did not change when bundles became tables.
BUNDLE_SCHEMA_VERSION = 2
_GZIP_MAGIC = b"\x1f\x8b"
# gzip level 6: for the 15 MB of a 100k-rank version 2 bundle, level 9 took 2.2 s for 4%
# less than level 6 (0.4 s, 1.7 MB), level 1 0.1 s for 50% more; each inflates in 0.03 s.
# zlib is in the standard library; zstd is not (before Python 3.14), and 30 ms of
# inflating out of seconds of loading leaves nothing for it to win.
GZIP_LEVEL = 6

# Size caps. A version 2 bundle of a synthetic 100k-rank job (3 samples, 8 threads a rank)
# is about 150 bytes a rank before gzip and 17 after; a version 1 bundle about 3.4 kB
# before and 116 after. The caps leave room for 100x that and keep a corrupt or hostile
# file from filling the memory: a plain file is read up to MAX_FILE_BYTES, and gzip data is
# inflated incrementally, stopping once the text passes MAX_JSON_BYTES (a 1 MB gzip "bomb"
# of zeros would otherwise inflate to 1 GB).
MAX_FILE_BYTES = 512 * 2**20
MAX_JSON_BYTES = 512 * 2**20
_READ_CHUNK = 4 * 2**20


def read_at_most(fd: int, limit: int) -> bytes | None:
    """The rest of ``fd``, or None when it holds more than ``limit`` bytes. ``st_size`` can
    lie (files in /proc say 0, a file can grow while read): the bytes are counted."""
    chunks, total = [], 0
    while chunk := os.read(fd, min(_READ_CHUNK, limit + 1 - total)):
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            return None
    return b"".join(chunks)

# Integer ranges (inclusive); model.MAX_WORLD_SIZE bounds ranks and world sizes.
# Stacks are interned, so a small file can make thousands of threads share one deep stack;
# the analysis walks every thread's frames (about 2 us each), so the frames of all threads
# of all samples together are capped: 50 million is about 90 s of analysis, and 5 times a
# 10000-rank capture (5 samples, 2 threads, 100 frames deep). One stack holds at most
# MAX_STACK_DEPTH frames, far past Python's recursion limit (1000 by default).
MAX_STACK_DEPTH = 100_000
MAX_THREAD_FRAMES = 50_000_000
# Records are interned too (version 2), so a few numbers can make a rank hold a million
# samples of a million threads: the records reachable from the snapshot, counted each time
# they are used (a rank's samples, their threads, ...), are capped at MAX_RECORDS, 4 times
# the largest job hangdoc analyses (MAX_WORLD_SIZE ranks, 5 samples of 12 threads). And
# since a table's rows can come from a few numbers (runs, columns left out), the tables
# together hold at most MAX_TABLE_ROWS rows (each a Python object: a 512 MB version 1
# file holds about 13 million thread records) and MAX_TABLE_ITEMS items of tuples.
MAX_RECORDS = 2**26
MAX_TABLE_ROWS = 2**24
MAX_TABLE_ITEMS = 2**26
_INT_RANGE = (-(2**63), 2**64 - 1)  # any other int: 64 bits (thread ids are pthread_t values)
_FIELD_RANGES: dict[tuple[type, str], tuple[int, int]] = {
    (JobSnapshot, "world_size"): (0, MAX_WORLD_SIZE),
    (RankProcess, "world_size"): (0, MAX_WORLD_SIZE),
    (RankProcess, "rank"): (0, MAX_WORLD_SIZE - 1),
    (RankProcess, "local_rank"): (0, MAX_WORLD_SIZE - 1),
    (RankProcess, "pid"): (0, PID_MAX),
    (RankProcess, "launcher_pid"): (0, PID_MAX),
    (Unreachable, "ranks"): (0, MAX_WORLD_SIZE - 1),
    (Frame, "line"): (0, 2**31 - 1),
    (ProcessState, "num_threads"): (0, 2**31 - 1),
    (ThreadCounters, "native_id"): (0, PID_MAX),
    (FrameLocals, "index"): (0, MAX_STACK_DEPTH - 1),
    (GpuState, "utilization_percent"): (0, 100),
    (RasRank, "comm_rank"): (0, MAX_WORLD_SIZE - 1),
    (RasCommunicator, "size"): (0, MAX_WORLD_SIZE),
    (Heartbeat, "pid"): (0, PID_MAX),
    (Heartbeat, "beats"): (0, 2**63 - 1),
}

# The record types a version 2 bundle stores in tables: those a job has one of per rank,
# per sample or per thread. Each must be a frozen dataclass with slots and no
# ``__post_init__`` (``_table_spec`` checks): its rows are built with its slot setters.
TABLED: tuple[type, ...] = (RankProcess, Sample, ProcessState, ThreadCounters, ThreadStack,
                            FrameLocals, CaptureError)


class _Invalid(Exception):
    """A decoding failure; ``where`` is built up on the way out, so success pays nothing."""

    def __init__(self, message: str, where: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.where = where

    def under(self, segment: str) -> _Invalid:
        sep = "" if not self.where or self.where.startswith("[") else "."
        self.where = f"{segment}{sep}{self.where}"
        return self


class StackTable:
    """Distinct frames and stacks, each numbered in first-seen order: how a bundle, and an
    agent's answer on the wire, store every stack once and refer to it by number."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.stacks: list[tuple[Frame, ...]] = []
        self._frame_index: dict[Frame, int] = {}
        self._stack_index: dict[tuple[Frame, ...], int] = {}

    def frame_id(self, frame: Frame) -> int:
        idx = self._frame_index.get(frame)
        if idx is None:
            idx = self._frame_index[frame] = len(self.frames)
            self.frames.append(frame)
        return idx

    def stack_id(self, stack: tuple[Frame, ...]) -> int:
        idx = self._stack_index.get(stack)
        if idx is None:
            for frame in stack:
                self.frame_id(frame)
            idx = self._stack_index[stack] = len(self.stacks)
            self.stacks.append(stack)
        return idx


def _index(idx: object, size: int, what: str) -> int:
    if type(idx) is not int:
        raise _Invalid(f"{what} reference must be an integer, got {_kind(idx)}")
    if not 0 <= idx < size:
        raise _Invalid(f"{what} index {idx} out of range (table has {size})")
    return idx


def _kind(value: object) -> str:
    """How a JSON value is named in error messages."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if type(value) in (int, float):
        return f"the number {shown(value, 40)}"
    return names.get(type(value), type(value).__name__)


# ------------------------------------------------------------------ tables: layouts

_NONE = type(None)
_STACK = Stack  # tuple[Frame, ...]: a stack index, never a table of its own


class _Column(NamedTuple):
    """How one field's values are stored in a table column."""

    # int, float, bool, str (an index into ``strings``), text (a string as itself: objects
    # written field for field, see _many_decoder), enum, frame, stack, ref (a row of another
    # table), inline (a value written field for field, as in the ``snapshot`` part)
    kind: str
    optional: bool = False  # the field may be None (null in the column)
    target: Any = None  # ref: the table's key; enum: the enum; inline: the field's type


class _Field(NamedTuple):
    """One column of a table: a dataclass field, a fixed tuple's element, or a tuple's items."""

    name: str
    column: _Column
    default: Any  # dataclasses.MISSING where the column may not be left out
    limits: tuple[int, int] | None  # _FIELD_RANGES; None: any 64-bit int
    setter: Any  # the slot's descriptor ``__set__`` (record tables)


class _TableSpec(NamedTuple):
    key: Any  # a TABLED class, ``tuple[X, ...]`` or ``tuple[A, B]``
    name: str  # its name in ``tables``: ThreadStack, ThreadStack[], (str,str)
    shape: str  # record, seq (tuples of any length) or fixed (tuples of len(fields))
    fields: tuple[_Field, ...]  # seq: one, named "items"
    cls: type | None  # record tables: the dataclass


def _optional_arg(tp: Any) -> Any:
    """``X`` for ``X | None``, else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1 or len(args) != 2:
            raise TypeError(f"bundle supports only `X | None` unions, not {tp!r}")
        return inner[0]
    return None


def _tabled_key(tp: Any) -> bool:
    """Values of ``tp`` in the ``snapshot`` part are rows of a table (version 2)."""
    if tp in TABLED:
        return True
    args = typing.get_args(tp)
    return typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis \
        and args[0] in TABLED


@functools.cache
def _column(tp: Any) -> _Column:
    """The column layout for values of ``tp`` inside a table."""
    inner = _optional_arg(tp)
    if inner is not None:
        col = _column(inner)
        return _Column("inline", True, tp) if col.kind == "inline" else col._replace(optional=True)
    if tp is Frame:
        return _Column("frame")
    if tp == _STACK:
        return _Column("stack")
    if tp in (int, float, bool, str):
        return _Column(tp.__name__)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _Column("enum", target=tp)
    if tp in TABLED or typing.get_origin(tp) is tuple:
        _table_spec(tp)  # a layout it cannot have fails here, when the layout is compiled
        return _Column("ref", target=tp)
    return _Column("inline", target=tp)


@functools.cache
def _table_name(key: Any) -> str:
    if isinstance(key, type):
        return key.__name__
    args = typing.get_args(key)
    if len(args) == 2 and args[1] is Ellipsis:
        return f"{_table_name(args[0])}[]"
    return "(" + ",".join(_table_name(a) for a in args) + ")"


@functools.cache
def _table_spec(key: Any) -> _TableSpec:
    name = _table_name(key)
    if key in TABLED:
        params = getattr(key, "__dataclass_params__", None)
        slots = set(getattr(key, "__slots__", ()))
        fields = list(dataclasses.fields(key))
        if (params is None or not params.frozen or hasattr(key, "__post_init__")
                or any(not f.init or f.name not in slots for f in fields)):
            raise TypeError(f"bundle tables need frozen slot dataclasses without "
                            f"__post_init__, and {key.__name__} is not one")
        hints = typing.get_type_hints(key)
        return _TableSpec(key, name, "record", tuple(
            _Field(f.name, _column(hints[f.name]), f.default, _FIELD_RANGES.get((key, f.name)),
                   key.__dict__[f.name].__set__)
            for f in fields), key)
    args = typing.get_args(key)
    if typing.get_origin(key) is not tuple or not args or args == ((),):
        raise TypeError(f"bundle cannot store values of type {key!r} in a table")
    if len(args) == 2 and args[1] is Ellipsis:
        return _TableSpec(key, name, "seq",
                          (_Field("items", _column(args[0]), dataclasses.MISSING, None, None),),
                          None)
    return _TableSpec(key, name, "fixed", tuple(
        _Field(str(i), _column(a), dataclasses.MISSING, None, None) for i, a in enumerate(args)),
        None)


def _references(key: Any) -> Iterator[Any]:
    """The tables the columns of table ``key`` refer to."""
    for f in _table_spec(key).fields:
        if f.column.kind == "ref":
            yield f.column.target
        elif f.column.kind == "inline":
            yield from _inline_references(f.column.target)


def _inline_references(tp: Any, seen: frozenset[Any] = frozenset()) -> Iterator[Any]:
    """The tables that values of ``tp``, written field for field, refer to."""
    if tp in seen:
        return
    if _tabled_key(tp):
        yield tp
        return
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        for hint in typing.get_type_hints(tp).values():
            yield from _inline_references(hint, seen | {tp})
    else:
        for arg in typing.get_args(tp):
            if arg is not Ellipsis and arg is not type(None):
                yield from _inline_references(arg, seen)


@functools.cache
def _table_order() -> tuple[Any, ...]:
    """Every table a bundle can hold, each after the tables its columns refer to."""
    order: list[Any] = []

    def visit(key: Any, path: tuple[Any, ...]) -> None:
        if key in order:
            return
        if key in path:
            raise TypeError(f"bundle tables cannot refer to themselves ({_table_name(key)})")
        for ref in _references(key):
            visit(ref, (*path, key))
        order.append(key)

    for key in _inline_references(JobSnapshot):
        visit(key, ())
    return tuple(order)


# ------------------------------------------------------------- writing: the context


def _float_key(cell: Any) -> Any:
    """A row's cell as a dict key: a float by its exact bits (-0.0 is not 0.0)."""
    return cell.hex() if type(cell) is float else cell


class _Numbering(dict[Any, int]):
    """Distinct values numbered in first-seen order: ``numbering[value]`` is its number,
    a new one for a value not seen before (looked up without a Python call when seen)."""

    def __missing__(self, key: Any) -> int:
        idx = self[key] = len(self)
        return idx


class _Writer(StackTable):
    """The strings, frames, stacks and tables of one bundle being written."""

    def __init__(self) -> None:
        super().__init__()
        self._stack_ids: dict[int, tuple[Stack, int]] = {}
        self._string_index = _Numbering()
        self.string_id = self._string_index.__getitem__
        self.tables: dict[Any, _TableWriter] = {}

    def stack_id(self, stack: tuple[Frame, ...]) -> int:
        # by identity first: hashing a stack hashes each of its frames
        hit = self._stack_ids.get(id(stack))
        if hit is None:
            hit = self._stack_ids[id(stack)] = (stack, super().stack_id(stack))
        return hit[1]

    @property
    def strings(self) -> list[str]:
        return list(self._string_index)

    def table(self, key: Any) -> _TableWriter:
        table = self.tables.get(key)
        if table is None:
            table = self.tables[key] = _TableWriter(_table_spec(key), self)
        return table

    def tables_json(self) -> dict[str, Any]:
        return {_table_name(key): self.tables[key].to_json()
                for key in _table_order() if key in self.tables and self.tables[key].rows}


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
    return (typing.get_origin(key) is tuple and bool(args)
            and all(a is Ellipsis or _only_strings(a) for a in args))


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
        self.add: Callable[[Any], int] = (
            self._add if spec.cls else _Memo(self._add).__getitem__ if _only_strings(spec.key)
            else self._add_by_id)
        self._encoders = [_cell_encoder(f.column, writer) for f in spec.fields]
        # (position, encoder) of the cells that are not the value itself
        self._converted = [(i, enc) for i, enc in enumerate(self._encoders) if enc is not None]
        self._get = attrgetter(*(f.name for f in spec.fields)) if spec.cls else None
        self._get_many = len(spec.fields) > 1  # attrgetter gives a tuple
        # the cells a row's dict key holds otherwise: floats by their bits, objects as text
        self._floats = [i for i, f in enumerate(spec.fields) if f.column.kind == "float"]
        self._inlines = [i for i, f in enumerate(spec.fields) if f.column.kind == "inline"]
        # the fields no row has held anything but the default of, yet: left out if it stays so
        self._unused: list[int] = []
        self._set_unused([i for i, f in enumerate(spec.fields)
                          if f.default is not dataclasses.MISSING])

    def _set_unused(self, unused: list[int]) -> None:
        self._unused = unused
        # the unused fields of a row, and their defaults: one comparison a row while they are
        self._unused_of = itemgetter(*unused) if len(unused) > 1 else (
            (lambda parts: (parts[unused[0]],)) if unused else (lambda parts: ()))
        self._defaults = tuple(self.spec.fields[i].default for i in unused)

    @property
    def used(self) -> list[bool]:
        return [i not in self._unused for i in range(len(self.spec.fields))]

    def _add_by_id(self, value: Any) -> int:
        idx = self._by_id.get(id(value))
        if idx is None:
            idx = self._by_id[id(value)] = self._add(value)
        return idx

    def _add(self, value: Any) -> int:
        """The number of the row ``value`` is, a new row if no row holds the same."""
        spec = self.spec
        if spec.shape == "seq":
            enc = self._encoders[0]
            cells = tuple(value) if enc is None else tuple(map(enc, value))
        else:
            if spec.shape == "fixed":
                if type(value) is not tuple or len(value) != len(spec.fields):
                    raise TypeError(f"bundle: {value!r} is not a {spec.name}")
                parts = list(value)
            else:
                got = self._get(value)  # type: ignore[misc]
                parts = list(got) if self._get_many else [got]
                if self._unused and tuple(self._unused_of(parts)) != self._defaults:
                    self._set_unused([i for i in self._unused
                                      if parts[i] == spec.fields[i].default])
            for i, enc in self._converted:
                parts[i] = enc(parts[i])
            cells = tuple(parts)
        key: Any = cells
        if self._floats or self._inlines:
            parts = list(cells)
            for i in self._floats:
                parts[i] = _float_key(parts[i])
            for i in self._inlines:
                if type(parts[i]) in (list, dict):
                    parts[i] = json.dumps(parts[i], sort_keys=True)
            key = tuple(parts)
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
            by_row = {"n": n, "lengths": _column_json("int", lengths),
                      "items": _column_json(kind, [c for r in self.rows for c in r])}
            if n > 1 and lengths[0] and lengths.count(lengths[0]) == n:
                # tuples of one length (the ranks' environments) may be stored a position at
                # a time: "the pair at position 3 of every row", which mostly counts up
                by_position = {"n": n, "width": lengths[0],
                               "items": _column_json(kind, [c for p in zip(*self.rows) for c in p])}
                if _text_length(by_position) < _text_length(by_row):
                    return by_position
            return by_row
        cells = list(zip(*self.rows)) if self.rows else [() for _ in spec.fields]
        kept = [i for i in range(len(spec.fields)) if self.used[i]]
        columns = {i: _column_json(spec.fields[i].column.kind, cells[i]) for i in kept}
        out: dict[str, Any] = {"n": n}
        group, shared = self._shared(kept, cells, columns) if spec.shape == "record" else ([], {})
        out["columns"] = {spec.fields[i].name: columns[i] for i in kept if i not in group}
        out.update(shared)
        return out

    def _shared(self, kept: list[int], cells: list[tuple[Any, ...]], columns: dict[int, Any]
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
        length = {i: _text_length(columns[i]) for i in kept}
        keys = {i: list(map(_float_key, cells[i])) if fields[i].column.kind == "float"
                else cells[i] for i in kept if fields[i].column.kind != "inline"}
        distinct = {i: len(set(column)) for i, column in keys.items()}
        group: list[int] = []
        rows = [0] * n
        cost = 0  # the text of shared and shared_row, estimated: a row number per row
        for i in sorted(distinct, key=distinct.__getitem__):  # fewest values first
            if distinct[i] > n // 4:
                break
            seen = _Numbering()
            joined = list(map(seen.__getitem__, zip(rows, keys[i])))
            m = len(seen)
            grown = n * (len(str(m)) + 1) + m * sum(length[j] // n + 1 for j in (*group, i))
            if m > n // 4 or grown - cost >= length[i]:
                continue
            group.append(i)
            rows, cost = joined, grown
        if not group:
            return [], {}
        # the first row of each combination (numbered in first-seen order)
        firsts = dict(zip(reversed(rows), range(n - 1, -1, -1)))
        combos = [firsts[combo] for combo in range(len(firsts))]
        shared = {"shared": {"n": len(combos), "columns": {
            fields[i].name: _column_json(fields[i].column.kind, [cells[i][r] for r in combos])
            for i in group}}, "shared_row": _column_json("int", rows)}
        if _text_length(shared) >= sum(length[i] for i in group):
            return [], {}
        return group, shared


_INDEX_KINDS = frozenset({"int", "str", "frame", "stack", "ref"})


def _column_json(kind: str, cells: list[Any] | tuple[Any, ...]) -> Any:
    """A column as written: a list, or for integers, ``{"runs": [first, delta, count,
    ...]}`` when that is shorter (numbers that count up by the same steps)."""
    cells = list(cells)
    if kind not in _INDEX_KINDS or len(cells) < 4 or not set(map(type, cells)) <= _INT:
        return cells
    deltas = list(map(sub, islice(cells, 1, None), cells))
    # where each run of equal deltas starts, and so how long it is
    starts = [0, *compress(range(1, len(deltas)), map(ne, islice(deltas, 1, None), deltas))]
    counts = map(sub, chain(islice(starts, 1, None), (len(deltas),)), starts)
    runs = [cells[0], *chain.from_iterable(zip(map(deltas.__getitem__, starts), counts))]
    if len(runs) > len(cells) or _text_length(runs) >= _text_length(cells):
        return cells  # runs must be shorter, and have fewer numbers to parse
    return {"runs": runs}


def _text_length(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


# ------------------------------------------------------------- reading: the context

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
            raise _Invalid(f"the threads of all samples hold more than {MAX_THREAD_FRAMES:,} "
                           "frames in all, more than hangdoc analyses")
        if self.records > MAX_RECORDS:
            raise _Invalid(f"the snapshot holds more than {MAX_RECORDS:,} records (threads, "
                           "samples, ...) counted each time they are used, more than hangdoc "
                           "analyses")

    def store(self, rows: int, items: bool = False) -> None:
        self.stored[items] += rows
        cap = MAX_TABLE_ITEMS if items else MAX_TABLE_ROWS
        if self.stored[items] > cap:
            what = "items of tuples" if items else "rows"
            raise _Invalid(f"the tables hold more than {cap:,} {what} in all, more than any "
                           "snapshot")


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
    return list(map(sum, zip(*map(w.__getitem__, positions))))


def _load_v2(data: dict[str, Any], t: _Tables) -> None:
    """Read the strings and every table of a version 2 bundle into ``t``."""
    strings = _expect_list(data.get("strings"), "strings")
    if not set(map(type, strings)) <= {str}:
        i = next(i for i, s in enumerate(strings) if type(s) is not str)
        raise _Invalid(f"expected a string, got {_kind(strings[i])}", f"strings[{i}]")
    t.strings = strings
    raw_tables = data.get("tables")
    if type(raw_tables) is not dict:
        raise _Invalid(f"expected an object, got {_kind(raw_tables)}", "tables")
    for key in _table_order():
        spec = _table_spec(key)
        raw = raw_tables.get(spec.name)
        try:
            if raw is None:  # no such records: an empty table
                t.rows[key], t.weights[key] = [], (0, 0)
                continue
            t.rows[key], records, frames = _read_table(spec, raw, t)
            t.weights[key] = records, frames
        except _Invalid as err:
            raise err.under(spec.name).under("tables") from None


def _read_table(spec: _TableSpec, raw: object, t: _Tables
                ) -> tuple[list[Any], Weights, Weights]:
    """The rows of one table, with the records and frames each row reaches."""
    if type(raw) is not dict:
        raise _Invalid(f"expected an object (a table), got {_kind(raw)}")
    n = _row_count(raw)
    t.store(n)
    if spec.shape == "seq":
        return _read_seq(spec, raw, n, t)
    columns = _member(raw, "columns", dict, {})
    cells: dict[str, Iterable[Any]] = {}
    records: Weights = 0 if spec.shape == "fixed" else 1
    frames: Weights = 0
    shared = raw.get("shared")
    if shared is not None:
        which, shared_cells, shared_records, shared_frames = _read_shared(
            spec, raw, shared, n, columns, t)
        for name, combos in shared_cells.items():  # expanded row by row as they are set
            cells[name] = map(combos.__getitem__, which)
        records = _add_weights(records, _weights_of(shared_records, which, False))
        frames = _weights_of(shared_frames, which, False)
    for f in spec.fields:
        if f.name in columns:
            try:
                values, child_records, child_frames = _read_column(f, columns[f.name], n, t)
            except _Invalid as err:
                raise err.under(f.name).under("columns") from None
            cells[f.name] = values
            records = _add_weights(records, child_records)
            frames = _add_weights(frames, child_frames)
        elif f.name not in cells and f.default is dataclasses.MISSING:
            raise _Invalid(f"missing column {f.name!r} ({spec.name})")
    if spec.shape == "fixed":
        return list(zip(*(cells[f.name] for f in spec.fields))), records, frames
    # the records themselves, a column at a time: a new object per row, then each slot set
    # by its descriptor (what the dataclass' __init__ does, without a call per row)
    rows: list[Any] = list(map(_new, repeat(spec.cls, n)))  # type: ignore[arg-type]
    for f in spec.fields:
        deque(map(f.setter, rows, cells.get(f.name) or repeat(f.default, n)), 0)
    return rows, records, frames


_new = object.__new__


def _read_shared(spec: _TableSpec, raw: dict[str, Any], shared: object, n: int,
                 columns: dict[str, Any], t: _Tables
                 ) -> tuple[Ints, dict[str, Ints], Weights, Weights]:
    """The columns stored once per distinct combination: each row's combination, the
    combinations' columns, and the records and frames each combination reaches."""
    if type(shared) is not dict:
        raise _Invalid(f"expected an object, got {_kind(shared)}", "shared")
    try:
        m = _row_count(shared)
        t.store(m)
        shared_columns = _member(shared, "columns", dict, {})
    except _Invalid as err:
        raise err.under("shared") from None
    try:
        which, _, bounds = _ints(raw.get("shared_row"), n, False, "shared row")
        _check_indices(which, m, "shared row", False, bounds)
    except _Invalid as err:
        raise err.under("shared_row") from None
    cells: dict[str, Ints] = {}
    records: Weights = 0
    frames: Weights = 0
    for f in spec.fields:
        if f.name not in shared_columns:
            continue
        if f.name in columns:
            raise _Invalid(f"column {f.name!r} is both in columns and in shared")
        try:
            values, child_records, child_frames = _read_column(f, shared_columns[f.name], m, t)
        except _Invalid as err:
            raise err.under(f.name).under("columns").under("shared") from None
        cells[f.name] = values
        records = _add_weights(records, child_records)
        frames = _add_weights(frames, child_frames)
    return which, cells, records, frames


def _read_seq(spec: _TableSpec, raw: dict[str, Any], n: int, t: _Tables
              ) -> tuple[list[Any], Weights, Weights]:
    """A table of tuples: each row's length, and the items of all rows in one column, row
    after row; or, for tuples of one length ``width``, position after position."""
    width = raw.get("width")
    if width is not None:
        if "lengths" in raw:
            raise _Invalid("a table of tuples has 'lengths' or 'width', not both")
        if type(width) is not int or not 0 <= width <= MAX_TABLE_ITEMS:
            raise _Invalid(f"expected the length of every tuple, got {_kind(width)}", "width")
        total = n * width
    else:
        try:
            lengths, _, bounds = _ints(raw.get("lengths"), n, False, "")
            _check_range(lengths, 0, MAX_TABLE_ITEMS, False, bounds=bounds)
        except _Invalid as err:
            raise err.under("lengths") from None
        total = sum(lengths)
    t.store(total, items=True)
    try:
        items, records, frames = _read_column(spec.fields[0], raw.get("items"), total, t)
    except _Invalid as err:
        raise err.under("items") from None
    if width is not None:
        if width == 0:
            return [()] * n, 0, 0
        positions = [slice(p * n, (p + 1) * n) for p in range(width)]
        return (list(zip(*map(items.__getitem__, positions))),
                _width_weights(records, positions, width), _width_weights(frames, positions, width))
    ends = list(accumulate(lengths))
    spans = list(map(slice, chain((0,), ends), ends))
    rows = list(map(tuple(items).__getitem__, spans))  # a tuple's slices are tuples
    return (rows, _tuple_weights(records, spans, lengths), _tuple_weights(frames, spans, lengths))


def _row_count(raw: dict[str, Any]) -> int:
    n = raw.get("n")
    if type(n) is not int:
        raise _Invalid(f"expected the number of rows, got {_kind(n)}", "n")
    if not 0 <= n <= MAX_TABLE_ROWS:
        raise _Invalid(f"{shown(n, 40)} rows: out of range (0 to {MAX_TABLE_ROWS})", "n")
    return n


def _member(raw: dict[str, Any], key: str, tp: type, default: Any) -> Any:
    value = raw.get(key, default)
    if type(value) is not tp:
        raise _Invalid(f"expected {'an object' if tp is dict else 'a list'}, got {_kind(value)}",
                       key)
    return value


# ------------------------------------------------------------- reading: columns

_INT = frozenset({int})
_INT_OR_NONE = frozenset({int, _NONE})
# An integer column as read: a list, or a range where runs made one (a single run that
# counts up or down, as row numbers do)
Ints = list[Any] | range


def _read_column(f: _Field, raw: object, n: int, t: _Tables
                 ) -> tuple[Ints, Weights, Weights]:
    """The ``n`` values of one column, checked a column at a time, with the records and
    frames each row reaches through it."""
    col = f.column
    kind, optional = col.kind, col.optional
    table: list[Any]
    if kind == "int":
        values, has_none, bounds = _ints(raw, n, optional, "")
        lo, hi = f.limits or _INT_RANGE
        _check_range(values, lo, hi, has_none, f.limits is None, bounds=bounds)
        return values, 0, 0
    if kind in ("float", "bool", "enum", "inline", "text"):
        raw = _expect_list(raw)
        if len(raw) != n:
            raise _Invalid(f"{len(raw):,} values for {n:,} rows")
        if kind == "text":  # a string written as itself (see _many_decoder)
            _check_types(raw, frozenset({str, _NONE} if optional else {str}), "str")
            return raw, 0, 0
        if kind == "float":
            return _floats(raw, optional), 0, 0
        if kind == "bool":
            _check_types(raw, frozenset({bool, _NONE} if optional else {bool}), "bool")
            return raw, 0, 0
        if kind == "enum":
            return _enums(raw, col.target, optional), 0, 0
        return _inline(raw, _codec(col.target, "v2")[1], t)
    if kind == "str":
        table, what = t.strings, "string"
    elif kind == "frame":
        table, what = t.frames, "frame"
    elif kind == "stack":
        table, what = t.stacks, "stack"
    else:
        table, what = t.rows[col.target], _table_name(col.target)
    idx, has_none, bounds = _ints(raw, n, optional, what)
    _check_indices(idx, len(table), what, has_none, bounds)
    values = _lookup(table, idx, has_none)
    if kind == "stack":
        return values, 0, _lookup(t.stack_lengths(), idx, has_none, 0)
    if kind != "ref":
        return values, 0, 0
    records, frames = t.weights[col.target]
    return values, _weights_of(records, idx, has_none), _weights_of(frames, idx, has_none)


def _lookup(table: list[Any], idx: Ints, has_none: bool, none: Any = None) -> list[Any]:
    if has_none:
        return [none if i is None else table[i] for i in idx]
    if type(idx) is range and idx.step > 0:  # rows in order (a tuple table's items)
        return table[idx.start:idx.stop:idx.step]
    return list(map(table.__getitem__, idx))



def _ints(raw: object, n: int, optional: bool, what: str
          ) -> tuple[Ints, bool, tuple[int, int] | None]:
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
        message = (f"{what} reference must be an integer" if what else "expected int")
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
            raise _Invalid(f"{len(runs):,} numbers, not a first value and (delta, count) "
                           f"pairs for {n:,} rows")
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


def _check_range(values: Ints, lo: int, hi: int, has_none: bool, int64: bool = False,
                 offset: int = 0, step: int = 1, bounds: tuple[int, int] | None = None) -> None:
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
    message = (f"integer {shown(v, 40)} does not fit in 64 bits" if int64
               else f"{shown(v, 40)} is out of range ({lo} to {hi})")
    raise _Invalid(message, f"[{offset + i * step}]")


def _not_none(value: object) -> bool:
    return value is not None


def _check_indices(idx: Ints, size: int, what: str, has_none: bool,
                   bounds: tuple[int, int] | None = None) -> None:
    if bounds is None:
        present = list(filter(_not_none, idx)) if has_none else idx
        if not present:
            return
        bounds = min(present), max(present)
    if 0 <= bounds[0] and bounds[1] < size:
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
        i, v = next((i, v) for i, v in enumerate(raw)
                    if type(v) not in _HASHABLE or v not in members)
        known = ", ".join(repr(m.value) for m in tp)
        raise _Invalid(f"unknown {tp.__name__} {shown(v)} (known: {known})", f"[{i}]")
    return list(map(members.__getitem__, raw))


def _inline(raw: list[Any], decode: Decoder, t: _Tables) -> tuple[list[Any], Weights, Weights]:
    """A column of values written field for field, each with what it uses of the tables."""
    values, records, frames = [], [], []
    for i, v in enumerate(raw):
        before = t.records, t.thread_frames
        try:
            values.append(decode(v, t))
        except _Invalid as err:
            raise err.under(f"[{i}]") from None
        records.append(t.records - before[0])
        frames.append(t.thread_frames - before[1])
        t.records, t.thread_frames = before
    return values, records, frames


# -------------------------------------------- the snapshot part: converters by type hints

Encoder = Callable[[Any, Any], Any]
Decoder = Callable[[Any, _Tables], Any]


@functools.cache
def _codec(tp: Any, mode: str = "v1") -> tuple[Encoder, Decoder]:
    """Encoder and decoder for values of type ``tp`` written field for field.

    ``mode`` "v1" writes ``Frame`` and stacks (``tuple[Frame, ...]``) as indices into the
    bundle's tables; "v2" also the records of ``TABLED`` types and tuples of them; "plain"
    (the frames table itself) interns nothing.
    """
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if mode != "plain" and tp is Frame:
        return (lambda v, t: t.frame_id(v)), (lambda v, t: t.frame_at(v))
    if mode != "plain" and tp == _STACK:
        return (lambda v, t: t.stack_id(v)), (lambda v, t: t.stack_at(v))
    if mode == "v2" and _tabled_key(tp):
        _table_spec(tp)
        return (lambda v, w: w.table(tp).add(v)), (lambda v, t: t.row_at(tp, v))
    if origin in (typing.Union, types.UnionType):
        return _optional_codec(tp, mode)
    if origin is tuple:
        return _tuple_codec(args, mode)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_codec(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass_codec(tp, mode)
    if tp in (str, int, float, bool):
        return _scalar_codec(tp)
    raise TypeError(f"bundle cannot convert values of type {tp!r}")


def _optional_codec(tp: Any, mode: str) -> tuple[Encoder, Decoder]:
    enc, dec = _codec(_optional_arg(tp), mode)
    return (
        lambda v, t: None if v is None else enc(v, t),
        lambda v, t: None if v is None else dec(v, t),
    )


def _tuple_codec(args: tuple[Any, ...], mode: str) -> tuple[Encoder, Decoder]:
    if len(args) == 2 and args[1] is Ellipsis:
        enc, dec = _codec(args[0], mode)

        many = _many_decoder(args[0], mode)

        def decode_seq(v: Any, t: _Tables) -> tuple[Any, ...]:
            _expect_list(v)
            if many is not None and len(v) >= 16:
                fast = many(v, t)
                if fast is not None:
                    return tuple(fast)
            out = []
            for i, item in enumerate(v):
                try:
                    out.append(dec(item, t))
                except _Invalid as err:
                    raise err.under(f"[{i}]") from None
            return tuple(out)

        return (lambda v, t: [enc(x, t) for x in v]), decode_seq

    parts = [_codec(a, mode) for a in args]

    def decode_fixed(v: Any, t: _Tables) -> tuple[Any, ...]:
        _expect_list(v)
        if len(v) != len(parts):
            raise _Invalid(f"expected a list of {len(parts)} items, got {len(v)}")
        return tuple(dec(x, t) for (_, dec), x in zip(parts, v))

    return (lambda v, t: [enc(x, t) for (enc, _), x in zip(parts, v)]), decode_fixed


@functools.cache
def _many_decoder(tp: Any, mode: str) -> Callable[[list[Any], _Tables], list[Any] | None] | None:
    """For a list of objects of the dataclass ``tp`` (a snapshot's ranks), a decoder that
    reads them a field at a time, as a table's columns, when they all have the same keys;
    None when ``tp`` is not a plain frozen slot dataclass. The decoder returns None where
    it cannot (other keys, a bad value): the object-by-object decoder then reads them and
    says what is wrong and where."""
    if not (isinstance(tp, type) and dataclasses.is_dataclass(tp)) or _tabled_key(tp):
        return None
    params = getattr(tp, "__dataclass_params__", None)
    fields = dataclasses.fields(tp)
    slots = set(getattr(tp, "__slots__", ()))
    if (params is None or not params.frozen or hasattr(tp, "__post_init__")
            or any(not f.init or f.name not in slots for f in fields)):
        return None
    hints = typing.get_type_hints(tp)
    plan: list[tuple[_Field, Decoder | None]] = []
    for f in fields:
        col = _object_column(hints[f.name], mode)
        limits = _FIELD_RANGES.get((tp, f.name))
        _, decode = _codec(hints[f.name], mode)
        inline = col.kind == "inline" or (limits is not None and col.kind != "int")
        plan.append((_Field(f.name, col, f.default, limits, tp.__dict__[f.name].__set__),
                     (_ranged(decode, *limits) if limits else decode) if inline else None))
    names = {f.name for f, _ in plan}

    def decode_many(items: list[Any], t: _Tables) -> list[Any] | None:
        if set(map(type, items)) != {dict}:
            return None
        keys = set(map(tuple, items))
        if len(keys) != 1:
            return None
        present = [k for k in next(iter(keys)) if k in names]
        columns = dict(zip(present, zip(*map(itemgetter(*present), items)) if len(present) > 1
                           else [list(map(itemgetter(*present), items))] if present else []))
        before = t.records, t.thread_frames
        n = len(items)
        try:
            values: list[Any] = []
            for f, decode in plan:
                raw = columns.get(f.name)
                if raw is None:
                    if f.default is dataclasses.MISSING:
                        raise _Invalid("a required key is missing")
                    values.append(repeat(f.default, n))
                    continue
                raw = list(raw)
                cells, records, frames = (_inline(raw, decode, t) if decode is not None
                                          else _read_column(f, raw, n, t))
                t.use(_total(records, n), _total(frames, n))
                values.append(cells)
        except _Invalid:
            t.records, t.thread_frames = before
            return None
        objects: list[Any] = list(map(_new, repeat(tp, n)))
        for (f, _), cells in zip(plan, values):
            deque(map(f.setter, objects, cells), 0)
        return objects

    return decode_many


@functools.cache
def _object_column(tp: Any, mode: str) -> _Column:
    """How ``_many_decoder`` reads a field of type ``tp`` written field for field: as a
    table's column where the value is a scalar or an index, else value by value."""
    inner = _optional_arg(tp)
    if inner is not None:
        col = _object_column(inner, mode)
        return _Column("inline", True, tp) if col.kind == "inline" else col._replace(optional=True)
    if mode != "plain" and tp is Frame:
        return _Column("frame")
    if mode != "plain" and tp == _STACK:
        return _Column("stack")
    if mode == "v2" and _tabled_key(tp):
        return _Column("ref", target=tp)
    if tp in (int, float, bool):
        return _Column(tp.__name__)
    if tp is str:
        return _Column("text")
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _Column("enum", target=tp)
    return _Column("inline", target=tp)


def _expect_list(v: Any, where: str = "") -> list[Any]:
    if type(v) is not list:
        raise _Invalid(f"expected a list, got {_kind(v)}", where)
    return v


def _enum_codec(tp: type[enum.Enum]) -> tuple[Encoder, Decoder]:
    def decode(v: Any, t: _Tables) -> enum.Enum:
        try:
            return tp(v)
        except (ValueError, TypeError):
            known = ", ".join(repr(m.value) for m in tp)
            raise _Invalid(f"unknown {tp.__name__} {shown(v)} (known: {known})") from None

    return (lambda v, t: v.value), decode


def _scalar_codec(tp: type) -> tuple[Encoder, Decoder]:
    def decode(v: Any, t: _Tables) -> Any:
        if type(v) is tp:  # exactly: a bool is not an int
            if tp is int:
                _check_int64(v)
            return v
        if tp is float and type(v) is int:
            try:
                return float(v)
            except OverflowError:
                raise _Invalid(f"the number {shown(v, 40)} is too large") from None
        raise _Invalid(f"expected {tp.__name__}, got {_kind(v)}")

    return (lambda v, t: v), decode


def _check_int64(v: Any) -> None:
    if not _INT_RANGE[0] <= v <= _INT_RANGE[1]:
        raise _Invalid(f"integer {shown(v, 40)} does not fit in 64 bits")


def _ranged(dec: Decoder, lo: int, hi: int) -> Decoder:
    """``dec``, then a check that every int in what it decoded lies in ``lo..hi``."""

    def check(value: Any) -> None:
        if type(value) is int and not lo <= value <= hi:
            raise _Invalid(f"{shown(value, 40)} is out of range ({lo} to {hi})")
        if type(value) is tuple:
            for i, item in enumerate(value):
                try:
                    check(item)
                except _Invalid as err:
                    raise err.under(f"[{i}]") from None

    def decode(v: Any, t: _Tables) -> Any:
        value = dec(v, t)
        check(value)
        return value

    return decode


def _dataclass_codec(tp: type, mode: str) -> tuple[Encoder, Decoder]:
    hints = typing.get_type_hints(tp)
    # the converter table: one (name, encoder, decoder, default) row per field
    table = []
    for f in dataclasses.fields(tp):
        if not f.init:
            continue
        enc, dec = _codec(hints[f.name], mode)
        limits = _FIELD_RANGES.get((tp, f.name))
        table.append((f.name, enc, _ranged(dec, *limits) if limits else dec, f.default))
    missing = dataclasses.MISSING

    def encode(v: Any, t: Any) -> dict[str, Any]:
        out = {}
        for name, enc, _, default in table:
            value = getattr(v, name)
            if default is missing or value != default:  # defaults are left out
                out[name] = enc(value, t)
        return out

    def decode(v: Any, t: _Tables) -> Any:
        if type(v) is not dict:
            raise _Invalid(f"expected an object ({tp.__name__}), got {_kind(v)}")
        kwargs = {}
        for name, _, dec, default in table:
            if name not in v:
                if default is missing:
                    raise _Invalid(f"missing key {name!r} ({tp.__name__})")
                continue
            try:
                kwargs[name] = dec(v[name], t)
            except _Invalid as err:
                raise err.under(name) from None
        return tp(**kwargs)

    return encode, decode


# --------------------------------------------------------------------- public API


def snapshot_to_dict(snapshot: JobSnapshot, schema_version: int = BUNDLE_SCHEMA_VERSION
                     ) -> dict[str, Any]:
    """The bundle's JSON object for ``snapshot``: version 2 (tables), or 1 (what hangdoc
    read before version 2: records field for field, frames and stacks interned)."""
    if schema_version not in (1, 2):
        raise ValueError(f"bundle schema_version is 1 or 2, not {schema_version!r}")
    mode = f"v{schema_version}"
    writer = _Writer()
    encode_snapshot, _ = _codec(JobSnapshot, mode)
    body = encode_snapshot(snapshot, writer)
    encode_frame, _ = _codec(Frame, "plain")
    out: dict[str, Any] = {"kind": KIND, "schema_version": schema_version,
                           "hangdoc_version": __version__}
    tables = writer.tables_json() if schema_version == 2 else None  # adds strings
    if tables is not None:
        out["strings"] = writer.strings
    out["frames"] = [encode_frame(f, writer) for f in writer.frames]
    out["stacks"] = [[writer.frame_id(f) for f in s] for s in writer.stacks]
    if tables is not None:
        out["tables"] = tables
    out["snapshot"] = body
    return out


def snapshot_from_dict(data: object) -> JobSnapshot:
    """The snapshot a bundle's JSON object holds; ``BundleError`` if it is not one."""
    data = _envelope(data)
    tables = _Tables()
    try:
        _load_tables(data, tables)
        mode = "v1"
        if data["schema_version"] >= 2:
            _load_v2(data, tables)
            mode = "v2"
        if "snapshot" not in data:
            raise _Invalid("missing key 'snapshot'")
        _, decode_snapshot = _codec(JobSnapshot, mode)
        try:
            return decode_snapshot(data["snapshot"], tables)
        except _Invalid as err:
            raise err.under("snapshot") from None
    except _Invalid as err:
        where = f"at {err.where}: " if err.where else ""
        raise BundleError(f"not a valid hangdoc snapshot: {where}{err.message}") from None
    except (KeyError, TypeError, ValueError, ArithmeticError) as err:  # a shape the checks missed
        raise BundleError(
            f"not a valid hangdoc snapshot: {type(err).__name__}: {one_line(str(err), 200)}"
        ) from None


def _envelope(data: object) -> dict[str, Any]:
    """``data`` itself once its kind and schema version are ones this hangdoc reads."""
    if not isinstance(data, dict):
        raise BundleError(f"not a hangdoc snapshot: the file holds {_kind(data)}, not an object")
    kind = data.get("kind")
    if kind is None and "verdict" in data and "schema_version" in data:
        raise BundleError(
            "this is a hangdoc report, not a snapshot; pass the file written by --save "
            "(in a `hangdoc watch` hang directory: snapshot.json.gz, next to report.json)"
        )
    if kind is None and type(data.get("error")) is dict and "hangdoc_version" in data:
        raise BundleError(
            "this is a hangdoc error report (the --json output of a failed run), not a "
            "snapshot; pass the file written by --save"
        )
    if kind != KIND:
        found = "no 'kind' key" if kind is None else f"kind {shown(kind)}"
        raise BundleError(f"not a hangdoc snapshot: {found}, expected kind {KIND!r}")
    version = data.get("schema_version")
    if type(version) is not int:
        raise BundleError(f"not a valid hangdoc snapshot: schema_version is {_kind(version)}")
    if version > BUNDLE_SCHEMA_VERSION:
        writer = data.get("hangdoc_version")
        writer = one_line(writer, 40) if isinstance(writer, str) and writer else "a newer hangdoc"
        raise BundleError(
            f"snapshot has schema_version {version}, written by hangdoc {writer}; this hangdoc "
            f"({__version__}) reads up to {BUNDLE_SCHEMA_VERSION}: upgrade hangdoc"
        )
    if version < 1:
        raise BundleError(f"not a valid hangdoc snapshot: unsupported schema_version {version}")
    return data


def _load_tables(data: dict[str, Any], tables: _Tables) -> None:
    _, decode_frame = _codec(Frame, "plain")
    for key in ("frames", "stacks"):
        if type(data.get(key)) is not list:
            raise _Invalid(f"expected a list, got {_kind(data.get(key))}", key)
    for i, raw in enumerate(data["frames"]):
        try:
            tables.frames.append(decode_frame(raw, tables))
        except _Invalid as err:
            raise err.under(f"frames[{i}]") from None
    for i, raw in enumerate(data["stacks"]):
        try:
            _expect_list(raw)
            if len(raw) > MAX_STACK_DEPTH:
                raise _Invalid(f"a stack of {len(raw):,} frames; hangdoc reads at most "
                               f"{MAX_STACK_DEPTH:,}")
            tables.stacks.append(tuple(_frames_of(raw, tables)))
        except _Invalid as err:
            raise err.under(f"stacks[{i}]") from None


def _frames_of(indices: list[Any], tables: _Tables) -> list[Frame]:
    frames = []
    for j, idx in enumerate(indices):
        try:
            frames.append(tables.frame_at(idx))
        except _Invalid as err:
            raise err.under(f"[{j}]") from None
    return frames


def snapshot_bytes(snapshot: JobSnapshot, compress: bool) -> bytes:
    """``snapshot`` as the bytes of a bundle file, gzip-compressed or not."""
    with collections_paused():
        data = json.dumps(snapshot_to_dict(snapshot), ensure_ascii=False, separators=(",", ":"))
    # a lone surrogate (text that was not UTF-8) is written as its JSON escape, "\\udc80",
    # which reads back as the same string
    raw = data.encode("utf-8", "backslashreplace")
    return gzip.compress(raw, compresslevel=GZIP_LEVEL, mtime=0) if compress else raw


def check_save_path(path: str | Path) -> None:
    """Refuse, before a capture, a ``--save`` path that ``save_snapshot`` would refuse."""
    try:
        check_target(path)
    except (OSError, ValueError) as err:
        raise _save_error(path, err) from None


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


def _save_error(path: str | Path, err: Exception) -> BundleError:
    message = f"cannot write snapshot to {path}: {_reason(err)}"
    if isinstance(err, Refused):
        return BundleError(message, help=err.help)
    return BundleError(message, help="Give --save a file path in an existing directory this user can write.")


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n % 2**20 == 0 else f"{n:,} bytes"


def _reason(err: Exception) -> str:
    return (err.strerror if isinstance(err, OSError) else None) or str(err)


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _read_file(path: Path) -> bytes:
    """The bytes of the regular file ``path``, at most ``MAX_FILE_BYTES`` of them.

    Opened non-blocking, so that a FIFO is refused at once instead of waiting for a writer.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError) as err:
        raise BundleError(f"cannot read snapshot {path}: {_reason(err)}") from None
    try:
        info = os.fstat(fd)
        mode = info.st_mode
        if stat.S_ISDIR(mode):
            raise BundleError(f"{path} is a directory; pass the snapshot file written by --save")
        if not stat.S_ISREG(mode):
            raise BundleError(f"{path} is {_file_kind(mode)}, not a snapshot file; pass the "
                              "file written by --save")
        too_large = BundleError(f"{path}: larger than {_size(MAX_FILE_BYTES)}, more than any "
                                "snapshot hangdoc writes")
        if info.st_size > MAX_FILE_BYTES:
            raise too_large
        raw = read_at_most(fd, MAX_FILE_BYTES)
        if raw is None:
            raise too_large
        return raw
    except OSError as err:
        raise BundleError(f"cannot read snapshot {path}: {_reason(err)}") from None
    finally:
        os.close(fd)


def _gunzip(raw: bytes, path: Path) -> bytes:
    """``raw`` (one or more gzip members) inflated, stopping past ``MAX_JSON_BYTES``."""
    chunks: list[bytes] = []
    total = 0
    data = raw
    while data:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip header and trailer
        tail = data
        try:
            while not inflater.eof and total <= MAX_JSON_BYTES:
                # max_length bounds each step's output; the input it left is unconsumed_tail
                chunk = inflater.decompress(tail, min(_READ_CHUNK, MAX_JSON_BYTES + 1 - total))
                tail = inflater.unconsumed_tail
                if not chunk and not tail:
                    break  # the input ended before the stream did
                chunks.append(chunk)
                total += len(chunk)
        except zlib.error as err:
            raise BundleError(f"{path}: corrupt or truncated gzip data ({err})") from None
        if total > MAX_JSON_BYTES:
            raise BundleError(f"{path}: the gzip data inflates to more than "
                              f"{_size(MAX_JSON_BYTES)}, more than any snapshot")
        if not inflater.eof:
            raise BundleError(f"{path}: corrupt or truncated gzip data (the stream ends early)")
        data = inflater.unused_data.lstrip(b"\0")  # zero padding after a member is allowed
        if data and not data.startswith(_GZIP_MAGIC):
            raise BundleError(f"{path}: corrupt gzip data (garbage after the compressed stream)")
    return b"".join(chunks)


def read_input(path: str | Path) -> bytes:
    """The bytes of the regular file ``path``, inflated when they are gzip data (recognised
    by their content), within the caps above: what ``load_snapshot`` reads, and what
    ``hangdoc analyze`` reads before it knows whether the file is a snapshot or a dump.

    Raises ``BundleError`` and nothing else.
    """
    path = Path(path)
    raw = _read_file(path)
    return _gunzip(raw, path) if raw.startswith(_GZIP_MAGIC) else raw


def load_snapshot(path: str | Path) -> JobSnapshot:
    """Read a bundle written by ``save_snapshot`` (gzip recognised by its content).

    Raises ``BundleError`` and nothing else, whatever the file holds.
    """
    path = Path(path)
    return snapshot_from_bytes(read_input(path), path)


def snapshot_from_bytes(raw: bytes, path: Path) -> JobSnapshot:
    """The snapshot in ``raw``, the (inflated) bytes of the file ``path``; ``BundleError``
    naming ``path`` when they are not one."""
    if not raw.strip():
        raise BundleError(f"{path}: the file is empty, not a hangdoc snapshot")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BundleError(
            f"{path}: not a hangdoc snapshot (binary data, not UTF-8 JSON: byte "
            f"0x{raw[err.start]:02x} at offset {err.start})"
        ) from None
    del raw
    with collections_paused():
        data = _json(text, path)
        del text  # the parsed values are all that is needed now
        try:
            return snapshot_from_dict(data)
        except BundleError as err:
            raise BundleError(f"{path}: {err}") from None
        except RecursionError:  # deep nesting the JSON parser took, where the decoder walks
            raise BundleError(f"{path}: not a hangdoc snapshot (JSON nested too deeply)") from None


def _json(text: str, path: Path) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        truncated = " (truncated?)" if err.pos >= len(text.rstrip()) else ""
        raise BundleError(
            f"{path}: not valid JSON{truncated}: {err.msg} at line {err.lineno} column {err.colno}"
        ) from None
    except RecursionError:
        raise BundleError(f"{path}: not a hangdoc snapshot (JSON nested too deeply)") from None
    except ValueError as err:  # an integer of more than 4300 digits
        raise BundleError(f"{path}: not valid JSON: {one_line(str(err), 200)}") from None
