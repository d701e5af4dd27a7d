"""Sample rank processes: py-spy stacks of every thread plus kernel counters.

One round (``sample_round``) reads every process's counters, then starts one py-spy per
process at once and collects them, so a round costs about as long as the slowest single
dump, not their sum. Nothing here raises for one process's trouble: a process that exited,
refused ptrace, is not Python or did not answer in time gets a ``Sample`` whose ``error``
says so. The caller paces the rounds (``hangdoc.pipeline.observe``) and leaves a process
that exited out of the next (``fleet.gather.Gather``, through a node and
``fleet.coordinator.sample_all``).

Counters are read once per sample, just *before* its py-spy starts: while py-spy holds a
process (blocking mode) the kernel reports it as ``tracing-stop``, which analysis would
mistake for a stopped rank, and progress is judged between samples (``interval`` apart),
not within one.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Sequence

from ...errors import PySpyMissing
from ...model import (
    STOPPED_STATUSES,
    CaptureError,
    CaptureErrorKind,
    ProcessState,
    RankProcess,
    Sample,
)
from .procstate import read_state
from .pyspy import DumpHandle, DumpResult, find_pyspy, start_dump


def _start(proc: RankProcess, state: ProcessState, pyspy: str, native: bool, timeout: float) -> DumpHandle:
    # A stopped process cannot be paused again (and another tracer may hold it); it cannot
    # change while stopped either, so reading it without pausing is just as consistent.
    return start_dump(
        proc.pid, native=native, nonblocking=state.status in STOPPED_STATUSES, timeout=timeout, pyspy=pyspy
    )


# py-spy processes one hangdoc process runs at once, over all its rounds and callers: an
# agent asked for many pids by many callers must not fork-bomb its node. Each dump pauses
# one target for milliseconds, so a round of more processes than this takes a few extra
# dump times (measured here: 10 ms for `py-spy dump --json` of an idle interpreter)
# instead of starting them all at once.
MAX_PARALLEL_DUMPS = max(16, 2 * (os.cpu_count() or 1))
_slots = threading.BoundedSemaphore(MAX_PARALLEL_DUMPS)


def sample_round(procs: Sequence[RankProcess], t: float, *, native: bool = False, timeout: float = 5.0) -> list[Sample]:
    """One sample of every process, in ``procs`` order; per-process errors are recorded.

    At most ``MAX_PARALLEL_DUMPS`` py-spy processes run at once in this process; every
    py-spy started here is ended (and reaped) before this returns, whatever happens.
    """
    try:
        pyspy: str | None = find_pyspy()
        missing = None
    except PySpyMissing as exc:
        pyspy, missing = None, CaptureError(CaptureErrorKind.PYSPY_MISSING, str(exc))
    states = [read_state(p.pid) for p in procs]
    results: dict[int, DumpResult] = {}
    running: deque[tuple[int, DumpHandle]] = deque()

    def collect_oldest() -> None:
        index, handle = running.popleft()
        try:
            results[index] = handle.result()
        finally:
            _slots.release()

    try:
        for index, (proc, state) in enumerate(zip(procs, states, strict=False)):
            if isinstance(state, CaptureError) or pyspy is None:
                continue
            while not _slots.acquire(blocking=not running):
                collect_oldest()  # free one of our own slots rather than wait on others'
            try:
                running.append((index, _start(proc, state, pyspy, native, timeout)))
            except BaseException:
                _slots.release()
                raise
        while running:
            collect_oldest()
    finally:
        for _, handle in running:
            handle.abandon()
            _slots.release()
    samples = []
    for index, state in enumerate(states):
        if isinstance(state, CaptureError):
            samples.append(Sample(t=t, error=state))
        elif index not in results:
            samples.append(Sample(t=t, state=state, error=missing))
        else:
            threads, error = results[index]
            samples.append(Sample(t=t, threads=threads, state=state, error=error))
    return samples
