"""Reading the step heartbeats that ``hangdoc.heartbeat()`` writes (see ``heartbeat``).

Two ways in: every record of a directory (``read_dir``: the private directory ``hangdoc
watch`` gives the command it wraps), or the record of one process found through ``/proc``
(``read_process``: what an agent or attach mode does for a job's ranks). The second works
for ranks in containers: the record is looked up in the process's own mount namespace
(``/proc/PID/root``), under its own ``$HANGDOC_HEARTBEAT_DIR``, by its pid as it knows it
(the last ``NSpid``) and its PID namespace (records of containers sharing one /dev/shm
do not collide).
"""

from __future__ import annotations

import os
import stat
import struct
import time
from collections.abc import Iterable
from pathlib import Path

from ...heartbeat import MAGIC, NO_STEP, RECORD, VERSION, heartbeat_dir, pid_namespace, record_name
from ...model import Heartbeat
from .sourcefs import read_as


def _parse(data: bytes, now_ns: int, pid: int | None = None) -> Heartbeat | None:
    """A record as a ``Heartbeat`` of ``pid`` (default: the pid the writer recorded)."""
    try:
        magic, version, own_pid, in_step, number, beats, last = RECORD.unpack_from(data)
    except struct.error:
        return None
    if magic != MAGIC or version != VERSION or beats <= 0:
        return None
    return Heartbeat(
        own_pid if pid is None else pid,
        None if number == NO_STEP else number,
        beats,
        bool(in_step),
        max(now_ns - last, 0) / 1e9,
    )


def read_dir(directory: Path | None = None) -> dict[int, Heartbeat]:
    """The records in ``directory`` (default ``heartbeat_dir()``), by the writer's pid."""
    out: dict[int, Heartbeat] = {}
    root = directory or heartbeat_dir()
    try:
        paths = list(root.glob("hb-*.bin"))
    except OSError:
        return out
    now = time.monotonic_ns()
    for path in paths:
        data = _read_record(str(path))
        beat = _parse(data, now) if data is not None else None
        if beat is not None:
            out[beat.pid] = beat
    return out


def _environ(pid: int, name: str) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return None
    key = name.encode() + b"="
    for entry in env.split(b"\0"):
        if entry.startswith(key):
            return entry[len(key) :].decode(errors="replace") or None
    return None


def _environ_dir(pid: int) -> str | None:
    return _environ(pid, "HANGDOC_HEARTBEAT_DIR")


def _own_pid(pid: int) -> int:
    """The pid the process sees for itself (innermost PID namespace)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return pid


def read_process(pid: int) -> Heartbeat | None:
    """The heartbeat record of process ``pid``, or None when it never beat.

    The directory is the process's word (its environment), so the record is opened only as
    the process itself could open it, in its own root, without following any link
    (``hangdoc.sourcefs.read_as``)."""
    directory = (_environ_dir(pid) or _default_dir(pid)).rstrip("/")
    own = _own_pid(pid)
    for name in (record_name(own, pid_namespace(str(pid))), record_name(own, None)):
        data = read_as(pid, f"{directory}/{name}", RECORD.size)
        if data is not None:
            return _parse(data, time.monotonic_ns(), pid)
    return None


def _read_record(path: str) -> bytes | None:
    """A record's bytes, or None. Never follows a final symlink and never blocks: a FIFO
    planted under a record's name must not hang a reader (an agent serves many callers)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, RECORD.size)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_processes(pids: Iterable[int]) -> dict[int, Heartbeat]:
    return {pid: beat for pid in pids if (beat := read_process(pid)) is not None}


def _default_dir(pid: int) -> str:
    """``heartbeat_dir()`` as the writer computed it, in its own mount namespace."""
    if os.path.isdir(f"/proc/{pid}/root/dev/shm"):
        return "/dev/shm/hangdoc"
    # tempfile.gettempdir()'s order; its last fallbacks (the cwd) are not worth guessing
    temp = next((v for k in ("TMPDIR", "TEMP", "TMP") if (v := _environ(pid, k))), "/tmp")
    return os.path.join(temp, "hangdoc")
