"""A record table's ``add``, compiled for its fields (and a table of fixed-length tuples').

Saving a 100k-rank snapshot adds 3.8 million records, most of them threads (24 a rank).
Written as a loop over the fields, adding one took 1.4 µs: a list of the fields, a call
for each cell's encoder, another for a stack's lookup by identity. Compiled, the cells are
one tuple expression, and the encoders that are lookups (a stack or a tuple by identity,
an enum's value) are written in place.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from operator import attrgetter
from typing import Any, Protocol

from .layout import _Column, _TableSpec


class _Table(Protocol):
    """What a compiled ``add`` uses of the table it adds to (``writer._TableWriter``)."""

    spec: _TableSpec
    writer: Any
    add: Callable[[Any], int]
    _index: dict[Any, int]
    _by_id: dict[int, int]
    _encoders: list[Callable[[Any], Any] | None]

    def _add_by_id(self, value: Any) -> int: ...

    def _new_row(self, key: Any, cells: tuple[Any, ...], parts: tuple[Any, ...]) -> int: ...


def _inline_key(cell: Any) -> Any:
    """A cell written field for field, as a dict key: a list or object as its text."""
    return json.dumps(cell, sort_keys=True) if type(cell) in (list, dict) else cell


def _cell(i: int, col: _Column, table: _Table, names: dict[str, Any]) -> str:
    """The expression for cell ``i`` from the field's value ``x{i}``."""
    x = f"x{i}"
    kind = col.kind
    if kind in ("int", "float", "bool"):
        return x
    if kind == "enum":
        expr = f"{x}.value"
    elif kind == "str":
        names[f"string{i}"] = table.writer.string_id
        expr = f"string{i}({x})"
    elif kind == "stack":
        # StackTable.stack_id's lookup by identity, in place; a miss calls it
        names[f"stacks{i}"] = table.writer._stack_ids.get
        names[f"stack_id{i}"] = table.writer.stack_id
        expr = f"(h[1] if (h := stacks{i}(id({x}))) is not None else stack_id{i}({x}))"
    elif kind == "ref":
        target = table.writer.table(col.target)
        names[f"add{i}"] = target.add
        expr = f"add{i}({x})"
        if target.add == target._add_by_id:  # a tuple table's lookup by identity, in place
            names[f"rows{i}"] = target._by_id.get
            expr = f"(h if (h := rows{i}(id({x}))) is not None else add{i}({x}))"
    else:
        encoder = table._encoders[i]
        names[f"enc{i}"] = encoder
        return f"enc{i}({x})"  # an inline encoder handles None itself; others as below
    return f"(None if {x} is None else {expr})" if col.optional else expr


def _record_adder(table: _Table) -> Callable[[Any], int]:
    """``table.add`` for a record table: the number of the row a value is, a new row if no
    row holds the same (``_TableWriter._new_row``)."""
    spec = table.spec
    fields = spec.fields
    names: dict[str, Any] = {
        "get": _getter(spec),
        "index": table._index.get,
        "new_row": table._new_row,
        "inline_key": _inline_key,
    }
    xs = ", ".join(f"x{i}" for i in range(len(fields)))
    cells = [_cell(i, f.column, table, names) for i, f in enumerate(fields)]
    keys = []
    for i, f in enumerate(fields):
        if f.column.kind == "float":  # by its exact bits: -0.0 is not 0.0
            keys.append(f"(c{i}.hex() if type(c{i}) is float else c{i})")
        elif f.column.kind == "inline":
            keys.append(f"inline_key(c{i})")
        else:
            keys.append(f"c{i}")
    cs = ", ".join(f"c{i}" for i in range(len(fields)))
    source = "\n".join(
        [
            "def add(value):",
            "    parts = get(value)",
            f"    {xs}, = parts",
            *(f"    c{i} = {cell}" for i, cell in enumerate(cells)),
            f"    cells = ({cs},)",
            f"    key = ({', '.join(keys)},)" if keys != [f"c{i}" for i in range(len(fields))] else "    key = cells",
            "    idx = index(key)",
            "    if idx is None:",
            "        idx = new_row(key, cells, parts)",
            "    return idx",
        ]
    )
    exec(compile(source, f"<bundle add {spec.name}>", "exec"), names)  # noqa: S102 - our own source
    add: Callable[[Any], int] = names.pop("add")  # its globals, which need not hold it back
    return add


def _getter(spec: _TableSpec) -> Callable[[Any], tuple[Any, ...]]:
    """A record's fields as a tuple, in the table's order; a tuple of fixed length itself."""
    if spec.cls is None:
        size = len(spec.fields)

        def fixed(value: Any) -> tuple[Any, ...]:
            if type(value) is not tuple or len(value) != size:
                raise TypeError(f"bundle: {value!r} is not a {spec.name}")
            return value

        return fixed
    names = [f.name for f in spec.fields]
    if len(names) == 1:
        only = names[0]
        return lambda value: (getattr(value, only),)
    return attrgetter(*names)
