"""The ``--json`` report: one JSON object scripts can rely on (see ``docs/json-schema.md``).

Keys appear in a fixed order, enums as their value strings, rank lists sorted. Changing
the meaning or type of a key, or removing one, bumps ``hangdoc.SCHEMA_VERSION``; adding a
key does not.

The text is strict JSON (RFC 8259) that is also safe to print: a float that is not finite
(NaN, Infinity: strict parsers reject them) is written as ``null``, and the characters that
JSON lets through raw but a terminal would obey (DEL, C1 controls, bidi overrides, line
separators) or that cannot be encoded (lone surrogates) are written as ``\\uXXXX`` escapes,
so every string still reads back exactly as the job had it.

A run that fails prints, instead of the report, one error object (``error_to_dict``)::

    {"error": {"kind": "JobNotFound", "message": "...", "help": "...", "exit_code": 3},
     "hangdoc_version": "0.1.0", "schema_version": 1}
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

from .. import SCHEMA_VERSION, __version__
from ..errors import UNSAFE_CHARACTERS
from ..memo import once_per_object
from ..model import (
    Confidence,
    Diagnosis,
    DistOp,
    Frame,
    GpuState,
    JobSnapshot,
    NcclRasReport,
    RankAnalysis,
    RankProcess,
    RankSnapshot,
    RootCause,
    Scope,
    StackGroup,
    Unreachable,
    Verdict,
)
from ..rankranges import compress_ranks, ranges

# escaped in the JSON text: the terminal-unsafe characters json.dumps lets through raw (it
# escapes only C0 controls, quotes and backslashes)
_JSON_ESCAPES = str.maketrans({cp: f"\\u{cp:04x}" for cp in UNSAFE_CHARACTERS if cp >= 0x20})


def dumps(value: Any, indent: int | None = 2) -> str:
    """``value`` as strict, printable JSON text: non-finite floats become ``null``,
    terminal-hostile characters ``\\uXXXX`` escapes, other non-ASCII is kept as is.

    Indented, the top level and the containers in it take a line per item, and anything
    deeper (a rank's entry, a group's stack) stays on one line: the report reads one rank
    per line, and the text of 100k ranks is written by json's C encoder (about 10x faster
    than its indenting Python one, and half the bytes).
    """
    if indent is not None:  # a NaN or an infinity is made null line by line (_layout_into)
        parts: list[str] = []
        _layout_into(parts, value, " " * indent, 0)
        return "".join(parts)
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False).translate(_JSON_ESCAPES)
    except ValueError:  # a NaN or an infinity somewhere: walk the value only then
        return json.dumps(_finite(value), ensure_ascii=False, allow_nan=False).translate(_JSON_ESCAPES)


# json's C encoder (used when no indent is asked), with the spacing of its indented output
_LINE = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(", ", ": "))
# the same encoder made once, not once per line (``JSONEncoder.encode`` makes one a call: a
# fifth of the report's time at 100k ranks); no circular check: a report holds no cycles
_ONE_LINE = (
    None
    if c_make_encoder is None
    else c_make_encoder(None, _LINE.default, encode_basestring, None, ": ", ", ", False, False, False)
)


def _line(value: Any) -> str:
    """``value`` on one line, as ``_LINE.encode`` writes it."""
    if _ONE_LINE is None:
        return _LINE.encode(value)
    return "".join(_ONE_LINE(value, 0))


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None."""
    if type(value) is float:
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _key(key: Any) -> str:
    """A dict key as json writes it: strings as they are, numbers, booleans and None as
    their JSON text."""
    return key if isinstance(key, str) else json.dumps(key)


def error_to_dict(kind: str, message: str, help: str, exit_code: int) -> dict[str, Any]:
    """What ``--json`` prints when the run fails: the error the CLI also prints on stderr.

    ``kind`` is the error's class name (``UsageError``, ``JobNotFound``, ``BundleError``,
    ...; see docs/troubleshooting.md), ``message`` the one line after ``hangdoc: error:``,
    ``help`` what to do about it ("" when nothing), ``exit_code`` the process's exit status.
    """
    return {
        "error": {"kind": kind, "message": message, "help": help, "exit_code": exit_code},
        "hangdoc_version": __version__,
        "schema_version": SCHEMA_VERSION,
    }


