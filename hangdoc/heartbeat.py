"""In-process step heartbeats: ``hangdoc.heartbeat(step)`` and ``with hangdoc.step():``.

Dependency-free and cheap (a few hundred nanoseconds a call): each process writes its last
step number, the number of beats and the time of the last beat (CLOCK_MONOTONIC, shared
by all processes of a host) into a small memory-mapped record in ``/dev/shm/hangdoc``
(``$HANGDOC_HEARTBEAT_DIR`` to change it). A watchdog reads the records of a job's ranks
(``hangdoc.beats``) to know exactly when steps stopped. Nothing is sent anywhere and
nothing blocks: when the record cannot be created, beats are silently dropped.

A forked child (a DataLoader worker) does not inherit the parent's record: its beats go
to a record of its own.
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
import time
from pathlib import Path
from typing import Self

MAGIC = 0x48444842  # "HDHB"
VERSION = 1  # of the record layout
# magic, version, pid, in_step flag, step, beats, last beat (monotonic ns)
RECORD = struct.Struct("<IIiiqqq")
NO_STEP = -(2**63)


def heartbeat_dir() -> Path:
    configured = os.environ.get("HANGDOC_HEARTBEAT_DIR")
    if configured:
        return Path(configured)
    shm = Path("/dev/shm")
    return (shm if shm.is_dir() else Path(tempfile.gettempdir())) / "hangdoc"


def pid_namespace(pid: str) -> str | None:
    """The inode of ``pid``'s PID namespace: two containers sharing one /dev/shm can both
    have a pid 7, never in the same namespace."""
    try:
        link = os.readlink(f"/proc/{pid}/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return None
    return link[link.find("[") + 1 : -1] or None


def record_name(pid: int, namespace: str | None) -> str:
    return f"hb-{pid}-{namespace}.bin" if namespace else f"hb-{pid}.bin"


_map: mmap.mmap | None = None
_failed = False
_beats = 0
_step = NO_STEP
_pid = os.getpid()


def _open() -> mmap.mmap | None:
    """This process's record, created on first use; None (and no retry) if it cannot be."""
    global _map, _failed
    if _failed:
        return None
    try:
        directory = heartbeat_dir()
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / record_name(_pid, pid_namespace("self")), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, RECORD.size)
            _map = mmap.mmap(fd, RECORD.size)
            # the constant part once; beats == 0 until the first beat, so readers skip it
            RECORD.pack_into(_map, 0, MAGIC, VERSION, _pid, 0, NO_STEP, 0, 0)
        finally:
            os.close(fd)
    except OSError:
        _failed = True
    return _map


def _forget_parent() -> None:
    global _map, _failed, _beats, _step, _pid
    _map, _failed, _beats, _step, _pid = None, False, 0, NO_STEP, os.getpid()


os.register_at_fork(after_in_child=_forget_parent)
_BEAT = struct.Struct("<iqqq")  # the part of RECORD a beat changes: in_step, step, beats, last
_BEAT_OFFSET = 12
_pack = _BEAT.pack_into
_now = time.monotonic_ns


def heartbeat(step: int | None = None, _in_step: int = 0) -> None:
    """Record that the training loop is alive (and at ``step``, when given)."""
    global _beats, _step
    m = _map or _open()
    if m is None:
        return
    _beats += 1
    if step is not None:
        _step = step
    _pack(m, _BEAT_OFFSET, _in_step, _step, _beats, _now())


class step:
    """Marks one training step: a beat when it starts (in step) and when it ends."""

    __slots__ = ("number",)

    def __init__(self, number: int | None = None) -> None:
        self.number = number

    def __enter__(self) -> Self:
        heartbeat(self.number, 1)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:  # no *args: cheaper
        heartbeat(self.number, 0)
