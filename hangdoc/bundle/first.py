"""Reading a bundle of the first format (schema_version 1) a rank at a time.

A first-format bundle writes every record field for field: 3.4 kB of JSON a rank, 374 MB
for 100,000 ranks, whose parse into dicts alone takes 2.3 GB. ``read_first_format`` walks
the text instead: the envelope, frames and stacks whole, then the snapshot's lists of
ranks one element at a time (``json``'s own scanner on each), each rank decoded into the
model at once and its dicts dropped. The text is decoded from the file's bytes a chunk at
a time, so no copy of the whole text is made either.

Equal records are one object, as the second format's tables make them: environment
pairs, command lines, environments, process states and capture errors across the job.
Threads, counters, waits and samples hold a rank's process or thread ids, so they can be
equal only within one rank: a thread written alike in a rank's samples is decoded once and
is one object, and a rank whose samples show the same threads holds one tuple of them, on
which the analysis keys its work (``analysis.views``); what was met of a rank is forgotten
after it. On the synthetic jobs the sharing is the second format's, count for count.

This reader checks what the whole-text reader checks, with the same decoders' rules, but
says nothing: on anything unexpected (a malformed value, keys in another order, a cap
passed) it answers None, and the whole text is read as before, whose errors say exactly
what is wrong and where. Imports only ``codec``, ``invalid``, ``layout``, ``limits`` and
``tables`` of this package.

What is left of the time: at 100,000 ranks of the synthetic job, inflating the text takes
6 us a rank, decoding its UTF-8 and scanning it with ``json``'s scanner 23 us, and decoding
the scanned values into the model 34 us (a dict lookup and a check a value, where the second
format's tables are read a column at a time: about 15 us a rank in all). So ``hangdoc
analyze`` says when converting pays (``NOTICE_RANKS``).
"""

from __future__ import annotations

import codecs
import dataclasses
import enum
import json
import json.scanner
import os
import re
import stat
import typing
import zlib
from collections.abc import Callable
from itertools import chain, repeat
from pathlib import Path
from typing import Any

from ..model import (
    Frame,
    JobSnapshot,
    Note,
    RankProcess,
    RankSnapshot,
    Sample,
    Stack,
    ThreadCounters,
    ThreadStack,
    ThreadWait,
)
from ..safefiles import open_to_read
from .codec import _codec, _ranged
from .invalid import _Invalid
from .layout import KIND, _optional_arg, _tabled_key
from .limits import _FIELD_RANGES, _INT_RANGE
from .tables import _new, _Tables

# The records a rank's process or thread ids are part of (or that hold such records): equal
# ones are looked for within the rank only, so what is remembered stays one rank's worth.
_PER_RANK: tuple[type, ...] = (RankProcess, ThreadStack, ThreadCounters, ThreadWait, Sample)
_CHUNK = 8 * 2**20  # bytes of the file decoded to text at a time
_BLANK = re.compile(r"[ \t\n\r]*")  # JSON's whitespace, as ``json.decoder`` skips it
# one JSON value at a position: (value, end), by the scanner json.loads uses (C); typeshed
# types make_scanner's argument wrongly
_SCAN: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]

Decode = Callable[[Any], Any]

# When ``hangdoc analyze`` says that converting pays. Loading a first-format bundle of the
# synthetic job (bench/synthetic.py: 3 samples, 4 to 12 threads a rank) took 52 to 56 us a
# rank more than loading the same snapshot's second-format bundle, 4.4 to 5.1 times as long
# (load_snapshot, min of 2 or 3: 1k, 3k, 10k, 30k ranks; at 100k 6.8 s against 1.5 s); the
# notice says the least. At NOTICE_RANKS ranks that is 0.5 s more, and `hangdoc analyze
# --json` takes 1.7 times as long (1.41 s against 0.82 s; at 3,000 ranks 0.72 s against 0.54 s).
LOAD_US_PER_RANK = 53
SLOWER = 4
NOTICE_RANKS = 10_000
_PEEK = 64 * 2**10  # bytes of a file read to find its schema_version