def to_json_dict(diagnosis: Diagnosis, snapshot: JobSnapshot) -> dict[str, Any]:
    """The report as a plain dict of JSON types, keys in schema order; floats are finite
    (None where the analysis had NaN or infinity: ``observed_seconds`` is the report's only
    float)."""
    return _report(diagnosis, snapshot)


def _report(diagnosis: Diagnosis, snapshot: JobSnapshot, lazily: bool = False) -> dict[str, Any]:
    """The report's dict; ``lazily``: its ranks an ``_Each``, their entries made when read."""
    processes = _Processes(snapshot)
    op_entry = once_per_object(_op)  # the ranks of one stack share one op, and its entry
    gpus = {(rs.process.host, rs.process.pid): rs.gpus for rs in snapshot.ranks if rs.gpus}

    def entry(ra: RankAnalysis) -> dict[str, Any]:
        return _with_gpus(_rank(ra, processes.of(ra), op_entry), gpus.get((ra.host, ra.pid or 0), ()))

    return {
        "verdict": diagnosis.verdict.value,
        "culprit_ranks": sorted(diagnosis.culprit_ranks),
        "summary": diagnosis.summary,
        "confidence": diagnosis.confidence.value,
        "basis": list(diagnosis.basis),
        "evidence": [e.words() for e in diagnosis.evidence],
        "next_steps": list(diagnosis.next_steps),
        "ranks": _Each(diagnosis.ranks, entry) if lazily else list(map(entry, diagnosis.ranks)),
        "groups": [_group(g) for g in diagnosis.groups],
        "unreachable": [_unreachable(u) for u in snapshot.unreachable],
        "spec": snapshot.spec,
        "world_size": snapshot.world_size,
        "observed_seconds": _finite(float(diagnosis.observed_seconds)),
        "partial": diagnosis.partial,
        "scope": _scope(diagnosis.scope),
        "root_cause": _root(diagnosis.root_cause),
        "other_processes": [_other(r) for r in snapshot.beyond],
        "captured_at": snapshot.captured_at,
        "notes": [note.words() for note in snapshot.notes],
        **({"nccl_ras": _ras(snapshot.ras)} if snapshot.ras is not None else {}),
        "hangdoc_version": __version__,
        "schema_version": SCHEMA_VERSION,
    }


def _where(frame: Frame | None) -> str | None:
    return f"{frame.filename}:{frame.line or 0}" if frame is not None else None


def _root(root: RootCause | None) -> dict[str, Any] | None:
    """The process at the end of the wait, and the links from the ranks to it."""
    if root is None:
        return None
    return {
        "pid": root.pid,
        "host": root.host,
        "rank": root.rank,
        "thread": root.thread,
        "frame": _where(root.frame),
        "command": list(root.chain[-1].command),
        "cycle": root.cycle,
        "chain": [
            {
                "pid": link.pid,
                "host": link.host,
                "rank": link.rank,
                "thread": link.thread,
                "waits": link.waits.value if link.waits is not None else None,
                "on": link.on,
                "frame": _where(link.frame),
                "command": list(link.command),
                "how": how,
                "certain": link.certain,
            }
            for link, how in zip(root.chain, root.how, strict=False)
        ],
    }


def _other(snap: RankSnapshot) -> dict[str, Any]:
    """A process of the job that is not a rank, met by following the ranks' waits: what it runs."""
    good = snap.good_samples
    return {
        "pid": snap.process.pid,
        "host": snap.process.host,
        "command": list(snap.process.cmdline),
        "threads": [t.name or str(t.thread_id) for t in good[-1].threads] if good else [],
        "sampled": len(good),
    }


def _scope(scope: Scope) -> dict[str, Any]:
    """What was seen of the job, as inclusive ``[first, last]`` rank ranges."""
    return {
        "world_size": scope.world_size,
        "whole": scope.whole,
        "seen": [list(r) for r in ranges(scope.seen)],
        "not_seen": [list(r) for r in ranges(scope.not_seen)],
        "absent": [list(r) for r in ranges(scope.absent)],
    }


def _with_gpus(rank: dict[str, Any], gpus: tuple[GpuState, ...]) -> dict[str, Any]:
    """A rank's entry, with its ``gpus`` key only where NVML showed it on a GPU."""
    if gpus:
        rank["gpus"] = [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "utilization_percent": g.utilization_percent,
                "memory_used_bytes": g.memory_used_bytes,
                "memory_total_bytes": g.memory_total_bytes,
                "process_memory_bytes": g.process_memory_bytes,
                "xids": list(g.xids),
                "ecc_uncorrected": g.ecc_uncorrected,
                "lost": g.lost,
                "matched_by": g.matched_by,
            }
            for g in gpus
        ]
    return rank


