"""Asking a rank's in-process probe (``hangdoc.probe``) what only the process can tell: its
flight recorder dump, its step heartbeat, each thread's live exception.

The socket is found through the process itself, never from what it says about itself:
among its own descriptors, a listening Unix socket that ``/proc/PID/net/unix`` names
``<pid>.sock`` in a ``hangdoc-probe*`` directory (``pid`` as the process sees it, the last
``NSpid`` of ``/proc/PID/status``). That path is walked under ``/proc/PID/root`` (the
process's own ``/tmp`` or runtime directory, across containers) one component at a time,
following no link; the directory must be the process owner's with no group or other bits,
the socket a socket of that owner, and the listener at the other end (``SO_PEERCRED``)
the process itself. A socket planted by someone else, or swapped after the check, is
never read. Where the process's descriptors cannot be listed, the name probes used before
issue 23 (``/tmp/hangdoc-probe-<uid>/<pid>.sock``) is tried under the same checks.

The answer is bounded as it is read: at most ``MAX_ANSWER_BYTES``; the first byte within
the caller's timeout (the process builds its answer under the GIL), every later one within
``READ_GAP_S`` of the last and the whole at ``MIN_RATE`` at least, so a probe that drips its
answer is dropped in seconds. It is parsed within a budget (``boundedjson``: at most
``MAX_ANSWER_VALUES`` values, the dump inside at most ``MAX_DUMP_OBJECTS``), so no answer
builds more than ``PEAK_ANSWER_BYTES`` while it is read: the bound an agent multiplies by the
answers it reads at once. Everything in it is checked as data (types, lengths, counts; the
dump by ``flight_recorder``). A rank without a probe is the common case:
``ProbeStatus.NO_PROBE``, never an error.
"""

from __future__ import annotations

import math
import os
import socket
import stat
import struct
import time

from ...model import FlightRecord, Frame, Heartbeat, ProbeAnswer, ProbeStatus, ThreadException, counted
from ...probe import (
    DIR_PREFIX,
    LENGTH,
    MAX_ANSWER_BYTES,
    MAX_EXCEPTIONS,
    MAX_NAME_CHARS,
    MAX_PATH_CHARS,
    legacy_socket_path,
    private_dir,
)
from .boundedjson import JsonTooBig, JsonTooDeep, ascii_json, check_counts, loads_small
from .flight_recorder import read_flight_record

__all__ = ["MAX_ANSWER_BYTES", "PEAK_ANSWER_BYTES", "probe_heartbeat", "probe_state"]

# values one answer may hold, keys included: 64 exceptions of 13 keys and values are 832
MAX_ANSWER_VALUES = 4_096
# objects, lists, strings and numbers the dump may build (counted as boundedjson counts):
# a real gloo dump counts 47 an entry (2,000 entries: 94,051; 20,000: 940,203), so a ring of
# ~11,000 entries fits, 5.5 times the default; 2^19 empty dicts cost ~40 MB
MAX_DUMP_OBJECTS = 1 << 19
_OBJECTS_PER_ENTRY = 47
# the most memory one answer costs its reader while it is read (bench/bench_probe_memory.py:
# the reader's peak RSS over what it held before). A real gloo answer of 2,000 entries adds
# 6 MB, of 10,000 entries 30 MB. Hostile answers of 8 MiB: "{},", "[],", '"ab",' or numbers
# past the budgets, in the answer or in its dump, 16-20 MB; dumps just inside
# MAX_DUMP_OBJECTS padded to 8 MiB, 41-58 MB; one name holding a character past U+FFFF (four
# bytes a character), 56 MB. Before issue 23: 1.65 GB for 64 MB of "{}," in the dump, 420 MB
# for 16 MiB of them in the answer. What an agent multiplies by the answers it reads at once
PEAK_ANSWER_BYTES = 64 * 2**20
# seconds between two reads of one answer once it started: a real answer (1 MB for 2,000
# entries, 10 MB for 20,000) is written with one sendall and arrives in milliseconds
READ_GAP_S = 2.0
MIN_RATE = 4 * 2**20  # bytes a second, over the whole answer once it started: 8 MiB in 2 s
_THREAD_ID_MAX = 2**64 - 1  # a pthread_t
_LINE_MAX = 2**31 - 1
_ACCEPTCON = 0x10000  # /proc/net/unix flags: a listening socket
_STREAM = b"0001"
_CANDIDATES = 8  # sockets of one process tried at most


