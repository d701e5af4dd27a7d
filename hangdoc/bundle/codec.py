"""Converters compiled from the model's type hints.

A codec (an encoder and a decoder) for the values written field for field: the
``snapshot`` part of a bundle, and all of version 1. And ``_read_column``, one table column
of any kind read and checked. The two use each other (a column of objects is decoded by
their codec; a long list of objects is read a field at a time, as columns), so they share
this file.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections import deque
from collections.abc import Callable
from itertools import repeat
from operator import itemgetter
from typing import Any

from ..errors import shown
from ..model import Frame, Note, NoteKind
from .columns import (
    _NONE,
    Ints,
    _check_indices,
    _check_range,
    _check_types,
    _enums,
    _floats,
    _ints,
    _lookup,
)
from .invalid import _expect_list, _Invalid, _kind
from .layout import _STACK, _Column, _Field, _optional_arg, _table_name, _table_spec, _tabled_key
from .limits import _FIELD_RANGES, _INT_RANGE
from .tables import Weights, _new, _Tables, _total, _weights_of

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
    if tp is Note:
        return _note_codec(mode)
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


def _note_codec(mode: str) -> tuple[Encoder, Decoder]:
    """A note with nothing but words is written as its words, as every bundle before notes
    were values wrote every note (and such bundles still load); others as objects."""
    encode_fields, decode_fields = _dataclass_codec(Note, mode)

    def encode(v: Note, t: Any) -> Any:
        plain = v.kind is NoteKind.OTHER and not (v.node or v.pids or v.listed)
        return v.text if plain else encode_fields(v, t)

    def decode(v: Any, t: _Tables) -> Note:
        if type(v) is str:
            return Note(v)
        if type(v) is dict and type(v.get("kind")) is str:
            v = {**v, "kind": NoteKind.read(v["kind"]).value}
        note: Note = decode_fields(v, t)
        return note

    return encode, decode


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
        return tuple(dec(x, t) for (_, dec), x in zip(parts, v, strict=False))

    return (lambda v, t: [enc(x, t) for (enc, _), x in zip(parts, v, strict=False)]), decode_fixed


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
    if (
        params is None
        or not params.frozen
        or hasattr(tp, "__post_init__")
        or any(not f.init or f.name not in slots for f in fields)
    ):
        return None
    hints = typing.get_type_hints(tp)
    plan: list[tuple[_Field, Decoder | None]] = []
    for f in fields:
        col = _object_column(hints[f.name], mode)
        limits = _FIELD_RANGES.get((tp, f.name))
        _, decode = _codec(hints[f.name], mode)
        inline = col.kind == "inline" or (limits is not None and col.kind != "int")
        plan.append(
            (
                _Field(f.name, col, f.default, limits, tp.__dict__[f.name].__set__),
                (_ranged(decode, *limits) if limits else decode) if inline else None,
            )
        )
    names = {f.name for f, _ in plan}

    def decode_many(items: list[Any], t: _Tables) -> list[Any] | None:
        if set(map(type, items)) != {dict}:
            return None
        keys = set(map(tuple, items))
        if len(keys) != 1:
            return None
        present = [k for k in next(iter(keys)) if k in names]
        columns = dict(
            zip(
                present,
                zip(*map(itemgetter(*present), items), strict=False)
                if len(present) > 1
                else [list(map(itemgetter(*present), items))]
                if present
                else [],
                strict=False,
            )
        )
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
                cells, records, frames = _inline(raw, decode, t) if decode is not None else _read_column(f, raw, n, t)
                t.use(_total(records, n), _total(frames, n))
                values.append(cells)
        except _Invalid:
            t.records, t.thread_frames = before
            return None
        objects: list[Any] = list(map(_new, repeat(tp, n)))
        for (f, _), cells in zip(plan, values, strict=False):
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


# --------------------------------------------------------------- reading: one column


def _read_column(f: _Field, raw: object, n: int, t: _Tables) -> tuple[Ints, Weights, Weights]:
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
