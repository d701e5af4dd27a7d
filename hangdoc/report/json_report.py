"""The ``--json`` report: one JSON object scripts can rely on (see ``docs/json-schema.md``).

Keys appear in a fixed order, enums as their value strings, rank lists sorted. Changing
the meaning or type of a key, or removing one, bumps ``hangdoc.SCHEMA_VERSION``; adding a
key does not.
"""

from __future__ import annotations

import json
from typing import Any

from .. import SCHEMA_VERSION, __version__
from ..merge import compress_ranks
from ..model import (
    Diagnosis,
    DistOp,
    Frame,
    JobSnapshot,
    RankAnalysis,
    RankProcess,
    StackGroup,
    Unreachable,
)


def to_json_dict(diagnosis: Diagnosis, snapshot: JobSnapshot) -> dict[str, Any]:
    """The report as a plain dict of JSON types, keys in schema order."""
    processes = _processes(snapshot)
    return {
        "verdict": diagnosis.verdict.value,
        "culprit_ranks": sorted(diagnosis.culprit_ranks),
        "summary": diagnosis.summary,
        "evidence": list(diagnosis.evidence),
        "next_steps": list(diagnosis.next_steps),
        "ranks": [_rank(ra, _process_of(ra, processes)) for ra in diagnosis.ranks],
        "groups": [_group(g) for g in diagnosis.groups],
        "unreachable": [_unreachable(u) for u in snapshot.unreachable],
        "spec": snapshot.spec,
        "world_size": snapshot.world_size,
        "observed_seconds": diagnosis.observed_seconds,
        "partial": diagnosis.partial,
        "captured_at": snapshot.captured_at,
        "notes": list(snapshot.notes),
        "hangdoc_version": __version__,
        "schema_version": SCHEMA_VERSION,
    }


def render_json(diagnosis: Diagnosis, snapshot: JobSnapshot) -> str:
    """The report as JSON text (indented, non-ASCII kept as is)."""
    return json.dumps(to_json_dict(diagnosis, snapshot), indent=2, ensure_ascii=False)


def _processes(snapshot: JobSnapshot) -> dict[tuple[str, int], RankProcess]:
    return {(rs.process.host, rs.process.pid): rs.process for rs in snapshot.ranks}


def _process_of(
    ra: RankAnalysis, processes: dict[tuple[str, int], RankProcess]
) -> RankProcess | None:
    if ra.pid is not None and (ra.host, ra.pid) in processes:
        return processes[(ra.host, ra.pid)]
    if ra.rank is None:
        return None
    return next((p for p in processes.values() if p.rank == ra.rank), None)


def _rank(ra: RankAnalysis, process: RankProcess | None) -> dict[str, Any]:
    source = process.rank_source if process else None
    return {
        "rank": ra.rank,
        "pid": ra.pid,
        "host": ra.host,
        "state": ra.state.value,
        "op": _op(ra.op),
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
