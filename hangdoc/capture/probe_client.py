"""Asking a rank's in-process probe (``hangdoc.probe``) what only the process can tell: its
flight recorder dump, its step heartbeat, each thread's live exception.

The socket is found from the process alone, never from what it says about itself: its
owner's uid and its own pid (the last ``NSpid`` of ``/proc/PID/status``, the pid inside
its container), under ``/proc/PID/root`` (its own ``/tmp``). Before connecting, the
directory must be the process owner's and private (no group or other bits), and the socket
must be a socket of that owner: a socket planted by someone else is never read. The answer
is bounded (``MAX_ANSWER_BYTES``) and read with a deadline; everything in it is checked as
data (types, lengths, counts; the dump by ``flight_recorder``). A rank without a probe is
the common case: ``ProbeStatus.NO_PROBE``, never an error.
"""

from __future__ import annotations

import json
import math
import os
import socket
import stat
import time
from pathlib import Path

from ..model import Frame, Heartbeat, ProbeAnswer, ProbeStatus, ThreadException
from ..probe import LENGTH, MAX_EXCEPTIONS, MAX_NAME_CHARS, MAX_PATH_CHARS, socket_path
from .flight_recorder import FlightRecordInvalid, read_flight_record

MAX_ANSWER_BYTES = 64 * 2**20
_THREAD_ID_MAX = 2**64 - 1  # a pthread_t
_LINE_MAX = 2**31 - 1


class _Malformed(ValueError):
    """A part of the probe's answer is not what the protocol says."""


def has_probe(pid: int) -> bool:
    """Whether process ``pid`` has a probe socket at all (one ``lstat``): the cheap check
    before a poll asks."""
    try:
        uid, inner_pid = _owner_and_inner_pid(pid)
        return stat.S_ISSOCK(os.lstat(socket_path(uid, inner_pid, root=f"/proc/{pid}/root")).st_mode)
    except (OSError, ValueError):
        return False


def probe_state(pid: int, timeout: float = 3.0) -> ProbeAnswer:
    """Everything process ``pid``'s probe tells, asked once: its flight recorder dump, its
    heartbeat and its threads' live exceptions."""
    return _ask_probe(pid, "state", timeout)


def probe_heartbeat(pid: int, timeout: float = 1.0) -> ProbeAnswer:
    """Only process ``pid``'s last step heartbeat (cheap enough to poll)."""
    return _ask_probe(pid, "heartbeat", timeout)


def _ask_probe(pid: int, request: str, timeout: float) -> ProbeAnswer:
    path = _checked_socket(pid)
    if isinstance(path, ProbeAnswer):
        return path
    try:
        answer = _ask(str(path), f"{request}\n".encode(), timeout)
    except TimeoutError:
        return _failed(f"its probe did not answer within {timeout:g} s (the process may hold the GIL)")
    except ConnectionRefusedError:  # a socket left by a killed process whose pid came back
        return ProbeAnswer(ProbeStatus.NO_PROBE, "no hangdoc probe (a stale socket: nobody listens)")
    except (OSError, ValueError, TypeError) as err:
        return _failed(f"its probe failed: {err}")
    if not answer.get("ok"):
        return _failed(f"its probe says: {str(answer.get('error', 'no reason'))[:300]}")
    try:
        heartbeat = _heartbeat(answer.get("heartbeat"), pid)
        if request == "heartbeat":
            return ProbeAnswer(ProbeStatus.ANSWERED, heartbeat=heartbeat)
        exceptions = _exceptions(answer.get("exceptions"))
        flight = answer.get("flight")
        if not isinstance(flight, dict):
            raise _Malformed("'flight' is not an object")
    except _Malformed as err:
        return _failed(f"its probe sent an answer hangdoc cannot read: {err}")
    dump, why = flight.get("dump"), flight.get("error")
    record, reason = None, f"its probe says: {str(why)[:300]}" if why else "its probe sent no flight recorder dump"
    if isinstance(dump, str):
        try:
            record, reason = read_flight_record(dump.encode(), source=f"probe of pid {pid}"), ""
        except FlightRecordInvalid as err:
            reason = f"its probe sent a flight recorder dump hangdoc cannot read: {err}"
    left_out = answer.get("exceptions_left_out")
    if type(left_out) is int and left_out > 0:
        reason = "; ".join(filter(None, (reason, f"the live exceptions of {left_out} more thread(s) left out")))
    return ProbeAnswer(ProbeStatus.ANSWERED, reason, record, heartbeat, exceptions)


def _failed(reason: str) -> ProbeAnswer:
    return ProbeAnswer(ProbeStatus.FAILED, reason)