def _ras(report: NcclRasReport) -> dict[str, Any]:
    """NCCL's RAS report as captured (communicator ranks, not global ranks)."""
    return {
        "nccl_version": report.nccl_version,
        "source": report.source,
        "timeouts": report.timeouts,
        "communicators": [
            {
                "hash": c.hash,
                "size": c.size,
                "missing_ranks": [
                    {"rank": r.comm_rank, "host": r.host, "pid": r.pid, "unresponsive": r.unresponsive, "dead": r.dead}
                    for r in c.missing
                ],
                "launched": {str(r.comm_rank): r.launched for r in c.ranks if not r.missing},
                "errors": [
                    {
                        "rank": r.comm_rank,
                        "async_error": r.async_error,
                        "init_state": r.init_state,
                        "abort": r.abort_flag,
                    }
                    for r in c.ranks
                    if r.async_error not in (None, 0, 7) or r.init_state not in (None, 0, 7) or r.abort_flag
                ],
            }
            for c in report.communicators
        ],
    }


def undiagnosed_to_json_dict(spec: str, error: str, help: str, *, noticed: str, captured_at: str) -> dict[str, Any]:
    """The report of a job that stopped making progress but could not be diagnosed (what
    ``hangdoc watch`` writes when its diagnosis fails), with every key of ``to_json_dict``.

    The verdict is ``unknown``, partial and of low confidence, no rank, group or unreachable
    node is known;
    ``noticed`` (how the stop was seen) and ``error`` are the evidence, ``help`` ("" when
    none) the next step, ``captured_at`` the time the stop was seen.
    """
    return {
        "verdict": Verdict.UNKNOWN.value,
        "culprit_ranks": [],
        "summary": f"the job stopped making progress but could not be diagnosed: {error}",
        "confidence": Confidence.LOW.value,
        "basis": ["the diagnosis failed: no stack backs a verdict"],
        "evidence": [noticed, error],
        "next_steps": [help] if help else [],
        "ranks": [],
        "groups": [],
        "unreachable": [],
        "spec": spec,
        "world_size": None,
        "observed_seconds": 0.0,
        "partial": True,
        "scope": _scope(Scope()),
        "root_cause": None,
        "other_processes": [],
        "captured_at": captured_at,
        "notes": [f"diagnosis failed: {error}"],
        "hangdoc_version": __version__,
        "schema_version": SCHEMA_VERSION,
    }


# parts written to the output at once: a rank is 2 parts (its separator, its line: about
# 420 bytes at a million ranks), so a piece is about 2 MB
_PIECE = 8_192


def render_json(diagnosis: Diagnosis, snapshot: JobSnapshot) -> str:
    """The report as JSON text (indented, strict, non-ASCII kept as is; see ``dumps``).

    The text of ``dumps(to_json_dict(...))``, with each rank's entry made as its line is
    written and the text joined once: at a million ranks the entries held all at once
    and the nested joins took 1.4 GB over the diagnosis."""
    return dumps(_report(diagnosis, snapshot, lazily=True))


def write_json(diagnosis: Diagnosis, snapshot: JobSnapshot, write: Callable[[str], object]) -> None:
    """``render_json``'s text passed to ``write`` a piece at a time (about ``_PIECE`` parts
    each), never whole: at a million ranks it is 418 MB, and printing it whole held it
    twice more (with its newline, then encoded)."""

    def flush(parts: list[str]) -> None:
        write("".join(parts))
        parts.clear()

    parts: list[str] = []
    _layout_into(parts, _report(diagnosis, snapshot, lazily=True), "  ", 0, flush)
    flush(parts)


class _Each(list):  # type: ignore[type-arg]
    """A list whose items are made one at a time as they are read (``make`` of each of
    ``items``), so no more than one of them is held. A ``list`` to what checks the report's
    shape; read it by ``len``, iteration and indexing only (``"".join`` and the C JSON
    encoder read a list's own slots, which this one leaves empty)."""

    def __init__(self, items: Sequence[Any], make: Callable[[Any], Any]) -> None:
        super().__init__()
        self.items, self.make = items, make

    def __len__(self) -> int:
        return len(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)

    def __iter__(self) -> Iterator[Any]:
        return map(self.make, self.items)

    def __getitem__(self, at: Any) -> Any:
        return list(map(self.make, self.items[at])) if isinstance(at, slice) else self.make(self.items[at])