def declared_version(path: str | Path) -> int | None:
    """The schema_version the bundle file ``path`` declares in its first 64 KiB (hangdoc
    writes it second, after the kind); None where it declares none there, or is not a
    regular file that can be read."""
    try:
        fd = open_to_read(path)
    except (OSError, ValueError):
        return None
    try:
        head = os.read(fd, _PEEK) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        if head.startswith(b"\x1f\x8b"):
            head = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS).decompress(head, _PEEK)
        c = _Cursor(head, whole=False)
        c.take("{")
        seen: dict[str, Any] = {}
        while True:
            key = c.key(seen)
            seen[key] = value = c.value()
            if key == "schema_version":
                return value if type(value) is int else None
            if c.next_of("}"):
                return None
    except (_NotHere, ValueError, RecursionError, zlib.error):
        return None


class _NotHere(Exception):
    """The text is not read here; the whole-text reader reads it (and says what is wrong)."""


def read_first_format(raw: bytes, load_tables: Callable[[dict[str, Any], _Tables], None]) -> JobSnapshot | None:
    """The snapshot in ``raw``, a first-format bundle's bytes, read a rank at a time; None
    when ``raw`` is not one this reader takes (another format, keys in another order, or
    anything wrong). ``load_tables`` reads the frames and stacks of the envelope."""
    try:
        return _read(_Cursor(raw), load_tables)
    except (_NotHere, _Invalid, ValueError, StopIteration, RecursionError, KeyError, TypeError, ArithmeticError):
        return None


def _read(c: _Cursor, load_tables: Callable[[dict[str, Any], _Tables], None]) -> JobSnapshot:
    """The envelope's members whole, the snapshot's lists of ranks a rank at a time."""
    c.take("{")
    top: dict[str, Any] = {}
    snapshot: JobSnapshot | None = None
    while True:
        key = c.key(top)
        if key == "snapshot":
            version = top.get("schema_version")
            if top.get("kind") != KIND or type(version) is not int or "frames" not in top or "stacks" not in top:
                raise _NotHere
            tables = _Tables()
            load_tables(top, tables)
            snapshot = _read_snapshot(c, tables)
            top[key] = None
        else:
            top[key] = value = c.value()
            other_version = key == "schema_version" and (type(value) is not int or value != 1)
            if other_version or (key == "kind" and value != KIND):
                raise _NotHere  # not a first-format bundle: read whole
        if c.next_of("}"):
            break
    if c.skip() or snapshot is None:  # data after the object, or no snapshot
        raise _NotHere
    return snapshot


_RANK_LISTS = tuple(
    name for name, hint in typing.get_type_hints(JobSnapshot).items() if hint == tuple[RankSnapshot, ...]
)


def _read_snapshot(c: _Cursor, tables: _Tables) -> JobSnapshot:
    decoding = _Decoding(tables)
    c.take("{")
    fields: dict[str, Any] = {}
    ranks: dict[str, Any] = {}
    if c.skip() == "}":
        raise _NotHere
    while True:
        key = c.key(fields)
        if key in _RANK_LISTS and c.skip() == "[":
            ranks[key] = _read_ranks(c, decoding)
            fields[key] = []
        else:
            fields[key] = c.value()
        if c.next_of("}"):
            break
    snapshot: JobSnapshot = _codec(JobSnapshot, "v1")[1](fields, tables)
    return dataclasses.replace(snapshot, **ranks) if ranks else snapshot


def _read_ranks(c: _Cursor, decoding: _Decoding) -> tuple[RankSnapshot, ...]:
    decode = decoding.decoder(RankSnapshot)
    c.take("[")
    if c.skip() == "]":
        c.pos += 1
        return ()
    ranks = []
    while True:
        ranks.append(decode(c.value()))
        decoding.rank_done()
        if c.next_of("]"):
            return tuple(ranks)


