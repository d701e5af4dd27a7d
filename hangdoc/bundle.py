"""Save a ``JobSnapshot`` to a file and read it back (``diagnose --save``, ``analyze``).

A bundle is one JSON object (gzip-compressed when the path ends in ``.gz``)::

    {"kind": "hangdoc-snapshot", "schema_version": 1, "hangdoc_version": "0.1.0",
     "frames": [{"function": ..., "filename": ..., "line": ..., "native": ..., "code": ...}],
     "stacks": [[0, 1, 2], ...],
     "snapshot": {"spec": ..., "ranks": [...], ...}}

Frames and stacks are interned: every distinct frame is stored once in ``frames``, every
distinct stack once in ``stacks`` as a list of frame indices, and a thread's ``frames``
field holds a stack index. A thousand ranks blocked in the same place cost one stack.
A field equal to its dataclass default is left out of its object.

The conversion is driven by the model's type hints, not written field by field: each
dataclass gets a table of per-field converters compiled once from its annotations, so a
field added to ``model.py`` is saved and loaded without touching this file. Reading a bad
file raises ``BundleError`` with one line that says what is wrong and where.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import gzip
import json
import types
import typing
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import SCHEMA_VERSION, __version__
from .errors import BundleError
from .model import Frame, JobSnapshot

KIND = "hangdoc-snapshot"
_GZIP_MAGIC = b"\x1f\x8b"


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


class _Tables:
    """The interned frames and stacks of one bundle being written or read."""

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

    def frame_at(self, idx: object) -> Frame:
        return self.frames[_index(idx, len(self.frames), "frame")]

    def stack_at(self, idx: object) -> tuple[Frame, ...]:
        return self.stacks[_index(idx, len(self.stacks), "stack")]


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
        return f"the number {value!r}"
    return names.get(type(value), type(value).__name__)


# ------------------------------------------------------------- converter compilation

Encoder = Callable[[Any, _Tables], Any]
Decoder = Callable[[Any, _Tables], Any]


@functools.cache
def _codec(tp: Any, interned: bool = True) -> tuple[Encoder, Decoder]:
    """Encoder and decoder for values of type ``tp``.

    With ``interned``, ``Frame`` and stacks (``tuple[Frame, ...]``) are written as
    indices into the bundle's tables; the tables themselves use ``interned=False``.
    """
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if interned and tp is Frame:
        return (lambda v, t: t.frame_id(v)), (lambda v, t: t.frame_at(v))
    if interned and origin is tuple and args == (Frame, ...):
        return (lambda v, t: t.stack_id(v)), (lambda v, t: t.stack_at(v))
    if origin in (typing.Union, types.UnionType):
        return _optional_codec(tp, args, interned)
    if origin is tuple:
        return _tuple_codec(args, interned)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_codec(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass_codec(tp, interned)
    if tp in (str, int, float, bool):
        return _scalar_codec(tp)
    raise TypeError(f"bundle cannot convert values of type {tp!r}")


def _optional_codec(tp: Any, args: tuple[Any, ...], interned: bool) -> tuple[Encoder, Decoder]:
    inner = [a for a in args if a is not type(None)]
    if len(inner) != 1 or len(args) != 2:
        raise TypeError(f"bundle supports only `X | None` unions, not {tp!r}")
    enc, dec = _codec(inner[0], interned)
    return (
        lambda v, t: None if v is None else enc(v, t),
        lambda v, t: None if v is None else dec(v, t),
    )


def _tuple_codec(args: tuple[Any, ...], interned: bool) -> tuple[Encoder, Decoder]:
    if len(args) == 2 and args[1] is Ellipsis:
        enc, dec = _codec(args[0], interned)

        def decode_seq(v: Any, t: _Tables) -> tuple[Any, ...]:
            _expect_list(v)
            out = []
            for i, item in enumerate(v):
                try:
                    out.append(dec(item, t))
                except _Invalid as err:
                    raise err.under(f"[{i}]") from None
            return tuple(out)

        return (lambda v, t: [enc(x, t) for x in v]), decode_seq

    parts = [_codec(a, interned) for a in args]

    def decode_fixed(v: Any, t: _Tables) -> tuple[Any, ...]:
        _expect_list(v)
        if len(v) != len(parts):
            raise _Invalid(f"expected a list of {len(parts)} items, got {len(v)}")
        return tuple(dec(x, t) for (_, dec), x in zip(parts, v))

    return (lambda v, t: [enc(x, t) for (enc, _), x in zip(parts, v)]), decode_fixed


def _expect_list(v: Any) -> None:
    if type(v) is not list:
        raise _Invalid(f"expected a list, got {_kind(v)}")


def _enum_codec(tp: type[enum.Enum]) -> tuple[Encoder, Decoder]:
    def decode(v: Any, t: _Tables) -> enum.Enum:
        try:
            return tp(v)
        except ValueError:
            known = ", ".join(repr(m.value) for m in tp)
            raise _Invalid(f"unknown {tp.__name__} {v!r} (known: {known})") from None

    return (lambda v, t: v.value), decode


def _scalar_codec(tp: type) -> tuple[Encoder, Decoder]:
    def decode(v: Any, t: _Tables) -> Any:
        if type(v) is tp:
            return v
        if tp is float and type(v) is int:
            return float(v)
        raise _Invalid(f"expected {tp.__name__}, got {_kind(v)}")

    return (lambda v, t: v), decode


def _dataclass_codec(tp: type, interned: bool) -> tuple[Encoder, Decoder]:
    hints = typing.get_type_hints(tp)
    # the converter table: one (name, encoder, decoder, default) row per field
    table = [
        (f.name, *_codec(hints[f.name], interned), f.default)
        for f in dataclasses.fields(tp)
        if f.init
    ]
    missing = dataclasses.MISSING

    def encode(v: Any, t: _Tables) -> dict[str, Any]:
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


def snapshot_to_dict(snapshot: JobSnapshot) -> dict[str, Any]:
    """The bundle's JSON object for ``snapshot`` (frames and stacks interned)."""
    tables = _Tables()
    encode_snapshot, _ = _codec(JobSnapshot)
    body = encode_snapshot(snapshot, tables)
    encode_frame, _ = _codec(Frame, interned=False)
    return {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "hangdoc_version": __version__,
        "frames": [encode_frame(f, tables) for f in tables.frames],
        "stacks": [[tables.frame_id(f) for f in s] for s in tables.stacks],
        "snapshot": body,
    }


