"""What an agent tells the service about its node: every rank process on the node, grouped
into jobs by rendezvous, and how long each rank has stayed where it is.

A look reads the process table, keeps the ranks whose start-up environment names a
rendezvous that a job spec can name (``MASTER_ADDR:MASTER_PORT``, a Slurm step: the spec
the service diagnoses the job by), takes one py-spy sample of each and a heartbeat record
where the rank writes one, and compares each rank's position (``position``: a function of
the sample, given by the caller) and heartbeat with the last look's. A rank that changed
resets its clock; ``still_seconds`` is how long it has not. Nothing but numbers leaves the
node: no stack, no environment.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from ..capture.find.jobsplit import rendezvous_key
from ..capture.find.processes import read_process_table
from ..capture.find.rankselect import FoundRank, rank_process, select_ranks
from ..capture.read.heartbeat_files import read_processes
from ..capture.read.sample import sample_round
from ..model import CaptureErrorKind, Sample

# A rank's position in a sample (its relevant thread's frames); None when the sample shows none.
Position = Callable[[Sample], Hashable | None]

# the most ranks one look samples: a node holds tens of ranks, never thousands; past this the
# look reports the jobs it could read and says how many ranks it left out
MAX_RANKS_PER_LOOK = 256


@dataclass(frozen=True, slots=True)
class WatchedRank:
    pid: int
    rank: int | None
    still_seconds: float  # since the rank last changed position or heartbeat (or was first seen)


@dataclass(frozen=True, slots=True)
class WatchedJob:
    job: str  # the spec that names it: HOST:PORT or slurm:JOB.STEP
    world_size: int | None
    ranks: tuple[WatchedRank, ...]


@dataclass(frozen=True, slots=True)
class NodeJobs:
    """One look at a node."""

    host: str
    jobs: tuple[WatchedJob, ...]
    left_out: int = 0  # ranks past MAX_RANKS_PER_LOOK, not sampled


def main_position(sample: Sample) -> Hashable | None:
    """The main thread's frames: the position when the caller gives no better one."""
    main = sample.main_thread
    if sample.error is not None or main is None:
        return None
    return tuple((f.filename, f.line) for f in main.frames if not f.native)


class JobWatch:
    """The node's jobs, looked at again at each ``look``; safe to call from several threads
    (looks are taken one at a time)."""

    def __init__(
        self,
        host: str,
        position: Position = main_position,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.position = position
        self.timeout = timeout
        self.clock = clock
        self._lock = threading.Lock()
        self._last: dict[int, tuple[Hashable, float]] = {}  # pid -> (position and beat, since when)

    def look(self, readable: Callable[[int], bool] | None = None) -> NodeJobs:
        """Look at the node now. ``readable``: the processes a restricted caller may see."""
        with self._lock:
            return self._look(readable)

    def _look(self, readable: Callable[[int], bool] | None) -> NodeJobs:
        table = read_process_table(exclude=(os.getpid(),))
        pids = [pid for pid in table.procs if readable is None or readable(pid)]
        jobs: dict[str, list[FoundRank]] = {}
        for found in select_ranks(table, pids).ranks:
            key = rendezvous_key(found.proc.env)
            spec = key.spec() if key is not None else None
            if spec is not None:
                jobs.setdefault(spec, []).append(found)
        ranks = [found for members in jobs.values() for found in members]
        left_out = max(0, len(ranks) - MAX_RANKS_PER_LOOK)
        kept = {id(found) for found in ranks[:MAX_RANKS_PER_LOOK]}
        procs = [rank_process(found, self.host, None) for found in ranks if id(found) in kept]
        samples = dict(zip((p.pid for p in procs), sample_round(procs, 0.0, timeout=self.timeout), strict=True))
        beats = read_processes(samples)
        now = self.clock()
        seen: dict[int, tuple[Hashable, float]] = {}
        watched: list[WatchedJob] = []
        for spec, members in jobs.items():
            shown = []
            for found in members:
                sample = samples.get(found.proc.pid)
                if sample is None or _gone(sample):
                    continue
                beat = beats.get(found.proc.pid)
                last = self._last.get(found.proc.pid)
                position = self.position(sample)
                if position is None and last is not None:
                    where, since = last  # a sample that shows no stack (py-spy timed out) is no move
                else:
                    where = (position, beat.beats if beat is not None else None)
                    since = last[1] if last is not None and last[0] == where else now
                seen[found.proc.pid] = (where, since)
                shown.append(WatchedRank(found.proc.pid, found.rank, round(now - since, 3)))
            if shown:
                world = next((f.world_size for f in members if f.world_size is not None), None)
                watched.append(WatchedJob(spec, world, tuple(sorted(shown, key=_rank_order))))
        self._last = seen
        return NodeJobs(self.host, tuple(sorted(watched, key=lambda j: j.job)), left_out)


def _gone(sample: Sample) -> bool:
    return sample.error is not None and sample.error.kind is CaptureErrorKind.PROCESS_GONE


def _rank_order(rank: WatchedRank) -> tuple[bool, int, int]:
    return (rank.rank is None, rank.rank if rank.rank is not None else 0, rank.pid)