def _layout_into(
    parts: list[str], value: Any, pad: str, depth: int, flush: Callable[[list[str]], None] | None = None
) -> None:
    """``dumps(value)`` as parts appended to ``parts`` (the same text once joined); with
    ``flush``, given ``parts`` between two items once it holds ``_PIECE`` of them."""
    if depth >= 2 or not isinstance(value, (dict, list, tuple)) or not value:
        parts.append(_finite_line(value).translate(_JSON_ESCAPES))
        return
    inner, outer = pad * (depth + 1), pad * depth
    if isinstance(value, dict):
        for i, (k, v) in enumerate(value.items()):
            parts.append(f"{',' if i else '{'}\n{inner}{_line(_key(k))}: ".translate(_JSON_ESCAPES))
            _layout_into(parts, v, pad, depth + 1, flush)
        parts.append(f"\n{outer}}}")
        return
    after = f",\n{inner}"  # one string between all items (a million ranks: 55 MB less)
    for i, v in enumerate(value):
        parts.append(after if i else f"[\n{inner}")
        _layout_into(parts, v, pad, depth + 1, flush)
        if flush is not None and len(parts) >= _PIECE:
            flush(parts)
    parts.append(f"\n{outer}]")


def _finite_line(value: Any) -> str:
    """``_line(value)``, a NaN or an infinity in it written as null (as ``dumps`` does): line
    by line, so text already written stays right."""
    try:
        return _line(value)
    except ValueError:
        return _line(_finite(value))


class _Processes:
    """The snapshot's rank processes, found by host and pid, else by rank."""

    def __init__(self, snapshot: JobSnapshot) -> None:
        # ranks read from files have no pid (0): they are told apart by rank, not all as one
        self._by_pid = {(rs.process.host, rs.process.pid): rs.process for rs in snapshot.ranks if rs.process.pid}
        self._by_rank: dict[int, RankProcess] = {}
        for rs in snapshot.ranks:
            if rs.process.rank is not None:
                self._by_rank.setdefault(rs.process.rank, rs.process)

    def of(self, ra: RankAnalysis) -> RankProcess | None:
        if ra.pid and (found := self._by_pid.get((ra.host, ra.pid))) is not None:
            return found
        return None if ra.rank is None else self._by_rank.get(ra.rank)


def _rank(
    ra: RankAnalysis,
    process: RankProcess | None,
    op_entry: Callable[[DistOp | None], dict[str, Any] | None] | None = None,
) -> dict[str, Any]:
    source = process.rank_source if process else None
    return {
        "rank": ra.rank,
        "pid": ra.pid,
        "host": ra.host,
        "state": ra.state.value,
        "op": (op_entry or _op)(ra.op),
        "thread": ra.thread,
        "group": ra.group_id,
        "detail": ra.detail,
        "rank_source": source.value if source else None,
        "rank_evidence": process.rank_evidence if process else "",
    }


def _op(op: DistOp | None) -> dict[str, Any] | None:
    if op is None:
        return None
    site = op.call_site
    return {
        "kind": op.kind.value,
        "name": op.name,
        "call_site": site.location if site else None,
        "function": site.function if site else None,
        "via": op.via,
        "peer": op.peer,
        "group": op.group,
        "in_cleanup": op.in_cleanup,
        "cleanup_site": str(op.cleanup_frame) if op.cleanup_frame else None,
    }


def _group(group: StackGroup) -> dict[str, Any]:
    return {
        "id": group.group_id,
        "ranks": sorted(group.ranks),
        "ranks_compact": compress_ranks(group.ranks),
        "op": _op(group.op),
        "stack": [_frame(f) for f in group.stack],
    }


def _frame(frame: Frame) -> dict[str, Any]:
    return {
        "function": frame.function,
        "file": frame.filename,
        "line": frame.line,
        "native": frame.native,
        "code": frame.code,
    }


def _unreachable(u: Unreachable) -> dict[str, Any]:
    return {"target": u.target, "reason": u.reason, "ranks": sorted(u.ranks)}
