"""The pipeline: find the job's ranks on its nodes -> capture (adaptive window) -> analyse.

Reporting is the CLI's, and so is showing progress: from the one-line messages
(``Progress``) and the state told before each step and after every round (``Status``).
Sampling goes on for ``window`` seconds; when the evidence is still ambiguous (one rank
busy while the others wait: a straggler, or a slow rank that will finish) it goes on, up
to ``max_window``, until the job either moves or stays put. The snapshot records how long
it watched and why. Nodes are reached through ``coordinator``:
the embedded ``LocalNode`` by default.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from . import __version__
from .analysis.analyse import analyse
from .analysis.device import python_host_sync, samples_gpu_evidence
from .capture.jobspec import JobSpec, parse_job_spec
from .capture.pyspy import find_pyspy
from .errors import PermissionDenied, one_line
from .fleet.coordinator import Fleet, Round, fan_out, find_ranks, sample_all
from .fleet.devices import JobDevices, gather_devices
from .fleet.node import LocalNode, Node, ProbeAnswers
from .model import (
    CaptureErrorKind,
    Diagnosis,
    Frame,
    JobSnapshot,
    ProbeAnswer,
    ProbeStatus,
    RankSnapshot,
    Sample,
    SourceFile,
    ThreadStack,
    Unreachable,
)

Progress = Callable[[str], None]


class Step(StrEnum):
    """What a diagnosis is doing now; the value is how a progress display says it."""

    FINDING = "finding the job's ranks"
    SAMPLING = "sampling stacks"
    PROBES = "asking the ranks' probes"
    DEVICES = "reading GPU state"
    NATIVE = "taking native frames"
    ANALYSING = "analysing"


@dataclass(frozen=True, slots=True)
class Sampling:
    """Where a diagnosis stands, for a live progress display: told before each step and
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
FLIGHT_TIMEOUT = 3.0  # seconds for a rank's probe to answer (its flight recorder dump and the rest)


@dataclass(frozen=True, slots=True)
class CaptureOptions:
    """How long and how deep to look. Defaults keep a diagnosis to a few seconds."""

    window: float = 2.0  # seconds of sampling before a first verdict
    interval: float = 0.5  # seconds between sample rounds
    max_window: float = 12.0  # upper bound when the evidence is ambiguous
    native: bool = False  # native frames on every sample (slow: ~1 s per dump)
    timeout: float = 5.0  # per py-spy dump


# Finds a job's ranks some other way than asking nodes (a Ray job: from the cluster's state,
# through agents placed on its nodes): the job's fleet as it is now.
FleetFinder = Callable[[JobSpec, Progress], Fleet]
# Such a finder for the length of a block: what it holds (the agents it placed, its
# connection to the cluster) is let go when the block ends. ``diagnose`` holds one for a
# diagnosis, ``watch`` for the whole watch.
FleetSource = Callable[[Progress], AbstractContextManager[FleetFinder]]