class _Cursor:
    """A position in the text of ``raw``, decoded a chunk at a time; what is behind the
    position is dropped as the next chunk is decoded."""

    def __init__(self, raw: bytes, whole: bool = True) -> None:
        self.whole = whole  # False: ``raw`` is the start of the text (a character may be cut)
        self.raw = memoryview(raw)
        self.fed = 0
        self.utf8 = codecs.getincrementaldecoder("utf-8")()
        self.text = ""
        self.pos = 0

    def more(self, at_least: int = 1) -> bool:
        """Decode at least ``at_least`` more bytes (a chunk at least); False at the end."""
        if self.fed >= len(self.raw):
            return False
        start = self.fed
        self.fed = min(len(self.raw), start + max(_CHUNK, at_least))
        added = self.utf8.decode(self.raw[start : self.fed], final=self.whole and self.fed == len(self.raw))
        self.text = self.text[self.pos :] + added
        self.pos = 0
        return True

    def skip(self) -> str:
        """The next character that is not blank ("" at the end), the position on it."""
        while True:
            self.pos = _BLANK.match(self.text, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self.more():
                return ""

    def take(self, char: str) -> None:
        if self.skip() != char:
            raise _NotHere
        self.pos += 1

    def next_of(self, close: str) -> bool:
        """Past the comma before the next member (False) or the ``close`` after the last (True)."""
        char = self.skip()
        self.pos += 1
        if char == close:
            return True
        if char != ",":
            raise _NotHere
        return False

    def key(self, seen: dict[str, Any]) -> str:
        key = self.value()
        if type(key) is not str or key in seen:  # a key twice: the whole-text reader keeps the last
            raise _NotHere
        self.take(":")
        return key

    def value(self) -> Any:
        """The JSON value at the position, the position after it."""
        self.skip()
        while True:
            try:
                value, end = _SCAN(self.text, self.pos)
            except (StopIteration, ValueError):
                # cut by the chunk's end, or wrong: decode as much again and retry
                if self.more(len(self.text) - self.pos):
                    continue
                raise _NotHere from None
            if end == len(self.text) and self.more():  # a number may go on in the next chunk
                continue
            self.pos = end
            return value


class _Decoding:
    """The decoders of one read, by type, and the records met so far (each distinct record
    once): ``job`` for the whole read, ``rank`` for one rank's records (see ``_PER_RANK``)."""

    def __init__(self, tables: _Tables) -> None:
        self.t = tables
        self.job: list[dict[Any, Any]] = []
        self.rank: list[dict[Any, Any]] = []
        self._decoders: dict[Any, Decode] = {}
        self.pairs = self.met(tuple[str, str])  # each distinct pair of strings

    def rank_done(self) -> None:
        for met in self.rank:
            met.clear()

    def met(self, tp: Any) -> dict[Any, Any]:
        """A new store of the records of type ``tp`` met (or tuples of them)."""
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple else tp
        store: dict[Any, Any] = {}
        (self.rank if item in _PER_RANK else self.job).append(store)
        return store

    def decoder(self, tp: Any) -> Decode:
        decode = self._decoders.get(tp)
        if decode is None:
            decode = self._decoders[tp] = self._build(tp)
        return decode

    def _build(self, tp: Any) -> Decode:
        t = self.t
        inner = _optional_arg(tp)
        if inner in (int, float, bool, str):
            return _scalar(inner, _INT_RANGE, optional=True)
        if inner is not None:
            some = self.decoder(inner)
            return lambda v: None if v is None else some(v)
        if tp is Frame:
            return t.frame_at
        if tp == Stack:
            return t.stack_at
        if tp in (int, float, bool, str):
            return _scalar(tp, _INT_RANGE)
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return _member(tp, t)
        args = typing.get_args(tp)
        if typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis:
            return self._many(tp, args[0])
        if tp == tuple[str, str]:
            return self._pair()
        if isinstance(tp, type) and dataclasses.is_dataclass(tp) and tp is not Note and _plain(tp):
            return self._record(tp)
        # the rest (notes, enums, other tuples, ...) as the whole-text reader decodes them
        old = _codec(tp, "v1")[1]
        return lambda v: old(v, t)

    def _many(self, tp: Any, item: Any) -> Decode:
        """``tuple[item, ...]``; one object for equal tuples of shared items."""
        if item is str:
            met = self.met(tp)

            def strings(v: Any) -> tuple[str, ...]:
                if type(v) is not list:
                    raise _Invalid("")
                key = tuple(v)
                found = met.get(key)  # a string equals only a string
                if found is None:
                    if not set(map(type, key)) <= {str}:
                        raise _Invalid("")
                    found = met[key] = key
                return found

            return strings
        decode = self.decoder(item)
        if not (_tabled_key(item) or item == tuple[str, str]):

            def values(v: Any) -> tuple[Any, ...]:
                if type(v) is not list:
                    raise _Invalid("")
                return tuple(map(decode, v)) if v else ()

            return values
        if item == tuple[str, str]:
            return self._pairs(tp)
        met = self.met(tp)
        last = self.met(tp)  # the list read last: raw, decoded, frames used (and signature)
        t = self.t
        stacks = _stack_fields(item) if item in _PER_RANK else None

        def again(raw: Any, before: Any, obj: Any) -> Any:
            """The item read before at this place when it is written the same way, else ``raw`` decoded."""
            if obj is not None and raw == before and _flat(raw) and _types(raw) == _types(before):
                t.use(0, sum(len(getattr(obj, name)) for name in stacks or ()))
                return obj
            return decode(raw)

        def shared(v: Any) -> tuple[Any, ...]:
            if type(v) is not list:
                raise _Invalid("")
            if not v:
                return ()
            if v == last.get("raw"):
                signature = _signature(v)
                if "signature" not in last:
                    last["signature"] = _signature(last["raw"])
                if signature is not None and signature == last["signature"]:
                    t.use(0, last["frames"])  # a rank's samples showing the same threads
                    same: tuple[Any, ...] = last["decoded"]
                    return same
            before = t.thread_frames
            if stacks is not None and "raw" in last:  # a thread that moved: the others are read before
                items = tuple(map(again, v, chain(last["raw"], repeat(None)), chain(last["decoded"], repeat(None))))
            else:
                items = tuple(map(decode, v))
            key = tuple(map(id, items))
            found: tuple[Any, ...] | None = met.get(key)
            if found is None:
                found = met[key] = items
            last.clear()
            last.update(raw=v, decoded=found, frames=t.thread_frames - before)
            return found

        return shared

    def _pairs(self, tp: Any) -> Decode:
        """``tuple[tuple[str, str], ...]`` (an environment): lists of two strings, each
        distinct pair one tuple, each distinct list of pairs one tuple."""
        pairs = self.pairs
        met = self.met(tp)
        one = self.decoder(tuple[str, str])

        def environment(v: Any) -> tuple[tuple[str, str], ...]:
            if type(v) is not list or not set(map(type, v)) <= {list}:
                raise _Invalid("")
            items = list(map(tuple, v))
            found = list(map(pairs.get, items))  # a pair met is two strings: only they equal it
            if None in found:
                found = [one(raw) if pair is None else pair for pair, raw in zip(found, v, strict=True)]
            env = tuple(found)  # compared by its pairs' identity first: no key of its own
            shared_env: tuple[tuple[str, str], ...] = met.setdefault(env, env)
            return shared_env

        return environment

    def _pair(self) -> Decode:
        met = self.pairs

        def pair(v: Any) -> tuple[str, str]:
            if type(v) is not list or len(v) != 2:
                raise _Invalid("")
            a, b = v
            if type(a) is not str or type(b) is not str:
                raise _Invalid("")
            key = (a, b)
            found: tuple[str, str] = met.setdefault(key, key)
            return found

        return pair

    def _record(self, tp: type) -> Decode:
        """A dataclass written field for field: each field's decoder, then the record built
        by its slot setters; for a tabled type, one object per distinct record."""
        hints = typing.get_type_hints(tp)
        fields = dataclasses.fields(tp)
        names = [f.name for f in fields]
        decoders = [self._field(tp, f.name, hints[f.name]) for f in fields]
        # what a field left out is read as: its default written as JSON (nothing, for a
        # required field: every decoder refuses _ABSENT)
        fills = [_fill(f.default, decode) for f, decode in zip(fields, decoders, strict=True)]
        setters = [tp.__dict__[f.name].__set__ for f in fields]
        # fields whose values are shared objects are told apart by identity
        by_id = [i for i, f in enumerate(fields) if _shared(hints[f.name])]
        tabled = _tabled_key(tp)
        met = self.met(tp) if tabled and tp not in _PER_RANK else None
        t = self.t
        scalars = [_scalar_kind(hints[f.name], _FIELD_RANGES.get((tp, f.name))) for f in fields]
        defaults = [f.default for f in fields]
        stacks = [hints[f.name] == Stack for f in fields]
        record = _compiled(tp, names, scalars, stacks, decoders, fills, defaults, setters, by_id, met, t)

        if not tabled or tp in _PER_RANK:
            return record
        # records equal across ranks (process states): the one written last is checked first
        last: dict[str, Any] = {}

        def same_as_last(v: Any) -> Any:
            if v == last.get("raw") and _flat(v) and _types(v) == last["types"]:
                t.use(0, last["frames"])
                return last["decoded"]
            before = t.thread_frames
            obj = record(v)
            last.update(raw=v, decoded=obj, types=_types(v), frames=t.thread_frames - before)
            return obj

        return same_as_last

    def _field(self, tp: type, name: str, hint: Any) -> Decode:
        limits = _FIELD_RANGES.get((tp, name))
        if limits is None:
            return self.decoder(hint)
        inner = _optional_arg(hint)
        if hint is int or inner is int:
            return _scalar(int, limits, optional=inner is int)
        old = _ranged(_codec(hint, "v1")[1], *limits)
        t = self.t
        return lambda v: old(v, t)


def _scalar_kind(hint: Any, limits: tuple[int, int] | None) -> tuple[type, bool, tuple[int, int]] | None:
    """A field checked in the record's own code: its scalar type, whether it may be None,
    and an int's range; None for a field decoded by its decoder."""
    inner = _optional_arg(hint)
    base = inner or hint
    if base not in (int, float, bool, str) or (limits is not None and base is not int):
        return None
    return base, inner is not None, limits or _INT_RANGE


def _compiled(
    tp: type,
    names: list[str],
    scalars: list[tuple[type, bool, tuple[int, int]] | None],
    stacks: list[bool],
    decoders: list[Decode],
    fills: list[Any],
    defaults: list[Any],
    setters: list[Any],
    by_id: list[int],
    met: dict[Any, Any] | None,
    t: _Tables,
) -> Decode:
    """The decoder of one record type as straight code (as ``dataclasses`` writes its
    ``__init__``): each scalar field checked in place as ``_scalar`` checks it, the others
    through their decoders, a stack looked up as ``_Tables.stack_at`` does, then the record
    built by its slot setters, or the one met with the same values (``met``: fields ``by_id``
    compared by identity)."""
    env: dict[str, Any] = {"Invalid": _Invalid, "new": _new, "tp": tp, "met": met, "absent": _ABSENT}
    env.update(STACKS=t.stacks, LENGTHS=t.stack_lengths(), use=t.use)
    lines = ["def record(v):", "    if type(v) is not dict:", '        raise Invalid("")', "    get = v.get"]
    for i, (name, scalar) in enumerate(zip(names, scalars, strict=True)):
        env[f"F{i}"], env[f"D{i}"], env[f"S{i}"], env[f"V{i}"] = fills[i], decoders[i], setters[i], defaults[i]
        x = f"x{i}"
        if stacks[i] and fills[i] is _ABSENT:
            lines.append(f"    {x} = get({name!r}, absent)")
            lines.append(f"    if type({x}) is not int or not (0 <= {x} < len(STACKS)):")
            lines.append('        raise Invalid("")')
            lines.append(f"    use(0, LENGTHS[{x}])")
            lines.append(f"    {x} = STACKS[{x}]")
            continue
        if scalar is None and fills[i] is _ABSENT:
            lines.append(f"    {x} = D{i}(get({name!r}, absent))")
            continue
        if scalar is None:  # left out: its default, without a call
            lines.append(f"    {x} = get({name!r}, absent)")
            lines.append(f"    {x} = V{i} if {x} is absent else D{i}({x})")
            continue
        lines.append(f"    {x} = get({name!r}, F{i})")
        base, optional, (env[f"L{i}"], env[f"H{i}"]) = scalar
        none = f"{x} is not None and " if optional else ""
        if base is int:
            lines.append(f"    if {none}(type({x}) is not int or not (L{i} <= {x} <= H{i})):")
        elif base is float:
            lines.append(f"    if type({x}) is int:")
            lines.append(f"        {x} = float({x})  # OverflowError: read whole, which says so")
            lines.append(f"    elif {none}type({x}) is not float:")
        else:
            env[f"T{i}"] = base
            lines.append(f"    if {none}type({x}) is not T{i}:")
        lines.append('        raise Invalid("")')
    if met is not None:
        key = ", ".join(f"id(x{i})" if i in by_id else f"x{i}" for i in range(len(names)))
        lines += [
            f"    key = ({key},)",
            "    found = met.get(key)",
            "    if found is not None:",
            "        return found",
        ]
    lines.append("    obj = new(tp)")
    lines += [f"    S{i}(obj, x{i})" for i in range(len(names))]
    if met is not None:
        lines.append("    met[key] = obj")
    lines.append("    return obj")
    exec("\n".join(lines), env)  # code made here, from the model's type hints
    decode: Decode = env["record"]
    return decode


def _scalar(tp: type, limits: tuple[int, int], optional: bool = False) -> Decode:
    """As ``codec``'s scalars: exactly the type (a bool is not an int), an int within
    ``limits``, a float from an int too; with ``optional``, or None."""
    if tp is int:
        lo, hi = limits

        def integer(v: Any) -> int | None:
            if type(v) is int and lo <= v <= hi:
                return v
            if v is None and optional:
                return None
            raise _Invalid("")

        return integer
    if tp is float:

        def number(v: Any) -> float | None:
            if type(v) is float:
                return v
            if type(v) is int:
                return float(v)  # OverflowError: read whole, which says so
            if v is None and optional:
                return None
            raise _Invalid("")

        return number

    def exactly(v: Any) -> Any:
        if type(v) is tp or (v is None and optional):
            return v
        raise _Invalid("")

    return exactly


def _member(tp: type[enum.Enum], t: _Tables) -> Decode:
    """An enum's member by its value, as ``tp(value)`` finds it first; anything else as
    ``codec`` decodes it (``tp(value)``, or what is wrong)."""
    members = tp._value2member_map_
    old = _codec(tp, "v1")[1]

    def member(v: Any) -> Any:
        try:
            found = members.get(v)
        except TypeError:  # not hashable
            found = None
        return found if found is not None else old(v, t)

    return member


_SCALARS = frozenset({int, float, str, bool, type(None)})
_ABSENT = object()  # a required field left out


def _fill(default: Any, decode: Decode) -> Any:
    """The JSON that ``decode`` reads as ``default`` (``_ABSENT`` for no default)."""
    if default is dataclasses.MISSING:
        return _ABSENT
    raw = [] if default == () else default
    if type(raw) not in _SCALARS | {list} or (value := decode(raw)) != default or type(value) is not type(default):
        raise TypeError(f"bundle cannot read a default of {default!r} written as JSON")
    return raw


def _signature(v: list[Any]) -> tuple[list[Any], list[type]] | None:
    """For a list of objects of plain values, their keys and the types of their values, one
    after the other (two lists that are ``==``, so of objects of the same sizes, and of one
    signature are the same JSON: ``==`` alone takes 1 for 1.0 or True); None for other lists."""
    try:
        keys = list(chain.from_iterable(v))
        types = list(map(type, chain.from_iterable(map(dict.values, v))))
    except TypeError:  # an item that is not an object
        return None
    return (keys, types) if _SCALARS.issuperset(types) else None


def _types(v: dict[str, Any]) -> tuple[tuple[str, ...], tuple[type, ...]]:
    """An object's keys and the types of its values: two objects that are ``==`` and of the
    same types are the same JSON where the values are plain (``==`` takes 1 for 1.0 or True)."""
    return tuple(v), tuple(map(type, v.values()))


def _flat(v: Any) -> bool:
    """An object of plain values."""
    return type(v) is dict and _SCALARS.issuperset(map(type, v.values()))


def _stack_fields(tp: type) -> list[str] | None:
    """The fields of the record type ``tp`` that hold stacks, where none of its other
    fields can reach one (so its frames, for the caps, are theirs); else None."""
    hints = typing.get_type_hints(tp)
    if any(h != Stack and _reaches_stack(h) for h in hints.values()):
        return None
    return [name for name, h in hints.items() if h == Stack]


def _reaches_stack(tp: Any) -> bool:
    if tp == Stack:
        return True
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return any(map(_reaches_stack, typing.get_type_hints(tp).values()))
    return any(_reaches_stack(a) for a in typing.get_args(tp) if a is not Ellipsis)


def _plain(tp: type) -> bool:
    """A frozen slot dataclass without ``__post_init__``: its records are built with the slot setters."""
    params = getattr(tp, "__dataclass_params__", None)
    slots = set(getattr(tp, "__slots__", ()))
    return (
        params is not None
        and params.frozen
        and not hasattr(tp, "__post_init__")
        and all(f.init and f.name in slots and f.default_factory is dataclasses.MISSING for f in dataclasses.fields(tp))
    )


def _shared(hint: Any) -> bool:
    """Values of ``hint`` are shared objects (frames, stacks, tabled records, and tuples of
    strings or pairs), told apart by identity; the rest by value."""
    tp = _optional_arg(hint) or hint
    if tp is Frame or tp == Stack or _tabled_key(tp):
        return True
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return False
    args = typing.get_args(tp)
    return (
        typing.get_origin(tp) is tuple and len(args) == 2 and args[0] in (str, tuple[str, str]) and args[1] is Ellipsis
    )