class _Malformed(ValueError):
    """A part of the probe's answer is not what the protocol says."""


class _Refused(Exception):
    """The probe's socket, or its answer, is not read; the reason."""


class _TooSlow(Exception):
    """The probe started its answer and sent the rest too slowly; the reason."""


def probe_state(pid: int, timeout: float = 3.0) -> ProbeAnswer:
    """Everything process ``pid``'s probe tells, asked once: its flight recorder dump, its
    heartbeat and its threads' live exceptions. Never blocks past ``timeout`` (seconds),
    never holds more than ``PEAK_ANSWER_BYTES`` while it reads."""
    return _ask_probe(pid, "state", timeout)


def probe_heartbeat(pid: int, timeout: float = 1.0) -> ProbeAnswer:
    """Only process ``pid``'s last step heartbeat (cheap enough to poll)."""
    return _ask_probe(pid, "heartbeat", timeout)


def _ask_probe(pid: int, request: str, timeout: float) -> ProbeAnswer:
    try:
        uid, inner_pid = _owner_and_inner_pid(pid)
    except (OSError, ValueError) as err:
        return _failed(f"cannot read the process: {err}")
    try:
        fd = _open_probe_socket(pid, uid, inner_pid)
    except _Refused as err:
        return _failed(str(err))
    if fd is None:
        return ProbeAnswer(
            ProbeStatus.NO_PROBE,
            f"no probe socket found for pid {pid} (no hangdoc probe started: "
            "`hangdoc run`, HANGDOC_PROBE=1 or hangdoc.probe.start())",
        )
    try:
        answer = _ask(f"/proc/self/fd/{fd}", f"{request}\n".encode(), timeout, listener=(pid, uid))
    except (_Refused, _TooSlow) as err:
        return _failed(str(err))
    except TimeoutError:
        return _failed(f"its probe did not answer within {timeout:g} s (the process may hold the GIL)")
    except ConnectionRefusedError:  # the old name's socket, left by a killed process whose pid came back
        return ProbeAnswer(ProbeStatus.NO_PROBE, "no hangdoc probe (a stale socket: nobody listens)")
    except ValueError as err:
        return _failed(f"its probe sent an answer hangdoc cannot read: {err}")
    except (OSError, TypeError) as err:
        return _failed(f"its probe failed: {err}")
    finally:
        os.close(fd)
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
    why = flight.get("error")
    record, reason = None, f"its probe says: {str(why)[:300]}" if why else "its probe sent no flight recorder dump"
    if isinstance(flight.get("dump"), str):
        record, reason = _flight_record(flight, pid)
    left_out = answer.get("exceptions_left_out")
    if type(left_out) is int and left_out > 0:
        reason = "; ".join(
            filter(None, (reason, f"the live exceptions of {counted(left_out, 'more thread')} left out"))
        )
    return ProbeAnswer(ProbeStatus.ANSWERED, reason, record, heartbeat, exceptions)


def _flight_record(flight: dict[str, object], pid: int) -> tuple[FlightRecord | None, str]:
    """The dump in ``flight`` (taken out of it: its text is dropped as soon as it is read),
    or why it cannot be read."""
    dump = flight.pop("dump")
    if not isinstance(dump, str):
        return None, "its probe sent a flight recorder dump that is not text"
    raw = ascii_json(dump)  # one byte a character, whatever characters the dump holds
    del dump
    try:
        check_counts(raw, MAX_DUMP_OBJECTS)
        return read_flight_record(raw, source=f"probe of pid {pid}"), ""
    except JsonTooDeep as err:
        return None, f"its probe sent a flight recorder dump hangdoc cannot read: {err}"
    except JsonTooBig as err:
        return None, (
            f"its probe sent a flight recorder dump hangdoc cannot read: {err} (a ring of more than "
            f"~{MAX_DUMP_OBJECTS // _OBJECTS_PER_ENTRY:,} entries: a smaller TORCH_FR_BUFFER_SIZE fits)"
        )
    except ValueError as err:  # FlightRecordInvalid, not JSON
        return None, f"its probe sent a flight recorder dump hangdoc cannot read: {err}"


