"""The pipeline: find the job's ranks on its nodes -> capture (adaptive window) -> analyse.

Reporting is the CLI's, and so is showing its status: from the one-line messages
(``Message``) and the state told before each step and after every round (``Status``).
Sampling goes on for ``window`` seconds; when the evidence is still ambiguous (one rank
busy while the others wait: a straggler, or a slow rank that will finish) it goes on, up
to ``max_window``, until the job either moves or stays put. The snapshot records how long
it watched and why. Nodes are reached through ``coordinator``: the embedded ``LocalNode``
by default. ``observe`` paces the rounds and says where it stands; a ``fleet.gather.Gather``
takes each step of the capture, asking the analysis which ranks need native frames
(``analysis.native.needs_native``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .analysis.analyse import analyse
from .analysis.beyond import needs_waits
from .analysis.native import needs_native
from .capture.find.jobspec import JobSpec, parse_job_spec
from .capture.read.pyspy import find_pyspy
from .fleet.coordinator import Fleet, find_ranks
from .fleet.devices import JobDevices
from .fleet.gather import Gather
from .fleet.node import LocalNode, Node
from .memo import share_values
from .model import Diagnosis, JobSnapshot, Note, NoteKind
from .waitwords import counted

Message = Callable[[str], None]


class Step(StrEnum):
    """What a diagnosis is doing now; the value is how a status display says it."""

    FINDING = "finding the job's ranks"
    SAMPLING = "sampling stacks"
    PROBES = "asking the ranks' probes"
    DEVICES = "reading GPU state"
    NATIVE = "taking native frames"
    FOLLOWING = "following the waits past the ranks"
    ANALYSING = "analysing"


@dataclass(frozen=True, slots=True)
class Sampling:
    """Where a diagnosis stands, for a live status display: told before each step and
    after every sample round."""

    step: Step
    ranks: int = 0  # rank processes found
    captured: int = 0  # ranks with stacks in the last round
    rounds: int = 0  # sample rounds taken
    elapsed: float = 0.0  # seconds since the first round
    window: float = 0.0  # seconds of sampling planned: the window, or max_window once extended
    native: int = 0  # ranks given native frames
    probes: int | None = None  # ranks whose in-process probe answered; None until asked


Status = Callable[[Sampling], None]


@dataclass(frozen=True, slots=True)
class CaptureOptions:
    """How long and how deep to look. Defaults keep a diagnosis to a few seconds."""

    window: float = 2.0  # seconds of sampling before a first verdict
    interval: float = 0.5  # seconds between sample rounds
    max_window: float = 12.0  # upper bound when the evidence is ambiguous
    native: bool = False  # native frames on every sample (slow: ~1 s per dump)
    timeout: float = 5.0  # per py-spy dump
    # processes to sample beside the ranks, by a word of their command line (--include)
    include: tuple[str, ...] = ()


# Finds a job's ranks some other way than asking nodes (a Ray job: from the cluster's state,
# through agents placed on its nodes): the job's fleet as it is now.
FleetFinder = Callable[[JobSpec, Message], Fleet]
# Such a finder for the length of a block: what it holds (the agents it placed, its
# connection to the cluster) is let go when the block ends. ``diagnose`` holds one for a
# diagnosis, ``watch`` for the whole watch.
FleetSource = Callable[[Message], AbstractContextManager[FleetFinder]]


def diagnose(
    spec: str,
    options: CaptureOptions = CaptureOptions(),
    progress: Message | None = None,
    nodes: Sequence[Node] | None = None,
    source: FleetSource | None = None,
    status: Status | None = None,
) -> tuple[JobSnapshot, Diagnosis]:
    """Find the job's ranks (on this node unless ``nodes`` are given, through ``source``
    when it is given), watch them, diagnose."""
    say = progress or (lambda _msg: None)
    job = parse_job_spec(spec)
    if status:
        status(Sampling(Step.FINDING))
    if source is not None:
        with source(say) as find:
            fleet = find(job, say)
            nodes_seen = len({n.name for n, _ in fleet.placed})
            say(f"found {_processes(len(fleet.placed))} for {spec} on {counted(nodes_seen, 'node')}")
            return observe(spec, fleet, options, say, status)
    if nodes is None:
        find_pyspy()  # fail fast, with install help, before looking at any process
        nodes = [LocalNode()]
    fleet = find_ranks(nodes, job, deadline=options.timeout + 10.0)
    world = f" (world size {fleet.world_size})" if fleet.world_size else ""
    where = f" on {counted(len({n.name for n, _ in fleet.placed}), 'node')}" if len(nodes) > 1 else ""
    say(f"found {_processes(len(fleet.placed))} for {spec}{where}{world}")
    return observe(spec, fleet, options, say, status)


def _processes(count: int) -> str:
    return counted(count, "rank process", "rank processes")


def observe(
    spec: str, fleet: Fleet, options: CaptureOptions, say: Message, status: Status | None = None
) -> tuple[JobSnapshot, Diagnosis]:
    """Sample the fleet's ranks until the verdict is clear or ``max_window`` is reached."""
    with share_values():
        return _observe(spec, fleet, options, say, status)