def _checked_socket(pid: int) -> Path | ProbeAnswer:
    """The probe socket of ``pid`` once it is known to be its owner's, or why not."""
    try:
        uid, inner_pid = _owner_and_inner_pid(pid)
    except (OSError, ValueError) as err:
        return _failed(f"cannot read the process: {err}")
    path = socket_path(uid, inner_pid, root=f"/proc/{pid}/root")
    try:
        directory = os.lstat(path.parent)
        sock = os.lstat(path)
    except FileNotFoundError:
        return ProbeAnswer(ProbeStatus.NO_PROBE, "no hangdoc probe (not started: `hangdoc run`, HANGDOC_PROBE=1 "
                           "or hangdoc.probe.start())")
    except OSError as err:
        return _failed(f"cannot look at its probe: {err.strerror or err}")
    if not stat.S_ISDIR(directory.st_mode) or directory.st_uid != uid or directory.st_mode & 0o077:
        return _failed(f"{path.parent} is not a private directory of the process's user: not read")
    if not stat.S_ISSOCK(sock.st_mode) or sock.st_uid != uid:
        return _failed(f"{path} is not a socket of the process's user: not read")
    return path


def _heartbeat(raw: object, pid: int) -> Heartbeat | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _Malformed("'heartbeat' is not an object")
    step, beats, in_step, age = raw.get("step"), raw.get("beats"), raw.get("in_step"), raw.get("age_seconds")
    if step is not None and type(step) is not int:
        raise _Malformed("heartbeat step is not a whole number")
    if not (type(beats) is int and beats > 0 and type(in_step) is bool):
        raise _Malformed("heartbeat beats or in_step is not what a heartbeat holds")
    if not (isinstance(age, (int, float)) and type(age) is not bool and math.isfinite(age) and age >= 0):
        raise _Malformed("heartbeat age is not a finite number of seconds")
    return Heartbeat(pid, step, beats, in_step, float(age))


def _exceptions(raw: object) -> tuple[ThreadException, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_EXCEPTIONS:
        raise _Malformed(f"'exceptions' is not a list of at most {MAX_EXCEPTIONS}")
    return tuple(_exception(item, i) for i, item in enumerate(raw))


def _exception(raw: object, i: int) -> ThreadException:
    if not isinstance(raw, dict):
        raise _Malformed(f"exceptions[{i}] is not an object")
    ident, thread_name, line = raw.get("thread_id"), raw.get("thread_name"), raw.get("line")
    if type(ident) is not int or not 0 <= ident <= _THREAD_ID_MAX:
        raise _Malformed(f"exceptions[{i}].thread_id is not a thread id")
    if line is not None and (type(line) is not int or not 0 <= line <= _LINE_MAX):
        raise _Malformed(f"exceptions[{i}].line is not a line number")
    if thread_name is not None and not _text(thread_name, MAX_NAME_CHARS):
        raise _Malformed(f"exceptions[{i}].thread_name is not a name")
    type_name, function, filename = raw.get("type"), raw.get("function"), raw.get("file")
    if not (_text(type_name, MAX_NAME_CHARS) and type_name and _text(function, MAX_NAME_CHARS)
            and _text(filename, MAX_PATH_CHARS)):
        raise _Malformed(f"exceptions[{i}] has no type, function and file names")
    return ThreadException(ident, thread_name, type_name,  # type: ignore[arg-type]
                           Frame(function, filename, line or None))  # type: ignore[arg-type]


def _text(value: object, limit: int) -> bool:
    return isinstance(value, str) and len(value) <= limit


def _owner_and_inner_pid(pid: int) -> tuple[int, int]:
    uid = inner = None
    with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
        for line in f:
            if line.startswith("Uid:"):
                uid = int(line.split()[1])
            elif line.startswith("NSpid:"):
                inner = int(line.split()[-1])
    if uid is None:
        raise ValueError("no Uid line in its status")
    return uid, inner if inner is not None else pid


def _ask(path: str, request: bytes, timeout: float) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(path)
        conn.sendall(request)
        head = _read(conn, LENGTH.size, deadline)
        (size,) = LENGTH.unpack(head)
        if size > MAX_ANSWER_BYTES:
            raise ValueError(f"an answer of {size:,} bytes, more than {MAX_ANSWER_BYTES:,}")
        data = json.loads(_read(conn, size, deadline))
    if not isinstance(data, dict):
        raise TypeError("the answer is not a JSON object")
    return data


def _read(conn: socket.socket, size: int, deadline: float) -> bytes:
    parts: list[bytes] = []
    left = size
    while left:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        conn.settimeout(remaining)
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            raise ValueError("the probe closed the connection early")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)