def _failed(reason: str) -> ProbeAnswer:
    return ProbeAnswer(ProbeStatus.FAILED, reason)


def _open_probe_socket(pid: int, uid: int, inner_pid: int) -> int | None:
    """An ``O_PATH`` descriptor of process ``pid``'s probe socket, once it passes the checks;
    None when it has none; ``_Refused`` with the first reason when every one it has fails
    them."""
    try:
        paths = _listening(pid, inner_pid)
    except OSError:  # its descriptors cannot be listed: the old name, under the same checks
        paths = [str(legacy_socket_path(uid, inner_pid))]
    refused: _Refused | None = None
    for path in paths[:_CANDIDATES]:
        try:
            return _open_checked(pid, path, uid)
        except FileNotFoundError:
            continue
        except _Refused as err:
            refused = refused or err
    if refused is not None:
        raise refused
    return None


def _listening(pid: int, inner_pid: int) -> list[str]:
    """The paths of the Unix sockets process ``pid`` listens on that are named as a probe's
    (``<inner_pid>.sock`` in a ``hangdoc-probe*`` directory): the kernel's table of the
    process's network namespace names each socket's inode and path; the process's own
    descriptors say which inodes are its."""
    suffix = f"/{inner_pid}.sock\n".encode()
    named: dict[str, list[str]] = {}
    with open(f"/proc/{pid}/net/unix", "rb") as table:
        for line in table:
            if not line.endswith(suffix) or b"/" + DIR_PREFIX.encode() not in line:
                continue
            fields = line[:-1].split(None, 7)  # Num RefCount Protocol Flags Type St Inode Path
            if len(fields) != 8 or fields[4] != _STREAM or not int(fields[3], 16) & _ACCEPTCON:
                continue
            path = os.fsdecode(fields[7])
            if path.rsplit("/", 2)[-2].startswith(DIR_PREFIX):
                named.setdefault(fields[6].decode("ascii", "replace"), []).append(path)
    if not named:
        return []
    held: list[str] = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed since
            continue
        if link.startswith("socket:[") and link[8:-1] in named:
            held += named.pop(link[8:-1])
    return held


def _open_checked(pid: int, path: str, uid: int) -> int:
    """``path`` opened (``O_PATH``) under ``/proc/PID/root`` a component at a time, following
    no link, once its directory is ``uid``'s and private and it is a socket of ``uid``."""
    parts = path.split("/")
    if len(parts) < 3 or parts[0] or any(part in ("", ".", "..") for part in parts[1:]):
        raise _Refused(f"the probe socket's path {path!r} is not a plain absolute path: not read")
    try:
        fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise _Refused(f"cannot look at its probe: {err.strerror or err}") from None
    try:
        for name in parts[1:-1]:
            try:
                step = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY, dir_fd=fd)
            except FileNotFoundError:
                raise
            except OSError:  # ENOTDIR: a link (O_NOFOLLOW) or a file
                raise _Refused(f"{path}: {name} is a link or not a directory: not followed") from None
            os.close(fd)
            fd = step
        if not private_dir(os.fstat(fd), uid):
            raise _Refused(
                f"probe directory {os.path.dirname(path)} is not private to the process's user (uid {uid}): not read"
            )
        sock = os.open(parts[-1], os.O_PATH | os.O_NOFOLLOW, dir_fd=fd)
    finally:
        os.close(fd)
    found = os.fstat(sock)
    if not stat.S_ISSOCK(found.st_mode) or found.st_uid != uid:
        os.close(sock)
        raise _Refused(f"{path} is not a socket of the process's user: not read")
    return sock


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
    if not (
        _text(type_name, MAX_NAME_CHARS)
        and type_name
        and _text(function, MAX_NAME_CHARS)
        and _text(filename, MAX_PATH_CHARS)
    ):
        raise _Malformed(f"exceptions[{i}] has no type, function and file names")
    return ThreadException(ident, thread_name, type_name, Frame(function, filename, line or None))  # type: ignore[arg-type]


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


