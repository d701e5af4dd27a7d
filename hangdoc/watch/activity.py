"""The watchdog's sources of activity: output, a log file, heartbeats, sampled stacks.

Each source turns what it observes into ``Event``s (a monotonic time, the signal, and a
step number when one is known); the watch loop feeds them to the ``StallClock`` of their
signal. Output is read in raw chunks, not lines, so a progress bar that rewrites one line
with ``\\r`` still counts as activity; ``--step-regex`` is matched per line (``\\n`` or
``\\r`` ended).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..analysis.progress import StackPosition, stack_position
from ..errors import described
from ..fleet.coordinator import Fleet, fan_out_pids, sample_all
from ..model import CaptureErrorKind, Heartbeat
from .config import Level, Say
from .stall import Signal


@dataclass(frozen=True, slots=True)
class Event:
    at: float  # time.monotonic()
    signal: Signal
    step: int | None = None
    count: int = 1  # steps this event stands for (heartbeats read once per check)


class StepPattern:
    """``--step-regex``: a line that matches is a step; the named group ``step`` (or the
    first group) gives its number when it is an integer."""

    def __init__(self, pattern: str) -> None:
        self.regex = re.compile(pattern)

    def match(self, line: str) -> tuple[bool, int | None]:
        m = self.regex.search(line)
        if not m:
            return False, None
        text = (
            m.groupdict().get("step")
            if "step" in self.regex.groupindex
            else (m.group(1) if self.regex.groups else None)
        )
        try:
            return True, int(text) if text is not None else None
        except ValueError:
            return True, None


BURST = 0.02  # seconds: output chunks closer together than this (one banner, one log record) are one step


class _Scanner:
    """Cuts chunks into lines and reports each chunk and step line as events. A burst of
    output (a launcher's banner, a multi-line log record) counts as one step."""

    def __init__(self, pattern: StepPattern | None, emit: Callable[[Event], None]) -> None:
        self.pattern = pattern
        self.emit = emit
        self.partial = b""
        self.burst_at = -BURST

    def feed(self, chunk: bytes, at: float) -> None:
        new_burst = at - self.burst_at >= BURST  # measured from the burst's start: no endless chain
        if new_burst:
            self.burst_at = at
        self.emit(Event(at, Signal.OUTPUT, count=1 if new_burst else 0))
        if self.pattern is None:
            return
        data = self.partial + chunk
        lines = re.split(rb"[\r\n]", data)
        self.partial = lines.pop()[-65536:]
        for raw in lines:
            hit, number = self.pattern.match(raw.decode("utf-8", "replace"))
            if hit:
                self.emit(Event(at, Signal.STEP_LINE, number))


class EventQueue:
    """Events from reader threads, drained by the watch loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[Event] = []

    def put(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)

    def drain(self) -> list[Event]:
        with self._lock:
            out, self._events = self._events, []
        return out


def tee(
    source: IO[bytes],
    sink: IO[bytes],
    pattern: StepPattern | None,
    queue: EventQueue,
    say: Say = lambda _level, _text: None,
) -> threading.Thread:
    """Copy ``source`` (a child's stdout or stderr pipe) to ``sink`` as it arrives, noting
    activity; returns the daemon thread doing it (it ends at end of file and closes
    ``source``, which nothing else reads). A bug in noting activity is said once and stops
    only the noting: the job's output never stops flowing, or its pipe would fill and block
    the job."""
    scanner: _Scanner | None = _Scanner(pattern, queue.put)
    fd = source.fileno()

    def run() -> None:
        with source:
            copy()

    def copy() -> None:
        nonlocal scanner
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            try:
                if scanner is not None:
                    scanner.feed(chunk, time.monotonic())
            except Exception as exc:  # noqa: BLE001 - a bug here must not stop the copying
                scanner = None  # the job's output still flows; only its activity goes unseen
                say(
                    Level.ERROR,
                    f"internal error: reading the job's output for activity stopped "
                    f"({described(exc)}); its output is still passed through",
                )
            try:
                sink.write(chunk)
                sink.flush()
            except (OSError, ValueError):
                pass  # our own stdout went away: keep draining so the job never blocks

    thread = threading.Thread(target=run, name="hangdoc-tee", daemon=True)
    thread.start()
    return thread


class LogTail:
    """Follows ``--log FILE`` from its current end, across truncation and rotation."""

    def __init__(self, path: str, pattern: StepPattern | None, queue: EventQueue) -> None:
        self.path = Path(path)
        self.scanner = _Scanner(pattern, queue.put)
        self._handle: IO[bytes] | None = None
        self._inode: int | None = None
        self._open(at_end=True)

    def _open(self, at_end: bool) -> None:
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 - kept open while following
        except OSError:
            self._handle, self._inode = None, None
            return
        if at_end:
            handle.seek(0, os.SEEK_END)
        self._handle, self._inode = handle, os.fstat(handle.fileno()).st_ino

    def poll(self) -> None:
        if self._handle is None:
            self._open(at_end=False)  # created after we started: read it all
            if self._handle is None:
                return
        try:
            st = os.stat(self.path)
            if st.st_ino != self._inode or st.st_size < self._handle.tell():
                self._handle.close()
                self._open(at_end=False)
                if self._handle is None:
                    return
        except OSError:
            pass  # removed: keep reading what we have open
        while True:
            try:
                chunk = self._handle.read(65536)
            except OSError:  # EIO, a vanished network file: open it again next time
                self._handle.close()
                self._handle, self._inode = None, None
                return
            if not chunk:
                return
            self.scanner.feed(chunk, time.monotonic())

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


class HeartbeatSource:
    """The records written by ``hangdoc.heartbeat()`` in the job's processes, as ``fetch``
    returns them (a directory's records, or the fleet's through its nodes)."""

    def __init__(self, fetch: Callable[[], dict[tuple[str, int], Heartbeat]]) -> None:
        self.fetch = fetch
        self.newest: float | None = None
        self.progress: int | None = None  # the highest step number seen so far
        self.records: dict[tuple[str, int], Heartbeat] = {}  # by (node, pid): pids repeat across nodes

    def poll(self) -> list[Event]:
        records = self.fetch()
        self.records = records
        if not records:
            return []
        now = time.monotonic()
        newest = max(now - hb.age_seconds for hb in records.values())
        steps = [hb.step for hb in records.values() if hb.step is not None]
        if self.newest is not None and newest <= self.newest + 1e-3:
            return []  # ages come over the network rounded: a millisecond is no beat
        self.newest = newest
        # with step numbers, the steps since the last look; without, one per look (beats
        # cannot say: `with hangdoc.step()` beats twice a step). A resumed job's first
        # step number counts as one, not as N steps of warm-up.
        count = 1
        if steps:
            if self.progress is not None:
                count = max(1, max(steps) - self.progress)
            self.progress = max(steps) if self.progress is None else max(self.progress, max(steps))
        return [Event(newest, Signal.HEARTBEAT, max(steps) if steps else None, count)]


def fleet_heartbeats(fleet: Fleet, deadline: float) -> dict[tuple[str, int], Heartbeat]:
    """Every rank's heartbeat by (node name, pid), asked of all its nodes at once; a node
    that fails (an agent down, or too old for the RPC) gives none."""
    out: dict[tuple[str, int], Heartbeat] = {}
    for told in fan_out_pids(fleet, lambda node, pids: node.heartbeats(pids), deadline):
        out.update({(told.node.name, pid): beat for pid, beat in (told.value or {}).items()})
    return out


# where a rank's relevant thread is: its id, and the (file, line) of each Python frame


class StackSampler:
    """One sampling round of every rank per check: activity when a rank's Python stack
    differs from its previous sample. Used when the job gives nothing else to watch."""

    def __init__(self, fleet: Fleet, timeout: float) -> None:
        self.fleet = fleet
        self.timeout = timeout
        self.t0 = time.monotonic()
        self.previous: dict[int, StackPosition] = {}
        self.gone: set[int] = set()

    def poll(self) -> list[Event]:
        live = set(range(len(self.fleet.placed))) - self.gone
        if not live:
            return []
        # a node that fails a round gives no samples: nothing changed there, and it is
        # asked again next time (the report's capture records lost nodes, not the sampler)
        taken = sample_all(
            self.fleet, time.monotonic() - self.t0, native=False, timeout=self.timeout, only=live
        ).samples
        changed = False
        for i, sample in taken.items():
            if sample.error is not None and sample.error.kind is CaptureErrorKind.PROCESS_GONE:
                self.gone.add(i)
                continue
            fingerprint = stack_position(sample)
            if fingerprint is None:
                continue
            if self.previous.get(i) not in (None, fingerprint):
                changed = True
            self.previous[i] = fingerprint
        return [Event(time.monotonic(), Signal.STACKS)] if changed else []

    @property
    def all_gone(self) -> bool:
        return len(self.gone) == len(self.fleet.placed)