def _observe(
    spec: str, fleet: Fleet, options: CaptureOptions, say: Message, status: Status | None
) -> tuple[JobSnapshot, Diagnosis]:
    gather = Gather(spec, fleet, needs_native, native=options.native, timeout=options.timeout)
    devices: JobDevices | None = None  # the ranks' GPUs and NCCL's RAS report, taken once
    extended = False
    t0 = time.monotonic()
    tick = 0
    shown = Sampling(Step.SAMPLING, ranks=len(fleet.placed), window=options.window)

    def tell(step: Step, **changed: Any) -> None:
        nonlocal shown
        if status:
            shown = dataclasses.replace(shown, step=step, elapsed=time.monotonic() - t0, **changed)
            status(shown)

    def wait_for_next_round() -> None:
        # rounds start every `interval` from t0, however long a round took
        nonlocal tick
        tick = max(tick + 1, int((time.monotonic() - t0) / options.interval) + 1)
        time.sleep(max(0.0, t0 + tick * options.interval - time.monotonic()))

    tell(Step.SAMPLING)
    while True:
        taken = gather.sample(time.monotonic() - t0)
        tell(Step.SAMPLING, rounds=shown.rounds + 1, captured=taken.captured)
        elapsed = time.monotonic() - t0
        if taken.refused is not None:
            raise taken.refused
        if not taken.live:
            gather.note(Note(f"every rank process exited during the window ({elapsed:.1f} s)"))
            snapshot = gather.snapshot(elapsed)
            tell(Step.ANALYSING)
            return snapshot, analyse(snapshot)
        if elapsed < options.window:
            wait_for_next_round()
            continue
        if devices is None:
            tell(Step.PROBES)
            probes = gather.ask_probes()
            tell(Step.DEVICES, probes=len(probes.answers))
            devices = gather.read_devices()
        deeper = gather.take_native(time.monotonic() - t0, lambda n: tell(Step.NATIVE, native=shown.native + n))
        if deeper:
            whose = "stack cannot show where it waits" if len(deeper) == 1 else "stacks cannot show where they wait"
            say(f"took native frames of {counted(len(deeper), 'rank')} whose Python {whose}")
        if not gather.followed:
            tell(Step.FOLLOWING)
            followed = gather.follow(needs_waits, lambda: time.monotonic() - t0, options.interval, options.include)
            if followed:
                say(f"followed the ranks' waits to {counted(followed, 'process', 'processes')} beyond the ranks")
        snapshot = devices.apply(gather.snapshot(elapsed))
        tell(Step.ANALYSING)
        diagnosis = analyse(snapshot)
        if not diagnosis.ambiguous or elapsed >= options.max_window:
            if diagnosis.ambiguous:
                # analysis reads no notes: the diagnosis of these samples stands as it is
                note = Note(f"evidence still ambiguous after {elapsed:.1f} s (max window)", NoteKind.WINDOW)
                snapshot = dataclasses.replace(snapshot, notes=(*snapshot.notes, note))
            return snapshot, diagnosis
        if not extended:
            extended = True
            gather.note(
                Note(
                    f"window extended beyond {options.window:.1f} s: {diagnosis.verdict.value} is not yet certain",
                    NoteKind.WINDOW,
                )
            )
            say("evidence ambiguous (a rank is busy while others wait): observing longer")
        tell(Step.SAMPLING, window=options.max_window)
        wait_for_next_round()