def _ask(path: str, request: bytes, timeout: float, listener: tuple[int, int] | None = None) -> dict[str, object]:
    """The probe's answer at ``path`` to ``request``, within ``timeout`` seconds in all;
    ``listener``: the (pid, uid) that must be listening there."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(max(min(timeout, READ_GAP_S), 1e-3))  # a full backlog holds connect
        conn.connect(path)
        if listener is not None:
            _check_listener(conn, *listener)
        conn.sendall(request)
        raw = _receive(conn, deadline)
    try:
        text = raw.decode("ascii")  # the probe writes json.dumps' ASCII
    except UnicodeDecodeError:
        raise ValueError("the answer is not ASCII JSON") from None
    del raw
    data = loads_small(text, MAX_ANSWER_VALUES)
    del text
    if not isinstance(data, dict):
        raise TypeError("the answer is not a JSON object")
    return data


def _check_listener(conn: socket.socket, pid: int, uid: int) -> None:
    """The process at the other end is ``pid`` of ``uid`` (the kernel's word, from when it
    listened): never another process's socket put in its place."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    peer_pid, peer_uid, _gid = struct.unpack("3i", creds)
    if (peer_pid, peer_uid) != (pid, uid):
        raise _Refused(
            f"its probe socket is listened on by pid {peer_pid} of uid {peer_uid}, not by the process: not read"
        )


def _receive(conn: socket.socket, deadline: float) -> bytearray:
    """The answer's bytes. The first may come until ``deadline`` (the process builds its
    answer under the GIL); from then on every read within ``READ_GAP_S`` and the whole at
    ``MIN_RATE``, never past ``deadline``."""
    head = bytearray(LENGTH.size)
    started = _fill(conn, head, deadline, None, 0, 0)
    (size,) = LENGTH.unpack(head)
    if size > MAX_ANSWER_BYTES:
        raise ValueError(f"an answer of {size:,} bytes, more than {MAX_ANSWER_BYTES:,}")
    body = bytearray(size)
    _fill(conn, body, deadline, started, LENGTH.size, LENGTH.size + size)
    return body


def _fill(
    conn: socket.socket, buf: bytearray, deadline: float, started: float | None, before: int, total: int
) -> float:
    """Read ``buf`` full; when its answer began (``started``: None until its first byte).
    ``before``: the answer's bytes read already; ``total``: its length (0: not known yet)."""
    got = 0
    with memoryview(buf) as view:
        while got < len(buf):
            now = time.monotonic()
            wait = deadline - now
            if started is not None:
                wait = min(wait, READ_GAP_S, started + READ_GAP_S + max(total, before + len(buf)) / MIN_RATE - now)
            if wait <= 0:
                raise TimeoutError if started is None else _TooSlow(_slow(before + got, total, now - started))
            conn.settimeout(wait)
            try:
                n = conn.recv_into(view[got:], min(len(buf) - got, 1 << 20))
            except TimeoutError:
                if started is None:
                    raise
                raise _TooSlow(_slow(before + got, total, time.monotonic() - started)) from None
            if not n:
                raise ValueError("the probe closed the connection early")
            if started is None:
                started = time.monotonic()
            got += n
    assert started is not None  # buf is never empty when nothing was read yet
    return started


def _slow(got: int, total: int, seconds: float) -> str:
    of = f"{got:,} of {total:,}" if total else f"{got:,}"
    return (
        f"its probe sent {of} bytes of its answer in {seconds:.1f} s, slower than hangdoc reads (a gap "
        f"of {READ_GAP_S:g} s at most, {MIN_RATE // 2**20} MiB/s at least): dropped"
    )
