"""A node's jobs (``jobwatch.NodeJobs``) as the JSON an agent sends the service, and back.

The service reads what any caller with the token sends, so ``from_json`` checks every
field's type and range and bounds every list; a bad report is one ``UsageError`` line.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..errors import UsageError
from .jobwatch import NodeJobs, WatchedJob, WatchedRank

MAX_REPORT_BYTES = 1 << 20
MAX_JOBS = 1024
MAX_RANKS = 4096
MAX_NAME = 256
MAX_PID = 1 << 22  # the kernel's pid_max limit
MAX_RANK = 1 << 24


def to_json(node: NodeJobs, port: int, advertise: str | None = None) -> bytes:
    """The report of a look, with the port (or the whole address) the agent serves on."""
    body: dict[str, Any] = {
        "host": node.host,
        "port": port,
        "left_out": node.left_out,
        "jobs": [
            {
                "job": job.job,
                "world_size": job.world_size,
                "ranks": [{"pid": r.pid, "rank": r.rank, "still_seconds": r.still_seconds} for r in job.ranks],
            }
            for job in node.jobs
        ],
    }
    if advertise:
        body["address"] = advertise
    return json.dumps(body, separators=(",", ":")).encode()


def from_json(data: bytes) -> tuple[NodeJobs, int, str | None]:
    """(the look, the agent's port, the address it advertises or None)."""
    if len(data) > MAX_REPORT_BYTES:
        raise UsageError(f"agent report of {len(data)} bytes; at most {MAX_REPORT_BYTES}")
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise UsageError(f"agent report is not JSON: {err}") from None
    if not isinstance(body, dict):
        raise UsageError("agent report is not a JSON object")
    host = _text(body.get("host"), "host")
    port = _int(body.get("port"), "port", 1, 65535)
    address = body.get("address")
    if address is not None:
        address = _text(address, "address")
    jobs = _list(body.get("jobs"), "jobs", MAX_JOBS)
    left_out = _int(body.get("left_out", 0), "left_out", 0, MAX_RANK)
    return NodeJobs(host, tuple(_job(j) for j in jobs), left_out), port, address


def _job(raw: object) -> WatchedJob:
    if not isinstance(raw, dict):
        raise UsageError("agent report: a job is not an object")
    world = raw.get("world_size")
    ranks = _list(raw.get("ranks"), "ranks", MAX_RANKS)
    return WatchedJob(
        _text(raw.get("job"), "job"),
        None if world is None else _int(world, "world_size", 1, MAX_RANK),
        tuple(_rank(r) for r in ranks),
    )


def _rank(raw: object) -> WatchedRank:
    if not isinstance(raw, dict):
        raise UsageError("agent report: a rank is not an object")
    rank = raw.get("rank")
    still = raw.get("still_seconds")
    if isinstance(still, bool) or not isinstance(still, (int, float)) or not math.isfinite(still) or still < 0:
        raise UsageError(f"agent report: still_seconds {still!r} is not a finite number >= 0")
    return WatchedRank(
        _int(raw.get("pid"), "pid", 1, MAX_PID),
        None if rank is None else _int(rank, "rank", 0, MAX_RANK),
        float(still),
    )


def _text(value: object, name: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME or not value.isprintable():
        raise UsageError(f"agent report: {name} must be a printable string of 1-{MAX_NAME} characters")
    return value


def _int(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UsageError(f"agent report: {name} {value!r} is not a whole number in [{low}, {high}]")
    return value


def _list(value: object, name: str, limit: int) -> list[object]:
    if not isinstance(value, list) or len(value) > limit:
        raise UsageError(f"agent report: {name} must be a list of at most {limit}")
    return value
