"""NCCL's RAS report of a job: ``ncclras -f json`` run on one node, read into the model.

Since NCCL 2.24 every NCCL process runs a RAS thread; the threads of a job watch each other
over TCP and answer queries on ``localhost:28028`` (``NCCL_RAS_ADDR`` moves it). Since
2.28.7 the ``ncclras`` client prints the answer as JSON (``-f json``): every communicator
with its ranks (host IP, pid, CUDA and NVML device, init state, async error, finalize /
destroy / abort flags, how many collectives of each type the rank has launched) and its
*missing* ranks, the ones RAS got no answer from (``unresponsive``; ``considered_dead``
once unreachable for 60 s). NCCL's user guide, "RAS", documents the format:
https://github.com/NVIDIA/nccl/blob/master/docs/userguide/source/troubleshooting/ras.rst

NCCL 2.28.7 and 2.28.9 print malformed JSON whenever a communicator has a missing rank:
``jsonWriteMissingRank`` in ``src/ras/client_support.cc`` ends the ``"nvml_dev": N`` line
without the comma before ``"status": {`` (fixed in 2.29.2). ``read_ras_report`` repairs
exactly that form, whatever the whitespace, and says so in the report's ``source``; any
other defect is an error.

``query_ras`` runs the client only when the job's processes on the node have loaded
``libnccl`` (read from ``/proc/PID/maps``; torch's CUDA wheels load it with torch, so a
gloo job may have it too: RAS then has no communicator to report), there is a client
(``ncclras`` on ``PATH``) and no process disabled RAS (``NCCL_RAS_ENABLE=0``); inside the
ranks' network namespace when it is not the caller's (``nsenter -n``: the RAS port is on the
ranks' loopback); with a deadline. Otherwise it says why not. The query is NCCL's own: the
RAS threads exchange their state over their own sockets; the job's communicators, streams and GPUs are not touched.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from ...addresses import is_loopback_host
from ...model import MAX_WORLD_SIZE, PID_MAX, NcclRasReport, RasCommunicator, RasRank
from .gpu import loaded_library

RAS_BINARY = "ncclras"
DEFAULT_RAS_TIMEOUT = 5.0  # seconds: NCCL's own default wait for the other processes
MAX_RAS_BYTES = 64 * 2**20  # ~450 bytes a rank: 100,000 ranks in a few communicators
_NSENTER_SLACK = 3.0  # seconds the client may take beyond its RAS wait (connect, print)

# the 2.28.7/2.28.9 defect: no comma between a missing rank's nvml_dev and its status
_SOURCE_KEY = "hangdoc_source"  # not RAS's: where an agent's report came from
_MISSING_COMMA = re.compile(r'("nvml_dev"\s*:\s*-?\d+)(\s*"status"\s*:)')


class RasReportInvalid(ValueError):
    """The text is not a RAS JSON report hangdoc can read."""


@dataclass(frozen=True, slots=True)
class RasQuery:
    """What asking RAS gave: a report, or None and why there is none; ``quiet``: a reason
    not worth a note (the job does not use NCCL, no client is installed)."""

    report: NcclRasReport | None
    reason: str = ""
    quiet: bool = False


# ------------------------------------------------------------------ parsing


def read_ras_report(raw: bytes | str, source: str = "") -> NcclRasReport:
    """The report in ``raw`` (``ncclras -f json`` output); ``RasReportInvalid`` if it is not
    one. The malformed JSON of NCCL 2.28.7/2.28.9 is repaired (module doc)."""
    if len(raw) > MAX_RAS_BYTES:
        raise RasReportInvalid(f"{len(raw):,} bytes, more than any RAS report ({MAX_RAS_BYTES:,})")
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    try:
        data = json.loads(text)
        repaired = False
    except (json.JSONDecodeError, RecursionError, ValueError) as first:
        fixed, count = _MISSING_COMMA.subn(r"\1,\2", text)
        if not count:
            raise RasReportInvalid(f"not JSON: {_json_error(first)}") from None
        try:
            data = json.loads(fixed)
        except (json.JSONDecodeError, RecursionError, ValueError) as err:
            raise RasReportInvalid(
                f"not JSON, even with NCCL 2.28's missing commas put back: {_json_error(err)}"
            ) from None
        repaired = True
    if not isinstance(data, dict) or not isinstance(data.get("communicators"), list):
        raise RasReportInvalid("not a RAS report: no 'communicators' list")
    comms = tuple(_communicator(c, i) for i, c in enumerate(data["communicators"]))
    ras = _object(data.get("ras"))
    version = data.get("nccl_version")
    note = "malformed NCCL 2.28 JSON repaired: a missing rank's comma after nvml_dev"
    earlier = data.get(_SOURCE_KEY)  # how an agent got it (``ras_report_to_json``)
    said = (source, earlier[:300] if isinstance(earlier, str) else "", note if repaired else "")
    return NcclRasReport(
        nccl_version=version[:40] if isinstance(version, str) else "",
        communicators=comms,
        timeouts=_int(ras.get("timeouts_count"), "ras.timeouts_count", 0, 2**31) or 0,
        collection_seconds=_seconds(ras.get("collection_time_sec")),
        source="; ".join(s for s in said if s),
    )


def ras_report_to_json(report: NcclRasReport) -> str:
    """``report`` as JSON of the RAS client's shape (what ``read_ras_report`` reads back
    as the same report), with its ``source`` under ``hangdoc_source``: how an agent sends it."""

    def rank(r: RasRank) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": r.comm_rank,
            "host": r.host or "unknown",
            "pid": -1 if r.pid is None else r.pid,
            "cuda_dev": -1 if r.cuda_dev is None else r.cuda_dev,
            "nvml_dev": -1 if r.nvml_dev is None else r.nvml_dev,
        }
        if r.missing:
            out["status"] = {"unresponsive": r.unresponsive, "considered_dead": r.dead}
            return out
        status: dict[str, Any] = {
            "finalize_called": r.finalize_called,
            "destroy_flag": r.destroy_flag,
            "abort_flag": r.abort_flag,
        }
        if r.init_state is not None:
            status["init_state"] = r.init_state
        if r.async_error is not None:
            status["async_error"] = r.async_error
        out["status"] = status
        out["collective_counts"] = dict(r.collectives)
        return out

    return json.dumps(
        {
            "nccl_version": report.nccl_version,
            "communicators": [
                {
                    "hash": c.hash,
                    "size": c.size,
                    "ranks": [rank(r) for r in c.ranks if not r.missing],
                    "missing_ranks": [rank(r) for r in c.ranks if r.missing],
                }
                for c in report.communicators
            ],
            "ras": {"collection_time_sec": report.collection_seconds, "timeouts_count": report.timeouts},
            _SOURCE_KEY: report.source,
        }
    )


def _json_error(err: Exception) -> str:
    if isinstance(err, json.JSONDecodeError):
        return f"{err.msg} at line {err.lineno} column {err.colno}"
    return "nested too deeply" if isinstance(err, RecursionError) else str(err)[:200]


def _communicator(raw: object, index: int) -> RasCommunicator:
    where = f"communicators[{index}]"
    if not isinstance(raw, dict):
        raise RasReportInvalid(f"{where} is not an object")
    digest = raw.get("hash")
    size = _int(raw.get("size"), f"{where}.size", 0, MAX_WORLD_SIZE)
    present = _list(raw.get("ranks"), f"{where}.ranks")
    missing = _list(raw.get("missing_ranks"), f"{where}.missing_ranks")
    ranks = [_rank(r, f"{where}.ranks[{i}]", missing=False) for i, r in enumerate(present)]
    ranks += [_rank(r, f"{where}.missing_ranks[{i}]", missing=True) for i, r in enumerate(missing)]
    return RasCommunicator(
        hash=digest if isinstance(digest, str) else "",
        size=size or 0,
        ranks=tuple(sorted(ranks, key=lambda r: r.comm_rank)),
    )


def _rank(raw: object, where: str, missing: bool) -> RasRank:
    if not isinstance(raw, dict):
        raise RasReportInvalid(f"{where} is not an object")
    comm_rank = _int(raw.get("rank"), f"{where}.rank", 0, MAX_WORLD_SIZE - 1)
    if comm_rank is None:
        raise RasReportInvalid(f"{where} has no rank number")
    host = raw.get("host")
    status = _object(raw.get("status"))
    counts = _object(raw.get("collective_counts"))
    return RasRank(
        comm_rank=comm_rank,
        host=host if isinstance(host, str) and host != "unknown" else "",
        pid=_int(raw.get("pid"), f"{where}.pid", -1, PID_MAX, unknown=-1),
        cuda_dev=_int(raw.get("cuda_dev"), f"{where}.cuda_dev", -1, 2**31, unknown=-1),
        nvml_dev=_int(raw.get("nvml_dev"), f"{where}.nvml_dev", -1, 2**31, unknown=-1),
        missing=missing,
        unresponsive=status.get("unresponsive") is True,
        dead=status.get("considered_dead") is True,
        init_state=_int(status.get("init_state"), f"{where}.status.init_state", -(2**31), 2**31),
        async_error=_int(status.get("async_error"), f"{where}.status.async_error", -(2**31), 2**31),
        finalize_called=status.get("finalize_called") is True,
        destroy_flag=status.get("destroy_flag") is True,
        abort_flag=status.get("abort_flag") is True,
        collectives=tuple(
            (name, count)
            for name, value in counts.items()
            if (count := _int(value, f"{where}.collective_counts.{name}", 0, 2**63)) is not None
        ),
    )


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RasReportInvalid(f"{where} is not a list")
    return value


def _int(value: object, where: str, lo: int, hi: int, unknown: int | None = None) -> int | None:
    """``value`` as an int in [lo, hi], None when absent or ``unknown`` (RAS's -1)."""
    if value is None:
        return None
    if type(value) is not int or not lo <= value <= hi:
        raise RasReportInvalid(f"{where} is {str(value)[:40]!r}, not a whole number from {lo} to {hi}")
    return None if value == unknown else value


def _seconds(value: object) -> float:
    """A non-negative, finite number of seconds, else 0.0."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e9:
        return float(value)
    return 0.0


# ------------------------------------------------------------------ running the client


def find_ncclras() -> str | None:
    """The ``ncclras`` client on ``PATH`` (NCCL builds it into ``build/bin``), or None."""
    return shutil.which(RAS_BINARY)


def query_ras(pids: Sequence[int], timeout: float = DEFAULT_RAS_TIMEOUT, host: str = "") -> RasQuery:
    """NCCL's RAS report of the job whose rank processes on this node are ``pids``, or why
    there is none (module doc). ``timeout``: RAS's wait for the other processes; the client
    is killed ``_NSENTER_SLACK`` seconds after it."""
    nccl = [pid for pid in pids if loaded_library(pid, b"/libnccl")]
    if not nccl:
        return RasQuery(None, "the job's processes on this node have not loaded libnccl", quiet=True)
    binary = find_ncclras()
    if binary is None:
        return RasQuery(None, f"no {RAS_BINARY} client on PATH (NCCL 2.28.7 or later builds it)", quiet=True)
    envs = {pid: _ras_env(pid) for pid in nccl}
    enabled = [pid for pid in nccl if envs[pid].get("NCCL_RAS_ENABLE", "1").strip() != "0"]
    if not enabled:
        return RasQuery(None, "the job disabled NCCL's RAS (NCCL_RAS_ENABLE=0)")
    pid = enabled[0]
    argv = [binary, "-f", "json", "-t", str(max(1, int(timeout)))]
    address = envs[pid].get("NCCL_RAS_ADDR", "").strip()
    if address:
        ras_host, sep, port = address.rpartition(":")
        if not sep or not port.isascii() or not port.isdigit():
            return RasQuery(None, f"NCCL_RAS_ADDR={address[:80]!r} is not HOST:PORT")
        ras_host = ras_host.strip("[]") or "localhost"
        if not is_node_address(ras_host, pid):
            # the variable is the job's word: hangdoc connects only to the node itself
            return RasQuery(
                None,
                f"NCCL_RAS_ADDR names {ras_host[:80]!r}, not an address of this node; "
                "hangdoc asks RAS only on the node's own addresses",
            )
        argv += ["-h", ras_host, "-p", port]
    if _netns(pid) != _netns(os.getpid()):
        nsenter = shutil.which("nsenter")
        if nsenter is None:
            return RasQuery(None, "the ranks run in another network namespace and nsenter is missing")
        argv = [nsenter, "-t", str(pid), "-n", *argv]
    return _run(argv, timeout + _NSENTER_SLACK, f"{RAS_BINARY} on {host}" if host else RAS_BINARY)


def _run(argv: list[str], deadline: float, source: str) -> RasQuery:
    try:
        done = subprocess.run(argv, capture_output=True, timeout=deadline, check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return RasQuery(None, f"{RAS_BINARY} did not answer within {deadline:.0f} s")
    except OSError as err:
        return RasQuery(None, f"cannot run {RAS_BINARY}: {err.strerror or err}")
    if done.returncode != 0 or not done.stdout.strip():
        if b"Failed to connect to the NCCL RAS service" in done.stderr:
            # nothing listens: no NCCL communicator on the node yet (a gloo job on a CUDA
            # build of torch has libnccl loaded all the same)
            return RasQuery(None, "no NCCL RAS service answered on the node", quiet=True)
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        why = said[0][:200] if said else f"exit status {done.returncode}"
        return RasQuery(None, f"{RAS_BINARY} gave no report: {why}")
    try:
        return RasQuery(read_ras_report(done.stdout, source))
    except RasReportInvalid as err:
        # an NCCL before 2.28.7 answers `-f json` with an error; one that printed text is said
        return RasQuery(None, f"{RAS_BINARY} printed no report hangdoc can read: {err}")


def _ras_env(pid: int) -> Mapping[str, str]:
    """The process's NCCL_RAS_* start-up variables (nothing else is kept)."""
    try:
        env = psutil.Process(pid).environ()
    except (psutil.Error, OSError):
        return {}
    return {k: v for k, v in env.items() if k in ("NCCL_RAS_ENABLE", "NCCL_RAS_ADDR")}


def is_node_address(host: str, pid: int) -> bool:
    """Whether ``host`` is ``localhost`` or an IP literal assigned to an interface in the
    network namespace of ``pid`` (its kernel tables, ``/proc/PID/net``): never a name to look
    up, never another host."""
    if is_loopback_host(host):
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    return addr in _local_addresses(pid)


def _local_addresses(pid: int) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses of the interfaces in ``pid``'s network namespace: IPv4 from the
    routing trie's ``/32 host LOCAL`` entries, IPv6 from ``if_inet6``."""
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    try:
        with open(f"/proc/{pid}/net/fib_trie", encoding="ascii", errors="replace") as trie:
            last = ""
            for line in trie:
                text = line.strip()
                if text.startswith("|--"):
                    last = text[3:].strip()
                elif text.startswith("/32 host LOCAL") and last:
                    try:
                        found.add(ipaddress.IPv4Address(last))
                    except ValueError:
                        pass
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/net/if_inet6", encoding="ascii", errors="replace") as table:
            for line in table:
                word = line.split()[0] if line.split() else ""
                try:
                    found.add(ipaddress.IPv6Address(int(word, 16)))
                except ValueError:
                    pass
    except OSError:
        pass
    return found


def _netns(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None
