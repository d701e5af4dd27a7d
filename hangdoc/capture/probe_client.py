"""Asking a rank's in-process probe (``hangdoc.probe``) for its flight recorder dump.

The socket is found from the process alone, never from what it says about itself: its
owner's uid and its own pid (the last ``NSpid`` of ``/proc/PID/status``, the pid inside
its container), under ``/proc/PID/root`` (its own ``/tmp``). Before connecting, the
directory must be the process owner's and private (no group or other bits), and the socket
must be a socket of that owner: a socket planted by someone else is never read. The answer
is bounded (``MAX_ANSWER_BYTES``) and read with a deadline; the dump is parsed as JSON
data only (``flight_recorder``). A rank without a probe is the common case: ``None`` with
the reason, never an error.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time

from ..model import FlightRecord
from ..probe import LENGTH, socket_path
from .flight_recorder import FlightRecordInvalid, read_flight_record

MAX_ANSWER_BYTES = 64 * 2**20
NO_PROBE = "no hangdoc probe"  # how the common case's reason starts


def probe_flight(pid: int, timeout: float = 3.0) -> tuple[FlightRecord | None, str]:
    """The flight recorder dump of process ``pid`` through its probe: (record, "") or
    (None, why not)."""
    try:
        uid, inner_pid = _owner_and_inner_pid(pid)
    except (OSError, ValueError) as err:
        return None, f"cannot read the process: {err}"
    path = socket_path(uid, inner_pid, root=f"/proc/{pid}/root")
    try:
        directory = os.lstat(path.parent)
        sock = os.lstat(path)
    except FileNotFoundError:
        return None, f"{NO_PROBE} (hangdoc.probe.start() not called)"
    except OSError as err:
        return None, f"cannot look at its probe: {err.strerror or err}"
    if not stat.S_ISDIR(directory.st_mode) or directory.st_uid != uid or directory.st_mode & 0o077:
        return None, f"{path.parent} is not a private directory of the process's user: not read"
    if not stat.S_ISSOCK(sock.st_mode) or sock.st_uid != uid:
        return None, f"{path} is not a socket of the process's user: not read"
    try:
        answer = _ask(str(path), b"flight\n", timeout)
    except TimeoutError:
        return None, f"its probe did not answer within {timeout:g} s (the process may hold the GIL)"
    except (OSError, ValueError, TypeError) as err:
        return None, f"its probe failed: {err}"
    if not answer.get("ok"):
        return None, f"its probe says: {str(answer.get('error', 'no reason'))[:300]}"
    dump = answer.get("dump")
    if not isinstance(dump, str):
        return None, "its probe sent no dump"
    try:
        return read_flight_record(dump.encode(), source=f"probe of pid {pid}"), ""
    except FlightRecordInvalid as err:
        return None, f"its probe sent a dump hangdoc cannot read: {err}"


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