def snapshot_from_dict(data: object) -> JobSnapshot:
    """The snapshot a bundle's JSON object holds; ``BundleError`` if it is not one."""
    data = _envelope(data)
    tables = _Tables()
    try:
        _load_tables(data, tables)
        if "snapshot" not in data:
            raise _Invalid("missing key 'snapshot'")
        _, decode_snapshot = _codec(JobSnapshot)
        try:
            return decode_snapshot(data["snapshot"], tables)
        except _Invalid as err:
            raise err.under("snapshot") from None
    except _Invalid as err:
        where = f"at {err.where}: " if err.where else ""
        raise BundleError(f"not a valid hangdoc snapshot: {where}{err.message}") from None
    except (KeyError, TypeError, ValueError) as err:  # a shape the checks above missed
        raise BundleError(f"not a valid hangdoc snapshot: {type(err).__name__}: {err}") from None


def _envelope(data: object) -> dict[str, Any]:
    """``data`` itself once its kind and schema version are ones this hangdoc reads."""
    if not isinstance(data, dict):
        raise BundleError(f"not a hangdoc snapshot: the file holds {_kind(data)}, not an object")
    kind = data.get("kind")
    if kind != KIND:
        found = "no 'kind' key" if kind is None else f"kind {kind!r}"
        raise BundleError(f"not a hangdoc snapshot: {found}, expected kind {KIND!r}")
    version = data.get("schema_version")
    if type(version) is not int:
        raise BundleError(f"not a valid hangdoc snapshot: schema_version is {_kind(version)}")
    if version > SCHEMA_VERSION:
        writer = data.get("hangdoc_version") or "a newer hangdoc"
        raise BundleError(
            f"snapshot has schema_version {version}, written by hangdoc {writer}; this hangdoc "
            f"({__version__}) reads up to {SCHEMA_VERSION}: upgrade hangdoc"
        )
    if version < 1:
        raise BundleError(f"not a valid hangdoc snapshot: unsupported schema_version {version}")
    return data


def _load_tables(data: dict[str, Any], tables: _Tables) -> None:
    _, decode_frame = _codec(Frame, interned=False)
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


def save_snapshot(snapshot: JobSnapshot, path: str | Path) -> None:
    """Write ``snapshot`` to ``path`` as a bundle (gzip when the name ends in ``.gz``)."""
    path = Path(path)
    data = json.dumps(snapshot_to_dict(snapshot), ensure_ascii=False, separators=(",", ":"))
    raw = data.encode("utf-8")
    if path.name.endswith(".gz"):
        raw = gzip.compress(raw, mtime=0)
    try:
        path.write_bytes(raw)
    except OSError as err:
        raise BundleError(f"cannot write snapshot to {path}: {err.strerror or err}") from None


def load_snapshot(path: str | Path) -> JobSnapshot:
    """Read a bundle written by ``save_snapshot`` (gzip recognised by its content)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise BundleError(f"cannot read snapshot {path}: {err.strerror or err}") from None
    if raw.startswith(_GZIP_MAGIC):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise BundleError(f"{path}: corrupt or truncated gzip data ({err})") from None
    if not raw.strip():
        raise BundleError(f"{path}: the file is empty, not a hangdoc snapshot")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise BundleError(f"{path}: not a hangdoc snapshot (binary data, not JSON)") from None
    except json.JSONDecodeError as err:
        truncated = " (truncated?)" if err.pos >= len(raw.rstrip()) else ""
        raise BundleError(
            f"{path}: not valid JSON{truncated}: {err.msg} at line {err.lineno} column {err.colno}"
        ) from None
    except RecursionError:
        raise BundleError(f"{path}: not a hangdoc snapshot (JSON nested too deeply)") from None
    try:
        return snapshot_from_dict(data)
    except BundleError as err:
        raise BundleError(f"{path}: {err}") from None
