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
file raises ``BundleError`` with one line that says what is wrong and where, and nothing
else: only regular files are opened (never blocking on a FIFO or reading ``/dev/zero``),
the file and its decompressed text are read up to a cap, and integers are checked against
the ranges below (a bool is not an int), so that no file can make the analysis allocate
without bound (``world_size: 2e9`` would ask for two billion expected ranks).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import SCHEMA_VERSION, __version__
from .errors import BundleError, one_line, shown
from .model import (
    MAX_WORLD_SIZE,
    PID_MAX,
    Frame,
    FrameLocals,
    GpuState,
    Heartbeat,
    JobSnapshot,
    ProcessState,
    RankProcess,
    RasCommunicator,
    RasRank,
    ThreadCounters,
    Unreachable,
)

KIND = "hangdoc-snapshot"
_GZIP_MAGIC = b"\x1f\x8b"

# Size caps. A real capture is about 1.7 kB per rank for 5 samples of 2 threads (1.7 MB for
# 1000 ranks) before gzip, which shrinks it about 20x; the caps leave room for 100x that and
# keep a corrupt or hostile file from filling the memory: a plain file is read up to
# MAX_FILE_BYTES, and gzip data is inflated incrementally, stopping once the text passes
# MAX_JSON_BYTES (a 1 MB gzip "bomb" of zeros would otherwise inflate to 1 GB).
MAX_FILE_BYTES = 512 * 2**20
MAX_JSON_BYTES = 512 * 2**20
_READ_CHUNK = 4 * 2**20

# Integer ranges (inclusive); model.MAX_WORLD_SIZE bounds ranks and world sizes.
# Stacks are interned, so a small file can make thousands of threads share one deep stack;
# the analysis walks every thread's frames (about 2 us each), so the frames of all threads
# of all samples together are capped: 50 million is about 90 s of analysis, and 5 times a
# 10000-rank capture (5 samples, 2 threads, 100 frames deep). One stack holds at most
# MAX_STACK_DEPTH frames, far past Python's recursion limit (1000 by default).
MAX_STACK_DEPTH = 100_000
MAX_THREAD_FRAMES = 50_000_000
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


class _Tables(StackTable):
    """The interned frames and stacks of one bundle being written or read."""

    def __init__(self) -> None:
        super().__init__()
        self.thread_frames = 0  # frames of every stack reference decoded so far

    def frame_at(self, idx: object) -> Frame:
        return self.frames[_index(idx, len(self.frames), "frame")]

    def stack_at(self, idx: object) -> tuple[Frame, ...]:
        stack = self.stacks[_index(idx, len(self.stacks), "stack")]
        self.thread_frames += len(stack)
        if self.thread_frames > MAX_THREAD_FRAMES:
            raise _Invalid(f"the threads of all samples hold more than {MAX_THREAD_FRAMES:,} "
                           "frames in all, more than hangdoc analyses")
        return stack


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


def _dataclass_codec(tp: type, interned: bool) -> tuple[Encoder, Decoder]:
    hints = typing.get_type_hints(tp)
    # the converter table: one (name, encoder, decoder, default) row per field
    table = []
    for f in dataclasses.fields(tp):
        if not f.init:
            continue
        enc, dec = _codec(hints[f.name], interned)
        limits = _FIELD_RANGES.get((tp, f.name))
        table.append((f.name, enc, _ranged(dec, *limits) if limits else dec, f.default))
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
    if version > SCHEMA_VERSION:
        writer = data.get("hangdoc_version")
        writer = one_line(writer, 40) if isinstance(writer, str) and writer else "a newer hangdoc"
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
    data = json.dumps(snapshot_to_dict(snapshot), ensure_ascii=False, separators=(",", ":"))
    # a lone surrogate (text that was not UTF-8) is written as its JSON escape, "\\udc80",
    # which reads back as the same string
    raw = data.encode("utf-8", "backslashreplace")
    return gzip.compress(raw, mtime=0) if compress else raw


def save_snapshot(snapshot: JobSnapshot, path: str | Path) -> None:
    """Write ``snapshot`` to ``path`` as a bundle (gzip when the name ends in ``.gz``)."""
    path = Path(path)
    raw = snapshot_bytes(snapshot, compress=path.name.endswith(".gz"))
    try:
        path.write_bytes(raw)
    except (OSError, ValueError) as err:  # ValueError: a NUL in the path
        raise BundleError(f"cannot write snapshot to {path}: {_reason(err)}") from None


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
        chunks, total = [], 0  # st_size can lie (files in /proc say 0): count as well
        while chunk := os.read(fd, min(_READ_CHUNK, MAX_FILE_BYTES + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > MAX_FILE_BYTES:
                raise too_large
        return b"".join(chunks)
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
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        truncated = " (truncated?)" if err.pos >= len(text.rstrip()) else ""
        raise BundleError(
            f"{path}: not valid JSON{truncated}: {err.msg} at line {err.lineno} column {err.colno}"
        ) from None
    except RecursionError:
        raise BundleError(f"{path}: not a hangdoc snapshot (JSON nested too deeply)") from None
    except ValueError as err:  # an integer of more than 4300 digits
        raise BundleError(f"{path}: not valid JSON: {one_line(str(err), 200)}") from None
    try:
        return snapshot_from_dict(data)
    except BundleError as err:
        raise BundleError(f"{path}: {err}") from None
    except RecursionError:  # deep nesting the JSON parser took, in a place the decoder walks
        raise BundleError(f"{path}: not a hangdoc snapshot (JSON nested too deeply)") from None
