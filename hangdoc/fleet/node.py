"""What one node offers the coordinator: find a job's ranks there, sample them, read their
heartbeats, ask their probes for flight recorder dumps.

The embedded ``LocalNode`` does both in-process (``discover`` and ``sample_round``); a
remote agent offers the same two calls over gRPC. The coordinator and the analysis never
know which one answered.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Protocol

from ..capture.discover import Discovery, discover
from ..capture.heartbeat_files import read_processes
from ..capture.jobspec import JobSpec
from ..capture.probe_client import NO_PROBE, probe_flight
from ..capture.sample import sample_round
from ..capture.source import collect_sources, merge_sources
from ..capture.sourcefs import SourceReader
from ..model import FlightRecord, Frame, Heartbeat, JobSnapshot, RankProcess, Sample, SourceFile

# each of ``pids``: its flight recorder dump, or None and why there is none
Flights = dict[int, tuple[FlightRecord | None, str]]


class Node(Protocol):
    """A node of the job, local or behind an agent."""

    @property
    def name(self) -> str: ...

    def find_ranks(self, spec: JobSpec) -> Discovery:
        """The job's rank processes on this node. Raises ``JobNotFound`` when there are none."""
        ...

    def sample(
        self, procs: Sequence[RankProcess], t: float, *, native: bool, timeout: float
    ) -> list[Sample]:
        """One sample of each of ``procs`` (all on this node), in order."""
        ...

    def sources(self, wanted: Mapping[int, Sequence[Frame]]) -> tuple[SourceFile, ...]:
        """The source lines around the user frames seen in each pid's stacks (pid -> frames),
        read on this node as that process could read them (hangdoc.sourcefs)."""
        ...

    def heartbeats(self, pids: Sequence[int]) -> dict[int, Heartbeat]:
        """The last step heartbeat of each of ``pids`` that ever beat (``hangdoc.step()``)."""
        ...

    def flight(self, pids: Sequence[int], timeout: float) -> Flights:
        """The flight recorder dump of each of ``pids``, through its in-process probe."""
        ...


class LocalNode:
    """This machine, read directly: the default when no agents are given."""

    def __init__(self, host: str | None = None) -> None:
        self._host = host or socket.gethostname()

    @property
    def name(self) -> str:
        return self._host

    def find_ranks(self, spec: JobSpec, readable: Callable[[int], bool] | None = None) -> Discovery:
        """``readable``: the processes a restricted caller may see (None: all)."""
        if readable is None:
            return discover(spec, host=self._host)
        return discover(spec, host=self._host, readable=readable)

    def sample(
        self, procs: Sequence[RankProcess], t: float, *, native: bool, timeout: float
    ) -> list[Sample]:
        return sample_round(procs, t, native=native, timeout=timeout)

    def sources(self, wanted: Mapping[int, Sequence[Frame]]) -> tuple[SourceFile, ...]:
        return merge_sources(collect_sources(SourceReader(pid), frames) for pid, frames in wanted.items())

    def heartbeats(self, pids: Sequence[int]) -> dict[int, Heartbeat]:
        return read_processes(pids)

    def flight(self, pids: Sequence[int], timeout: float) -> Flights:
        if not pids:
            return {}
        # at once: a probe that does not answer (a main thread holding the GIL) costs its
        # timeout, not the sum of every rank's
        with ThreadPoolExecutor(max_workers=min(16, len(pids)), thread_name_prefix="hangdoc-flight") as pool:
            return dict(zip(pids, pool.map(lambda pid: probe_flight(pid, timeout), pids), strict=True))


class ReplayNode:
    """A node that answers from a saved snapshot, for fan-out benchmarks and demos.

    Rank ``r`` of the snapshot is served as rank ``r + rank_offset`` with world size
    ``world_size`` (default: the snapshot's), so many replaying agents can stand for the
    nodes of one large job. Round ``i`` returns each rank's ``i``-th recorded sample
    (the last one once they run out).
    """

    def __init__(self, snapshot: JobSnapshot, host: str, rank_offset: int = 0,
                 world_size: int | None = None) -> None:
        self._host = host
        self.snapshot = snapshot
        self.offset = rank_offset
        self.world = world_size or snapshot.world_size
        self.by_pid = {r.process.pid: r for r in snapshot.ranks}
        self.rounds: dict[int, int] = {}

    @property
    def name(self) -> str:
        return self._host

    def find_ranks(self, spec: JobSpec, readable: Callable[[int], bool] | None = None) -> Discovery:
        procs = tuple(
            replace(r.process, host=self._host, world_size=self.world,
                    rank=None if r.process.rank is None else r.process.rank + self.offset)
            for r in self.snapshot.ranks
        )
        return Discovery(procs, self.world, (f"replaying a snapshot of {self.snapshot.spec}",),
                         "a saved snapshot")

    def sample(
        self, procs: Sequence[RankProcess], t: float, *, native: bool, timeout: float
    ) -> list[Sample]:
        out = []
        for proc in procs:
            recorded = self.by_pid[proc.pid].samples
            i = self.rounds.get(proc.pid, 0)
            self.rounds[proc.pid] = i + 1
            out.append(replace(recorded[min(i, len(recorded) - 1)], t=t))
        return out

    def sources(self, wanted: Mapping[int, Sequence[Frame]]) -> tuple[SourceFile, ...]:
        names = {f.filename for frames in wanted.values() for f in frames}
        return tuple(s for s in self.snapshot.sources if s.filename in names)

    def heartbeats(self, pids: Sequence[int]) -> dict[int, Heartbeat]:
        return {}  # snapshots hold no heartbeats

    def flight(self, pids: Sequence[int], timeout: float) -> Flights:
        records = {pid: self.by_pid[pid].flight for pid in pids if pid in self.by_pid}
        return {pid: (rec, "" if rec else f"{NO_PROBE} dump in the snapshot") for pid, rec in records.items()}
