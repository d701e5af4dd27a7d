"""What a bundle file is: its kind and version, and the layout of its tables.

A table's layout (``_TableSpec``: its shape, and a ``_Field`` for each column) is compiled
once from the model's type hints; ``_table_order`` lists every table a bundle can hold,
each after the tables its columns refer to.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Iterator
from typing import Any, NamedTuple

from ..model import (
    CaptureError,
    Frame,
    FrameLocals,
    JobSnapshot,
    ProcessState,
    RankProcess,
    Sample,
    Stack,
    ThreadCounters,
    ThreadStack,
    ThreadWait,
)
from .limits import _FIELD_RANGES

KIND = "hangdoc-snapshot"
# The version of the bundle layout: its own number, not ``hangdoc.SCHEMA_VERSION`` (the JSON
# report's and the agent API's), which did not change when bundles became tables.
BUNDLE_SCHEMA_VERSION = 2

# The record types a version 2 bundle stores in tables: those a job has one of per rank,
# per sample or per thread. Each must be a frozen dataclass with slots and no
# ``__post_init__`` (``_table_spec`` checks): its rows are built with its slot setters.
TABLED: tuple[type, ...] = (
    RankProcess,
    Sample,
    ProcessState,
    ThreadCounters,
    ThreadStack,
    FrameLocals,
    CaptureError,
    ThreadWait,
)

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
    return typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis and args[0] in TABLED


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
        if (
            params is None
            or not params.frozen
            or hasattr(key, "__post_init__")
            or any(not f.init or f.name not in slots for f in fields)
        ):
            raise TypeError(
                f"bundle tables need frozen slot dataclasses without __post_init__, and {key.__name__} is not one"
            )
        hints = typing.get_type_hints(key)
        return _TableSpec(
            key,
            name,
            "record",
            tuple(
                _Field(
                    f.name,
                    _column(hints[f.name]),
                    f.default,
                    _FIELD_RANGES.get((key, f.name)),
                    key.__dict__[f.name].__set__,
                )
                for f in fields
            ),
            key,
        )
    args = typing.get_args(key)
    if typing.get_origin(key) is not tuple or not args or args == ((),):
        raise TypeError(f"bundle cannot store values of type {key!r} in a table")
    if len(args) == 2 and args[1] is Ellipsis:
        return _TableSpec(key, name, "seq", (_Field("items", _column(args[0]), dataclasses.MISSING, None, None),), None)
    return _TableSpec(
        key,
        name,
        "fixed",
        tuple(_Field(str(i), _column(a), dataclasses.MISSING, None, None) for i, a in enumerate(args)),
        None,
    )


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
