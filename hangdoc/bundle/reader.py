"""Reading a bundle: ``load_snapshot`` and ``snapshot_from_bytes`` (the file's bytes, read
by ``files``, parsed), and ``snapshot_from_dict``: the envelope, then the frames and
stacks, the tables of version 2, and the ``snapshot`` part last. A version 1 bundle is read
a rank at a time (``first``), and whole, as here, only where that reader does not take it
(so its errors are this reader's). Raises ``BundleError`` and nothing else.
"""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from collections.abc import Iterable
from itertools import accumulate, chain, repeat
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import BundleError, one_line, shown
from ..memo import collections_paused
from ..model import Frame, JobSnapshot
from .codec import _codec, _read_column
from .columns import Ints, _check_indices, _check_range, _ints
from .files import read_input
from .first import read_first_format
from .invalid import _expect_list, _Invalid, _kind
from .layout import BUNDLE_SCHEMA_VERSION, KIND, _table_order, _table_spec, _TableSpec
from .limits import MAX_STACK_DEPTH, MAX_TABLE_ITEMS, MAX_TABLE_ROWS
from .tables import (
    Weights,
    _add_weights,
    _new,
    _Tables,
    _tuple_weights,
    _weights_of,
    _width_weights,
)


def _load_v2(data: dict[str, Any], t: _Tables, consume: bool = False) -> None:
    """Read the strings and every table of a version 2 bundle into ``t``; ``consume``:
    take each table out of ``data`` as it is read, so that its parsed columns go once its
    rows are made (the synthetic 1M-rank bundle: 3.61 -> 3.13 GiB at the peak of loading)."""
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
        raw = raw_tables.pop(spec.name, None) if consume else raw_tables.get(spec.name)
        try:
            if raw is None:  # no such records: an empty table
                t.rows[key], t.weights[key] = [], (0, 0)
                continue
            t.rows[key], records, frames = _read_table(spec, raw, t)
            t.weights[key] = records, frames
        except _Invalid as err:
            raise err.under(spec.name).under("tables") from None


def _read_table(spec: _TableSpec, raw: object, t: _Tables) -> tuple[list[Any], Weights, Weights]:
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
        which, shared_cells, shared_records, shared_frames = _read_shared(spec, raw, shared, n, columns, t)
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
        return list(zip(*(cells[f.name] for f in spec.fields), strict=False)), records, frames
    # the records themselves, a column at a time: a new object per row, then each slot set
    # by its descriptor (what the dataclass' __init__ does, without a call per row)
    rows: list[Any] = list(map(_new, repeat(spec.cls, n)))  # type: ignore[arg-type]
    for f in spec.fields:
        deque(map(f.setter, rows, cells.get(f.name) or repeat(f.default, n)), 0)
    return rows, records, frames


def _read_shared(
    spec: _TableSpec, raw: dict[str, Any], shared: object, n: int, columns: dict[str, Any], t: _Tables
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


def _read_seq(spec: _TableSpec, raw: dict[str, Any], n: int, t: _Tables) -> tuple[list[Any], Weights, Weights]:
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
        return (
            list(zip(*map(items.__getitem__, positions), strict=False)),
            _width_weights(records, positions, width),
            _width_weights(frames, positions, width),
        )
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
        raise _Invalid(f"expected {'an object' if tp is dict else 'a list'}, got {_kind(value)}", key)
    return value


def snapshot_from_dict(data: object) -> JobSnapshot:
    """The snapshot a bundle's JSON object holds; ``BundleError`` if it is not one."""
    return _snapshot_of(data)


def _snapshot_of(data: object, consume: bool = False) -> JobSnapshot:
    """``snapshot_from_dict``; ``consume``: ``data``, parsed for this read alone, is taken
    apart as it is read (``_load_v2``)."""
    data = _envelope(data)
    tables = _Tables()
    try:
        _load_tables(data, tables)
        mode = "v1"
        if data["schema_version"] >= 2:
            _load_v2(data, tables, consume)
            mode = "v2"
        if "snapshot" not in data:
            raise _Invalid("missing key 'snapshot'")
        _, decode_snapshot = _codec(JobSnapshot, mode)
        try:
            snapshot: JobSnapshot = decode_snapshot(data["snapshot"], tables)
        except _Invalid as err:
            raise err.under("snapshot") from None
        return snapshot
    except _Invalid as err:
        where = f"at {err.where}: " if err.where else ""
        raise BundleError(f"not a valid hangdoc snapshot: {where}{err.message}") from None
    except (KeyError, TypeError, ValueError, ArithmeticError) as err:  # a shape the checks missed
        raise BundleError(f"not a valid hangdoc snapshot: {type(err).__name__}: {one_line(str(err), 200)}") from None


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
                raise _Invalid(f"a stack of {len(raw):,} frames; hangdoc reads at most {MAX_STACK_DEPTH:,}")
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


def load_snapshot(path: str | Path) -> JobSnapshot:
    """Read a bundle written by ``save_snapshot`` (gzip recognised by its content).

    Raises ``BundleError`` and nothing else, whatever the file holds.
    """
    path = Path(path)
    return snapshot_from_bytes(read_input(path), path)


def snapshot_from_bytes(raw: bytes, path: Path) -> JobSnapshot:
    """The snapshot in ``raw``, the (inflated) bytes of the file ``path``; ``BundleError``
    naming ``path`` when they are not one."""
    if not raw or raw.isspace():  # (raw.strip() would copy the whole file)
        raise BundleError(f"{path}: the file is empty, not a hangdoc snapshot")
    with collections_paused():
        snapshot = read_first_format(raw, _load_tables)
    if snapshot is not None:
        return snapshot
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
            return _snapshot_of(data, consume=True)
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
