"""The first-step rule: a job that hangs before its warm-up is over is noticed without
waiting out the warm-up timeout, when its ranks show they are hung by themselves.

Until ``--warmup-steps`` steps are seen, the stall timeout is the long warm-up timeout
(600 s by default): the first steps compile, load data and meet at the rendezvous, and
say nothing about the steady state. A job that is hung from its first step would wait
that long. So while the primary signal warms up, ``EarlyLook`` samples every rank of the
job once every ``STILL_SAMPLE_INTERVAL`` seconds (one py-spy sample each, with the
process's counters) and ``Stillness`` tracks since when *every* rank has been still:
the Python stack of its relevant thread unchanged, and its CPU time and I/O (its own and
its child processes' on this node) risen less than ``STILL_CPU`` of the time between two
samples and ``STILL_IO`` bytes. A silence on the signal and a stillness of every rank
both longer than ``--first-step-timeout`` (``StallPolicy.first_step_timeout``) are a
suspected stall (``stall.early_stall``, ``Alarm.due_early``), confirmed by the same diagnosis as any other.

The thresholds, measured on this repository's 2-rank DDP job under torchrun (gloo, CPU):
a rank hung in a collective from its first step used at most 0.01 s CPU a second (0.5 %
on average over 30 s) and read or wrote at most 192 bytes in a second; the same ranks
starting up healthy used 0.13-0.97 s CPU and moved 5-14 MB each second. ``STILL_CPU`` (2 %)
and ``STILL_IO`` (64 KiB per sample) sit between the two with a margin of 4x above the hung
ranks. A rank that busy-polls while it is hung (NCCL's spinning waits) is never still:
such a job falls back to the warm-up timeout, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import psutil

from ..analysis.progress import StackPosition, stack_position
from ..errors import HangdocError
from ..fleet.coordinator import Fleet, sample_all
from ..fleet.node import LocalNode
from ..model import Sample

STILL_SAMPLE_INTERVAL = 10.0  # seconds between two samples of every rank during warm-up
STILL_CPU = 0.02  # CPU seconds per second below which a rank is still
STILL_IO = 64 * 1024  # bytes read + written between two samples below which a rank is still

RankKey = tuple[str, int]  # (node name, pid)


@dataclass(frozen=True, slots=True)
class Look:
    """One rank at one sample: where its relevant thread is, and its counters."""

    position: StackPosition | None
    cpu_seconds: float | None  # its own and its child processes' on this node
    io_bytes: int | None  # read + written


def moved(before: Look, after: Look, elapsed: float) -> bool:
    """Whether a rank did anything between two looks ``elapsed`` seconds apart: a new stack
    position, CPU above ``STILL_CPU``, or I/O above ``STILL_IO``. A counter that could not
    be read says nothing either way."""
    if before.position is not None and after.position is not None and before.position != after.position:
        return True
    cpu = None if before.cpu_seconds is None or after.cpu_seconds is None else after.cpu_seconds - before.cpu_seconds
    if cpu is not None and cpu > 0 and cpu >= STILL_CPU * elapsed:
        return True
    io = None if before.io_bytes is None or after.io_bytes is None else after.io_bytes - before.io_bytes
    return io is not None and io >= STILL_IO


class Stillness:
    """Since when every rank seen has been still (``still_for``). New ranks, ranks gone,
    or no rank at all start it over."""

    def __init__(self) -> None:
        self.looks: dict[RankKey, Look] = {}
        self.at: float | None = None  # time of the last observation
        self.since: float | None = None  # every rank still since then

    def observe(self, at: float, looks: Mapping[RankKey, Look]) -> None:
        if not looks:
            self.reset()
            return
        if self.at is None or set(looks) != set(self.looks):
            self.since = at  # the first look, or other ranks: still from here at most
        else:
            elapsed = at - self.at
            if any(moved(self.looks[k], looks[k], elapsed) for k in looks):
                self.since = at
        self.looks, self.at = dict(looks), at

    def reset(self) -> None:
        self.looks, self.at, self.since = {}, None, None

    def still_for(self, now: float) -> float:
        return 0.0 if self.since is None else max(0.0, now - self.since)


class EarlyLook:
    """Samples the job's ranks (``find``: the fleet now, or None before it has ranks) while
    it is asked to, into ``stillness``: every ``STILL_SAMPLE_INTERVAL`` seconds, or four
    times per ``first_step_timeout`` when that is shorter."""

    def __init__(self, find: Callable[[], Fleet | None], timeout: float, first_step_timeout: float) -> None:
        self.find = find
        self.timeout = timeout  # for each node's answer
        self.interval = min(STILL_SAMPLE_INTERVAL, first_step_timeout / 4)
        self.stillness = Stillness()
        self.sampled = float("-inf")
        self.t0 = time.monotonic()
        self.ranks_seen = 0  # how many rank processes the last round found

    def poll(self, now: float) -> None:
        if now - self.sampled < self.interval:
            return
        self.sampled = now
        try:
            fleet = self.find()
        except HangdocError:  # no rank yet, or no node answered: nothing is known still
            fleet = None
        if fleet is None or not fleet.placed:
            self.ranks_seen = 0
            self.stillness.reset()
            return
        self.ranks_seen = len(fleet.placed)
        taken = sample_all(fleet, now - self.t0, native=False, timeout=self.timeout)
        looks: dict[RankKey, Look] = {}
        for i, (node, proc) in enumerate(fleet.placed):
            sample = taken.samples.get(i)
            if sample is None or sample.gone:
                continue  # not read this round (a node lost): the set changes, stillness starts over
            children = _children_cpu(proc.pid) if isinstance(node, LocalNode) else 0.0
            looks[(node.name, proc.pid)] = _look(sample, children)
        self.stillness.observe(time.monotonic(), looks)

    def stop(self) -> None:
        """Warm-up is over (or the rule does not apply): forget what was seen."""
        self.stillness.reset()
        self.sampled = float("-inf")


def _look(sample: Sample, children_cpu: float) -> Look:
    state = sample.state
    cpu = state.cpu_seconds + children_cpu if state is not None else None
    io = None
    if state is not None and state.read_chars is not None and state.write_chars is not None:
        io = state.read_chars + state.write_chars
    return Look(stack_position(sample), cpu, io)


def _children_cpu(pid: int) -> float:
    """CPU seconds of a process's descendants (compile workers, data loaders): work a rank
    hands to its own processes is the rank's work."""
    total = 0.0
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return 0.0
    for child in children:
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total
