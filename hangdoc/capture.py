"""Sample rank processes: py-spy stacks of every thread plus kernel counters, several times.

One round (``sample_round``) reads every process's counters, then starts one py-spy per
process at once and collects them, so a round costs about as long as the slowest single
dump, not their sum. ``capture`` runs several rounds at least ``interval`` seconds apart
(start to start). Nothing here raises for one process's trouble: a process that exited,
refused ptrace, is not Python or did not answer in time gets a ``Sample`` whose ``error``
says so, and a process that exited is not sampled again.

Counters are read once per sample, just *before* its py-spy starts: while py-spy holds a
process (blocking mode) the kernel reports it as ``tracing-stop``, which analysis would
mistake for a stopped rank, and progress is judged between samples (``interval`` apart),
not within one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import psutil

from .errors import PySpyMissing
from .model import CaptureError, CaptureErrorKind, ProcessState, RankProcess, RankSnapshot, Sample
from .procstate import read_state
from .pyspy import DumpHandle, find_pyspy, start_dump

ProgressCallback = Callable[[int, int], None]
"""Called after each round with (rounds done, rounds planned)."""

_STOPPED = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)


def _start(proc: RankProcess, state: ProcessState, pyspy: str, native: bool,
           timeout: float) -> DumpHandle:
    # A stopped process cannot be paused again (and another tracer may hold it); it cannot
    # change while stopped either, so reading it without pausing is just as consistent.
    return start_dump(proc.pid, native=native, nonblocking=state.status in _STOPPED,
                      timeout=timeout, pyspy=pyspy)


def sample_round(procs: Sequence[RankProcess], t: float, *, native: bool = False,
                 timeout: float = 5.0) -> list[Sample]:
    """One sample of every process, in ``procs`` order; per-process errors are recorded."""
    try:
        pyspy: str | None = find_pyspy()
        missing = None
    except PySpyMissing as exc:
        pyspy, missing = None, CaptureError(CaptureErrorKind.PYSPY_MISSING, str(exc))
    states = [read_state(p.pid) for p in procs]
    handles: list[DumpHandle | None] = []
    for proc, state in zip(procs, states):
        if isinstance(state, CaptureError) or pyspy is None:
            handles.append(None)
        else:
            handles.append(_start(proc, state, pyspy, native, timeout))
    samples = []
    for state, handle in zip(states, handles):
        if isinstance(state, CaptureError):
            samples.append(Sample(t=t, error=state))
        elif handle is None:
            samples.append(Sample(t=t, state=state, error=missing))
        else:
            threads, error, _ = handle.result()
            samples.append(Sample(t=t, threads=threads, state=state, error=error))
    return samples


def capture(procs: Sequence[RankProcess], *, samples: int = 3, interval: float = 0.5,
            native: bool = False, timeout: float = 5.0,
            on_progress: ProgressCallback | None = None) -> tuple[RankSnapshot, ...]:
    """``samples`` rounds at least ``interval`` s apart (start to start); one RankSnapshot
    per process, in ``procs`` order."""
    history: list[list[Sample]] = [[] for _ in procs]
    start = next_at = time.monotonic()
    for index in range(samples):
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        live = [i for i, taken in enumerate(history) if not _gone(taken)]
        if not live:
            break
        began = time.monotonic()
        next_at = began + interval  # a slow round delays the next one, never squeezes it
        taken = sample_round([procs[i] for i in live], began - start,
                             native=native, timeout=timeout)
        for i, sample in zip(live, taken):
            history[i].append(sample)
        if on_progress is not None:
            on_progress(index + 1, samples)
    return tuple(RankSnapshot(process=p, samples=tuple(s)) for p, s in zip(procs, history))


def _gone(samples: list[Sample]) -> bool:
    return bool(samples) and samples[-1].error is not None and \
        samples[-1].error.kind is CaptureErrorKind.PROCESS_GONE