def diagnose(
    spec: str,
    options: CaptureOptions = CaptureOptions(),
    progress: Progress | None = None,
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
            say(f"found {len(fleet.placed)} rank process(es) for {spec} on {nodes_seen} node(s)")
            return observe(spec, fleet, options, say, status)
    if nodes is None:
        find_pyspy()  # fail fast, with install help, before looking at any process
        nodes = [LocalNode()]
    fleet = find_ranks(nodes, job, deadline=options.timeout + 10.0)
    world = f" (world size {fleet.world_size})" if fleet.world_size else ""
    where = f" on {len({n.name for n, _ in fleet.placed})} node(s)" if len(nodes) > 1 else ""
    say(f"found {len(fleet.placed)} rank process(es) for {spec}{where}{world}")
    return observe(spec, fleet, options, say, status)


# a Python stack ending in these torch modules may wait inside the C++ autograd engine
# (DDP's reducer), or in a C++ operator (a compiled graph's functional collective)
_ENGINE = ("torch/autograd/graph.py", "torch/autograd/__init__.py", "torch/_tensor.py",
           "torch/_ops.py")


def _in_engine(thread: ThreadStack) -> bool:
    """Idle with its Python stack ending inside the autograd engine, whatever its name."""
    inner = thread.innermost_python
    return inner is not None and inner.origin.under(*_ENGINE) and not thread.active


class _Capture:
    """The samples, source lines and lost nodes gathered so far, and the snapshot they make.

    A node is listed as unreachable once: with the ranks it held and the reason it first
    failed (at discovery, or in the first round it missed).
    """

    def __init__(self, spec: str, fleet: Fleet) -> None:
        self.spec = spec
        self.fleet = fleet
        self.samples: list[list[Sample]] = [[] for _ in fleet.placed]
        self.sources: dict[str, dict[int, str]] = {}
        self.notes = list(fleet.notes)
        self.unreachable: list[Unreachable] = list(fleet.unreachable)
        self.asked: set[tuple[int, str, int | None]] = set()
        self.deepened: set[int] = set()  # ranks given their one native sample
        self.probed: dict[int, ProbeAnswer] = {}  # what ranks' probes told, by index into placed
        self.flight_asked = False

    def live(self) -> set[int]:
        return {i for i, s in enumerate(self.samples) if not (s and s[-1].gone)}

    def add(self, taken: Round) -> None:
        known = {u.target for u in self.unreachable}
        for lost in taken.lost:
            if lost.target not in known:
                known.add(lost.target)
                self.unreachable.append(lost)
        wanted: dict[int, tuple[Node, dict[int, list[Frame]]]] = {}
        for i, sample in taken.samples.items():
            self.samples[i].append(sample)
            node, proc = self.fleet.placed[i]
            fresh = self._unseen(node, sample.threads)
            if fresh:
                wanted.setdefault(id(node), (node, {}))[1].setdefault(proc.pid, []).extend(fresh)
        if not wanted:
            return  # a hung job's stacks repeat: after the first round there is nothing new
        nodes = [node for node, _ in wanted.values()]
        for _, found, _ in fan_out(nodes, lambda n: n.sources(wanted[id(n)][1]), None):
            for src in found or ():
                self.sources.setdefault(src.filename, {}).update(src.lines)

    def _unseen(self, node: Node, threads: Sequence[ThreadStack]) -> list[Frame]:
        """The frames of ``threads`` whose source this node was not yet asked for."""
        frames = []
        for thread in threads:
            for frame in thread.frames:
                key = (id(node), frame.filename, frame.line)
                if not frame.native and frame.line and key not in self.asked:
                    self.asked.add(key)
                    frames.append(frame)
        return frames

    def deepen(
        self, options: CaptureOptions, t: float, before: Callable[[int], None] = lambda _n: None
    ) -> set[int]:
        """Take one native sample of ranks whose Python stacks cannot say where they wait;
        the indices of the ranks taken.

        * A thread idle with its Python stack ending in ``backward()`` (the main thread's, or
          a training loop run in another thread: Ray Train's ``TrainingThread``): only native
          frames show whether the autograd engine waits in a gradient all-reduce.
        * A thread at a host sync by its Python frames (``analysis.device``): only native
          frames show whether it waits in CUDA for an asynchronous collective, or computes.

        Done once per rank, and only when it matters; ``before`` is told how many ranks,
        before their samples are taken.
        """
        if options.native:
            return set()
        want = set()
        for i, samples in enumerate(self.samples):
            good = [s for s in samples if s.error is None and s.threads]
            if i in self.deepened or not good:
                continue
            uses_gpu = samples_gpu_evidence(good, self.fleet.placed[i][1]) is not None
            if any(_in_engine(thread) or python_host_sync(thread, uses_gpu, self._code)
                   for thread in good[-1].threads):
                want.add(i)
        if not want:
            return set()
        before(len(want))
        taken = sample_all(self.fleet, t, native=True, timeout=max(options.timeout, 10.0), only=want)
        self.deepened |= want
        self.add(Round({i: s for i, s in taken.samples.items() if s.error is None}, taken.lost))
        return want

    def _code(self, frame: Frame) -> str | None:
        return self.sources.get(frame.filename, {}).get(frame.line) if frame.line else None

    def flight(self, timeout: float) -> None:
        """Ask each live rank's in-process probe (``hangdoc.probe``), once, what it tells: its
        flight recorder dump, step heartbeat and threads' live exceptions. Most jobs run
        without one: that is said only when some rank has one."""
        if self.flight_asked:
            return
        self.flight_asked = True
        lost = {u.target for u in self.unreachable}  # said already, with their ranks
        groups = [(node, idx) for node, idx in self.fleet.by_node(self.live()) if node.name not in lost]
        pids = {id(node): [self.fleet.placed[i][1].pid for i in idx] for node, idx in groups}
        index = {(id(node), self.fleet.placed[i][1].pid): i for node, idx in groups for i in idx}
        failed: list[str] = []  # a probe that did not answer
        no_dump: list[str] = []  # a probe that answered without a flight recorder dump
        for node, found, _err in fan_out([n for n, _ in groups], lambda n: _probe(n, pids[id(n)], timeout),
                                          timeout + 15.0):
            for pid, answer in (found or {}).items():
                i = index.get((id(node), pid))
                if i is None or answer.status is ProbeStatus.NO_PROBE:
                    continue
                if answer.status is ProbeStatus.FAILED:
                    failed.append(f"pid {pid}: {answer.reason}")
                    continue
                self.probed[i] = answer
                if answer.flight is None:
                    no_dump.append(f"pid {pid}: {answer.reason}")
        dumps = sum(a.flight is not None for a in self.probed.values())
        if dumps:
            self.notes.append(f"flight recorder dumps of {dumps} of {len(self.fleet.placed)} rank(s), "
                              "through their probes")
        for what, which in (("no answer from the probe of ", failed), ("no flight recorder dump from ", no_dump)):
            if which:
                self.notes.append(what + "; ".join(which[:4]) + (f"; and {len(which) - 4} more" if len(which) > 4
                                                                   else ""))

    def _told(self, i: int) -> dict[str, Any]:
        """What rank ``i``'s probe told, as ``RankSnapshot`` fields."""
        answer = self.probed.get(i)
        if answer is None:
            return {}
        return {"flight": answer.flight, "exceptions": answer.exceptions, "heartbeat": answer.heartbeat}

    def snapshot(self, elapsed: float) -> JobSnapshot:
        return JobSnapshot(
            spec=self.spec,
            ranks=tuple(RankSnapshot(p, tuple(s), **self._told(i))
                        for i, ((_, p), s) in enumerate(zip(self.fleet.placed, self.samples, strict=True))),
            world_size=self.fleet.world_size,
            unreachable=tuple(self.unreachable),
            window_seconds=round(elapsed, 3),
            captured_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            hangdoc_version=__version__,
            notes=tuple(self.notes),
            sources=tuple(
                SourceFile(f, tuple(sorted(lines.items()))) for f, lines in sorted(self.sources.items())
            ),
        )


def observe(
    spec: str, fleet: Fleet, options: CaptureOptions, say: Progress, status: Status | None = None
) -> tuple[JobSnapshot, Diagnosis]:
    """Sample the fleet's ranks until the verdict is clear or ``max_window`` is reached."""
    cap = _Capture(spec, fleet)
    devices: JobDevices | None = None  # the ranks' GPUs and NCCL's RAS report, taken once
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
        taken = sample_all(fleet, time.monotonic() - t0, native=options.native,
                           timeout=options.timeout, only=cap.live())
        cap.add(taken)
        tell(Step.SAMPLING, rounds=shown.rounds + 1,
             captured=sum(s.error is None and bool(s.threads) for s in taken.samples.values()))
        elapsed = time.monotonic() - t0
        _check_readable(cap.samples)
        if not cap.live():
            cap.notes.append(f"every rank process exited during the window ({elapsed:.1f} s)")
            snapshot = cap.snapshot(elapsed)
            tell(Step.ANALYSING)
            return snapshot, analyse(snapshot)
        if elapsed < options.window:
            wait_for_next_round()
            continue
        if not cap.flight_asked:
            tell(Step.PROBES)
        cap.flight(FLIGHT_TIMEOUT)
        if devices is None:
            tell(Step.DEVICES, probes=len(cap.probed))
        devices = devices or gather_devices(fleet, cap.live(), {u.target for u in cap.unreachable})
        deeper = cap.deepen(options, time.monotonic() - t0,
                            lambda n: tell(Step.NATIVE, native=shown.native + n))
        if deeper:
            say(f"took native frames of {len(deeper)} rank(s) whose Python stack cannot show where they wait")
            pids = ", ".join(str(fleet.placed[i][1].pid) for i in sorted(deeper))
            cap.notes.append(f"native frames taken of pid(s) {pids}")
        snapshot = devices.apply(cap.snapshot(elapsed))
        tell(Step.ANALYSING)
        diagnosis = analyse(snapshot)
        if not diagnosis.ambiguous or elapsed >= options.max_window:
            if diagnosis.ambiguous:
                # analysis reads no notes: the diagnosis of these samples stands as it is
                note = f"evidence still ambiguous after {elapsed:.1f} s (max window)"
                snapshot = dataclasses.replace(snapshot, notes=(*snapshot.notes, note))
            return snapshot, diagnosis
        if not any(n.startswith("window extended") for n in cap.notes):
            cap.notes.append(
                f"window extended beyond {options.window:.1f} s: {diagnosis.summary.split(':')[0]} "
                "is not yet certain"
            )
            say("evidence ambiguous (a rank is busy while others wait): observing longer")
        tell(Step.SAMPLING, window=options.max_window)
        wait_for_next_round()


def _probe(node: Node, pids: list[int], timeout: float) -> ProbeAnswers:
    """A node's answer; a failure is no answer, never a failed diagnosis."""
    try:
        return node.probe(pids, timeout)
    except Exception as err:  # noqa: BLE001 - probes refine a diagnosis; a node's failure is said, not raised
        return {pid: ProbeAnswer(ProbeStatus.FAILED, one_line(str(err) or type(err).__name__, 300)) for pid in pids}


def _check_readable(samples: list[list[Sample]]) -> None:
    """Every rank refused to ptrace: nothing to diagnose, and the fix is the same for all."""
    last = [s[-1] for s in samples if s]
    if last and all(x.error is not None and x.error.kind is CaptureErrorKind.PTRACE_DENIED for x in last):
        raise PermissionDenied(
            f"ptrace was refused for all {len(last)} rank process(es): {last[0].error.message}"  # type: ignore[union-attr]
        )

