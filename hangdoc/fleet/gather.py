"""One diagnosis's capture across the fleet: sample rounds with the source lines of new
frames, the ranks' probes and GPUs, native samples where Python stacks cannot say where a
rank waits, and the snapshot all of it makes.

``diagnose.observe`` paces the rounds and decides when to stop; a ``Gather`` takes each step
when asked and hands back what it found. A node is listed as unreachable once: with the
ranks it held and the reason it first failed (at discovery, or in the first round it missed).
Which ranks need native frames is the analysis's question, asked through ``needs_native``
(``analysis.native.needs_native``, passed in by ``diagnose.py``).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import __version__
from ..errors import PermissionDenied
from ..model import (
    CaptureErrorKind,
    Frame,
    JobSnapshot,
    Note,
    RankProcess,
    RankSnapshot,
    Sample,
    SourceFile,
    ThreadStack,
    Unreachable,
    counted,
)
from .coordinator import Fleet, Round, fan_out, sample_all
from .devices import JobDevices, gather_devices
from .follow import Beyond, NeedsWaits, follow_waits
from .node import Node
from .probes import JobProbes, ask_probes

# does one native sample of this rank tell where it waits: its samples so far, its process,
# and a frame's source line
NeedsNative = Callable[[Sequence[Sample], RankProcess, Callable[[Frame], str | None]], bool]
NATIVE_TIMEOUT = 10.0  # seconds at least for a native dump (about 1 s each, more under load)


@dataclass(frozen=True, slots=True)
class Sampled:
    """What a round left: the ranks with stacks in it, the ranks still running after it,
    and the error to raise when every rank refused ptrace (nothing to diagnose, and the fix
    is the same for all)."""

    captured: int
    live: int
    refused: PermissionDenied | None = None


class Gather:
    """The samples, source lines, probes' answers and lost nodes gathered so far."""

    def __init__(self, spec: str, fleet: Fleet, needs_native: NeedsNative, *, native: bool, timeout: float) -> None:
        self.spec = spec
        self.fleet = fleet
        self.needs_native = needs_native
        self.native = native  # native frames on every sample
        self.timeout = timeout  # per py-spy dump
        self.samples: list[list[Sample]] = [[] for _ in fleet.placed]
        self.sources: dict[str, dict[int, str]] = {}
        self.notes: list[Note] = []  # said while gathering, after the fleet's
        self.unreachable: list[Unreachable] = list(fleet.unreachable)
        self.asked: set[tuple[int, str, int | None]] = set()  # (node, file, line) sources asked for
        self.deepened: set[int] = set()  # ranks given their one native sample
        self.probes = JobProbes({})
        self.beyond = Beyond()  # processes followed past the ranks
        self.followed = False

    def live(self) -> set[int]:
        return {i for i, s in enumerate(self.samples) if not (s and s[-1].gone)}

    def lost(self) -> set[str]:
        return {u.target for u in self.unreachable}

    def sample(self, t: float) -> Sampled:
        """One round of every live rank, and the source lines of frames not seen before."""
        taken = sample_all(self.fleet, t, native=self.native, timeout=self.timeout, only=self.live())
        self._add(taken)
        captured = sum(s.error is None and bool(s.threads) for s in taken.samples.values())
        return Sampled(captured, len(self.live()), _refused(self.samples))

    def ask_probes(self) -> JobProbes:
        """What each live rank's probe tells (``fleet.probes``); the snapshot holds it."""
        self.probes = ask_probes(self.fleet, self.live(), self.lost())
        return self.probes

    def read_devices(self) -> JobDevices:
        """The live ranks' GPUs and NCCL's RAS report (``fleet.devices``)."""
        return gather_devices(self.fleet, self.live(), self.lost())

    def take_native(self, t: float, before: Callable[[int], None] = lambda _n: None) -> tuple[int, ...]:
        """One native sample of each rank that ``needs_native``, once per rank (none when
        every sample has native frames already); the pids taken. ``before`` is told how
        many ranks, before their samples are taken."""
        if self.native:
            return ()
        want = {
            i
            for i, samples in enumerate(self.samples)
            if i not in self.deepened and self.needs_native(samples, self.fleet.placed[i][1], self._code)
        }
        if not want:
            return ()
        before(len(want))
        taken = sample_all(self.fleet, t, native=True, timeout=max(self.timeout, NATIVE_TIMEOUT), only=want)
        self.deepened |= want
        self._add(Round({i: s for i, s in taken.samples.items() if s.error is None}, taken.lost))
        pids = tuple(self.fleet.placed[i][1].pid for i in sorted(want))
        self.notes.append(
            Note(f"native frames taken of pid{'s' if len(pids) > 1 else ''} {', '.join(map(str, pids))}", pids=pids)
        )
        return pids

    def follow(
        self, needs_waits: NeedsWaits, clock: Callable[[], float], pause: float, include: Sequence[str] = ()
    ) -> int:
        """Once: what the live ranks that ``needs_waits`` wait on, followed past the ranks
        (``fleet.follow``), with the processes ``include`` names, and the source lines of
        the followed processes' frames; how many processes were followed."""
        if self.followed:
            return 0
        self.followed = True
        wanted = {
            i: ids
            for i in sorted(self.live())
            if (ids := needs_waits(self.samples[i], self.fleet.placed[i][1], self._code))
        }
        if not wanted and not include:
            return 0
        self.beyond, notes = follow_waits(
            self.fleet, self.samples, wanted, clock, pause=pause, timeout=self.timeout, include=include
        )
        self.notes += notes
        shown = [
            (node, proc.pid, t) for node, proc, samples in self.beyond.held.values() for s in samples for t in s.threads
        ]
        self._read_sources(shown, _sources_of, 10.0)  # a followed process's lines are a nicety
        return len(self.beyond.held)

    def note(self, note: Note) -> None:
        self.notes.append(note)

    def snapshot(self, elapsed: float) -> JobSnapshot:
        """What was gathered in ``elapsed`` seconds, with the probes' answers."""
        return JobSnapshot(
            spec=self.spec,
            ranks=tuple(
                self._rank(i, proc, samples)
                for i, ((_, proc), samples) in enumerate(zip(self.fleet.placed, self.samples, strict=True))
            ),
            world_size=self.fleet.world_size,
            unreachable=tuple(self.unreachable),
            window_seconds=round(elapsed, 3),
            captured_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            hangdoc_version=__version__,
            notes=(*self.fleet.notes, *self.probes.notes, *self.notes),
            sources=tuple(SourceFile(f, tuple(sorted(lines.items()))) for f, lines in sorted(self.sources.items())),
            beyond=self.beyond.snapshots(),
        )

    def _rank(self, i: int, proc: RankProcess, samples: list[Sample]) -> RankSnapshot:
        answer = self.probes.answers.get(i)
        if answer is None:
            return RankSnapshot(proc, tuple(samples))
        return RankSnapshot(
            proc, tuple(samples), flight=answer.flight, exceptions=answer.exceptions, heartbeat=answer.heartbeat
        )

    def _add(self, taken: Round) -> None:
        known = self.lost()
        for lost in taken.lost:
            if lost.target not in known:
                known.add(lost.target)
                self.unreachable.append(lost)
        shown = []
        for i, sample in taken.samples.items():
            self.samples[i].append(sample)
            node, proc = self.fleet.placed[i]
            shown += [(node, proc.pid, t) for t in sample.threads]
        self._read_sources(shown, lambda n, w: n.sources(w), None)

    def _read_sources(
        self,
        shown: Sequence[tuple[Node, int, ThreadStack]],
        call: Callable[[Node, dict[int, list[Frame]]], tuple[SourceFile, ...]],
        deadline: float | None,
    ) -> None:
        """The source lines of the frames not seen before of ``shown`` threads (each with
        its node and process), asked of each node at once."""
        wanted: dict[int, tuple[Node, dict[int, list[Frame]]]] = {}
        for node, pid, thread in shown:
            fresh = self._unseen(node, (thread,))
            if fresh:
                wanted.setdefault(id(node), (node, {}))[1].setdefault(pid, []).extend(fresh)
        if not wanted:
            return  # a hung job's stacks repeat: after the first round there is nothing new
        nodes = [node for node, _ in wanted.values()]
        for _, found, _ in fan_out(nodes, lambda n: call(n, wanted[id(n)][1]), deadline):
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

    def _code(self, frame: Frame) -> str | None:
        return self.sources.get(frame.filename, {}).get(frame.line) if frame.line else None


def _refused(samples: list[list[Sample]]) -> PermissionDenied | None:
    """Every rank refused ptrace in its last sample: the error that says so, else None."""
    last = [s[-1] for s in samples if s]
    if last and all(x.error is not None and x.error.kind is CaptureErrorKind.PTRACE_DENIED for x in last):
        every = counted(len(last), "rank process", "rank processes")
        return PermissionDenied(f"ptrace was refused for all {every}: {last[0].error.message}")  # type: ignore[union-attr]
    return None


def _sources_of(node: Node, wanted: dict[int, list[Frame]]) -> tuple[SourceFile, ...]:
    try:
        return node.sources(wanted)
    except Exception:  # noqa: BLE001 - a followed process's source lines are a nicety
        return ()
