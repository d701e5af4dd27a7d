"""What one node offers the coordinator: find a job's ranks there, sample them, read their
heartbeats, ask their in-process probes what only the processes can tell.

The embedded ``LocalNode`` does both in-process (``discover`` and ``sample_round``); a
remote agent offers the same two calls over gRPC. The coordinator and the analysis never
know which one answered.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Protocol

from ..capture.find.discover import Discovery, discover
from ..capture.find.jobspec import JobSpec
from ..capture.find.peers import included_processes, peer_processes
from ..capture.read.gpu import read_gpus
from ..capture.read.heartbeat_files import read_processes
from ..capture.read.ncclras import RasQuery, query_ras
from ..capture.read.probe_client import probe_heartbeat, probe_state
from ..capture.read.sample import sample_round
from ..capture.read.source import collect_sources, merge_sources
from ..capture.read.sourcefs import SourceReader
from ..capture.read.waits import process_waits, socket_holders
from ..model import (
    Frame,
    GpuState,
    Heartbeat,
    JobSnapshot,
    NcclRasReport,
    Note,
    ProbeAnswer,
    ProbeStatus,
    RankProcess,
    Sample,
    SourceFile,
    ThreadWait,
)

# what each of ``pids``' probe told (its flight recorder dump, heartbeat, live exceptions)
ProbeAnswers = dict[int, ProbeAnswer]
PROBE_HEARTBEAT_TIMEOUT = 1.0  # seconds for a probe to say its heartbeat (polled by watch)
PROBES_AT_ONCE = 16  # probes one call of the embedded node reads at once
# Flight recorder entries one call keeps from all its probes' answers: a parsed entry costs
# about 500 bytes (measured on real torch 2.13 dumps), so 300,000 hold ~150 MB. A 128-rank
# node at torch's default ring of 2,000 entries answers 256,000. Without it, one call over
# many processes of one user, each answering the largest dump a probe may send, would be
# held whole until the call returns.
MAX_ENTRIES_PER_CALL = 300_000
MAX_SOCKETS = 256  # TCP connections of other nodes one Waits call looks up


class Quota:
    """At most ``limit`` of something held at once per key (a caller's uid): ``take``
    waits for a turn, ``try_take`` says at once whether there is one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[Hashable, int] = {}
        self._free = threading.Condition()

    def try_take(self, key: Hashable) -> bool:
        with self._free:
            if self._held.get(key, 0) >= self.limit:
                return False
            self._held[key] = self._held.get(key, 0) + 1
            return True

    def take(self, key: Hashable) -> None:
        with self._free:
            self._free.wait_for(lambda: self._held.get(key, 0) < self.limit)
            self._held[key] = self._held.get(key, 0) + 1

    def give(self, key: Hashable) -> None:
        with self._free:
            left = self._held.get(key, 0) - 1
            if left > 0:
                self._held[key] = left
            else:
                self._held.pop(key, None)  # a key nobody holds takes no memory
            self._free.notify_all()

    def held(self, key: Hashable) -> int:
        with self._free:
            return self._held.get(key, 0)


class ProbeReads:
    """The threads that read probes for an agent's requests, shared by all of them: at most
    ``workers`` probes read at once in all (so at most ``workers`` answers of at most
    ``probe_client.MAX_ANSWER_BYTES`` each held at once), and, with ``per_caller``, at most
    that many for one caller: a caller whose probes drip holds its own share, never the
    others'. Reads past a share wait in the asking request's thread."""

    def __init__(self, workers: int, per_caller: int | None, name: str) -> None:
        self.workers = workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._quota = Quota(per_caller) if per_caller is not None else None

    def ask_all(self, pids: Sequence[int], ask: Callable[[int], ProbeAnswer], who: Hashable) -> ProbeAnswers:
        asked = [self._submit(ask, pid, who) for pid in pids]
        return dict(zip(pids, (f.result() for f in asked), strict=True))

    def _submit(self, ask: Callable[[int], ProbeAnswer], pid: int, who: Hashable) -> Future[ProbeAnswer]:
        quota = self._quota
        if quota is None:
            return self._pool.submit(ask, pid)
        quota.take(who)
        try:
            future = self._pool.submit(ask, pid)
        except BaseException:
            quota.give(who)
            raise
        future.add_done_callback(lambda _: quota.give(who))  # run or cancelled
        return future

    def shutdown(self) -> None:
        """Start no more reads; those running end by their own deadlines, unwaited."""
        self._pool.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class NodeDevices:
    """What a node tells of its ranks' GPU state: the GPUs of each pid (those NVML shows on
    one), why GPU state is missing or partial, and NCCL's RAS report of the job when it was
    asked for, or why there is none worth saying ("" when the job does not use NCCL or no
    client is installed)."""

    gpus: Mapping[int, tuple[GpuState, ...]] = field(default_factory=dict)
    gpu_reason: str = ""
    ras: NcclRasReport | None = None
    ras_reason: str = ""


@dataclass(frozen=True)
class Waited:
    """What the blocked threads of some processes wait on (``capture.read.waits``), and the
    processes at the other ends that are on this node, described (``capture.find.peers``):
    the next processes to sample when a wait is followed."""

    waits: dict[int, tuple[ThreadWait, ...]] = field(default_factory=dict)
    peers: dict[int, RankProcess] = field(default_factory=dict)
    # for each TCP connection asked about, (this node's HOST:PORT, the other's): the
    # processes of this node holding it, among ``peers``
    holders: dict[tuple[str, str], tuple[int, ...]] = field(default_factory=dict)


def read_waits(
    pids: Sequence[int],
    host: str,
    readable: Callable[[int], bool] | None = None,
    include: Sequence[str] = (),
    sockets: Sequence[tuple[str, str]] = (),
) -> Waited:
    """``Waited`` for ``pids``, as a caller who may read ``readable`` processes sees them;
    the processes whose command line contains a word of ``include``, and those holding the
    TCP connections of ``sockets``, are named as peers too."""
    may = readable or (lambda _pid: True)
    waits = process_waits(pids, may)
    holders = {
        pair: tuple(sorted({p for p in found if may(p)}))
        for pair, found in socket_holders(sockets[:MAX_SOCKETS]).items()
    }
    named = {p for ws in waits.values() for w in ws for p in w.peers} - set(pids)
    named |= {p for found in holders.values() for p in found}
    peers = peer_processes(sorted(named), host)
    for pid, proc in included_processes(include, host, may, exclude=pids).items():
        peers.setdefault(pid, proc)
    return Waited(waits, peers, {pair: found for pair, found in holders.items() if found})


class Node(Protocol):
    """A node of the job, local or behind an agent."""

    @property
    def name(self) -> str: ...

    def find_ranks(self, spec: JobSpec) -> Discovery:
        """The job's rank processes on this node. Raises ``JobNotFound`` when there are none."""
        ...

    def sample(self, procs: Sequence[RankProcess], t: float, *, native: bool, timeout: float) -> list[Sample]:
        """One sample of each of ``procs`` (all on this node), in order."""
        ...

    def sources(self, wanted: Mapping[int, Sequence[Frame]]) -> tuple[SourceFile, ...]:
        """The source lines around the user frames seen in each pid's stacks (pid -> frames),
        read on this node as that process could read them (hangdoc.sourcefs)."""
        ...

    def heartbeats(self, pids: Sequence[int]) -> dict[int, Heartbeat]:
        """The last step heartbeat of each of ``pids`` that ever beat (``hangdoc.step()``)."""
        ...

    def probe(self, pids: Sequence[int], timeout: float) -> ProbeAnswers:
        """What the in-process probe of each of ``pids`` tells (``hangdoc.probe``): its
        flight recorder dump, heartbeat and live exceptions, each asked within ``timeout``."""
        ...

    def devices(self, pids: Sequence[int], *, listen: float, timeout: float, ras: bool) -> NodeDevices:
        """The GPUs ``pids`` run on (NVML, listening ``listen`` seconds for XIDs), and with
        ``ras`` NCCL's RAS report of their job; within about ``timeout + listen`` seconds."""
        ...

    def waits(
        self, pids: Sequence[int], include: Sequence[str] = (), sockets: Sequence[tuple[str, str]] = ()
    ) -> Waited:
        """What the blocked threads of ``pids`` (ranks, or processes an earlier answer named
        as peers) wait on, and the processes of this node at the other ends; with those
        whose command line contains a word of ``include``, and those holding the TCP
        connections of ``sockets`` (this node's ``HOST:PORT``, the other's)."""
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

    def sample(self, procs: Sequence[RankProcess], t: float, *, native: bool, timeout: float) -> list[Sample]:
        return sample_round(procs, t, native=native, timeout=timeout)

    def sources(self, wanted: Mapping[int, Sequence[Frame]]) -> tuple[SourceFile, ...]:
        return merge_sources(collect_sources(SourceReader(pid), frames) for pid, frames in wanted.items())

    def heartbeats(
        self, pids: Sequence[int], reads: ProbeReads | None = None, who: Hashable = None
    ) -> dict[int, Heartbeat]:
        """The records the processes wrote; for those whose record cannot be read here (a
        container's private /dev/shm), what their probes say (read by ``reads`` for ``who``
        when given: an agent's shared, bounded probe threads)."""
        found = read_processes(pids)
        probed = [pid for pid in pids if pid not in found]  # no probe: NO_PROBE, no heartbeat
        asked = _ask_all(probed, lambda pid: probe_heartbeat(pid, PROBE_HEARTBEAT_TIMEOUT), reads, who)
        for pid, answer in asked.items():
            if answer.heartbeat is not None:
                found[pid] = answer.heartbeat
        return found

    def probe(
        self, pids: Sequence[int], timeout: float, reads: ProbeReads | None = None, who: Hashable = None
    ) -> ProbeAnswers:
        """``reads``, ``who``: as for ``heartbeats``. The answers keep at most
        ``MAX_ENTRIES_PER_CALL`` flight recorder entries in all; a dump past that is left out
        of its answer, which says so."""
        budget = _EntryBudget(MAX_ENTRIES_PER_CALL)
        return _ask_all(pids, lambda pid: budget.keep(probe_state(pid, timeout)), reads, who)

    def devices(self, pids: Sequence[int], *, listen: float, timeout: float, ras: bool) -> NodeDevices:
        return read_gpu_state(pids, listen=listen, timeout=timeout, ras=ras, host=self._host)

    def waits(
        self,
        pids: Sequence[int],
        include: Sequence[str] = (),
        sockets: Sequence[tuple[str, str]] = (),
        readable: Callable[[int], bool] | None = None,
    ) -> Waited:
        """``readable``: the processes a restricted caller may see (None: all)."""
        return read_waits(pids, self._host, readable, include, sockets)


class ReplayNode:
    """A node that answers from a saved snapshot, for fan-out benchmarks and demos.

    Rank ``r`` of the snapshot is served as rank ``r + rank_offset`` with world size
    ``world_size`` (default: the snapshot's), so many replaying agents can stand for the
    nodes of one large job. Round ``i`` returns each rank's ``i``-th recorded sample
    (the last one once they run out).
    """

    def __init__(self, snapshot: JobSnapshot, host: str, rank_offset: int = 0, world_size: int | None = None) -> None:
        self._host = host
        self.snapshot = snapshot
        self.offset = rank_offset
        self.world = world_size or snapshot.world_size
        self.by_pid = {r.process.pid: r for r in (*snapshot.ranks, *snapshot.beyond)}
        self.rounds: dict[int, int] = {}

    @property
    def name(self) -> str:
        return self._host

    def find_ranks(self, spec: JobSpec, readable: Callable[[int], bool] | None = None) -> Discovery:
        procs = tuple(
            replace(
                r.process,
                host=self._host,
                world_size=self.world,
                rank=None if r.process.rank is None else r.process.rank + self.offset,
            )
            for r in self.snapshot.ranks
        )
        return Discovery(
            procs, self.world, (Note(f"replaying a snapshot of {self.snapshot.spec}"),), "a saved snapshot"
        )

    def sample(self, procs: Sequence[RankProcess], t: float, *, native: bool, timeout: float) -> list[Sample]:
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

    def heartbeats(
        self, pids: Sequence[int], reads: ProbeReads | None = None, who: Hashable = None
    ) -> dict[int, Heartbeat]:
        return {}  # a snapshot's heartbeats are as old as it is, not beats of now

    def probe(
        self, pids: Sequence[int], timeout: float, reads: ProbeReads | None = None, who: Hashable = None
    ) -> ProbeAnswers:
        """What the snapshot holds of each rank's probe."""
        out = {}
        for pid in pids:
            if (r := self.by_pid.get(pid)) is not None:
                told = r.flight is not None or r.heartbeat is not None or bool(r.exceptions)
                out[pid] = (
                    ProbeAnswer(ProbeStatus.ANSWERED, "", r.flight, r.heartbeat, r.exceptions)
                    if told
                    else ProbeAnswer(ProbeStatus.NO_PROBE, "no probe answer in the snapshot")
                )
        return out

    def devices(self, pids: Sequence[int], *, listen: float, timeout: float, ras: bool) -> NodeDevices:
        """The GPUs and the RAS report the snapshot holds."""
        gpus = {pid: r.gpus for pid in pids if (r := self.by_pid.get(pid)) is not None and r.gpus}
        report = self.snapshot.ras if ras else None
        return NodeDevices(gpus, "", report, "")

    def waits(
        self,
        pids: Sequence[int],
        include: Sequence[str] = (),
        sockets: Sequence[tuple[str, str]] = (),
        readable: Callable[[int], bool] | None = None,
    ) -> Waited:
        """The waits of the snapshot's last samples, and its processes beyond the ranks."""
        beyond = {r.process.pid: r for r in self.snapshot.beyond}
        waits = {}
        for pid in pids:
            r = self.by_pid.get(pid)
            if r is not None and r.samples:
                waits[pid] = r.samples[-1].waits
        named = {p for ws in waits.values() for w in ws for p in w.peers}
        return Waited(waits, {p: replace(beyond[p].process, host=self._host) for p in named if p in beyond})


class _EntryBudget:
    """Flight recorder entries one call may still keep, shared by its reading threads."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self._lock = threading.Lock()

    def keep(self, answer: ProbeAnswer) -> ProbeAnswer:
        if answer.flight is None:
            return answer
        size = len(answer.flight.entries)
        with self._lock:
            if self.used + size <= self.limit:
                self.used += size
                return answer
            held = self.used
        why = (
            f"flight recorder dump of {size:,} entries left out: this call's answers hold "
            f"{held:,} of at most {self.limit:,}; ask for fewer ranks at once"
        )
        return replace(answer, flight=None, reason=f"{answer.reason}; {why}" if answer.reason else why)


def _ask_all(
    pids: Sequence[int], ask: Callable[[int], ProbeAnswer], reads: ProbeReads | None = None, who: Hashable = None
) -> ProbeAnswers:
    """``ask`` of every pid at once (by ``reads`` for ``who`` when given): a probe that does
    not answer (a main thread holding the GIL) costs its timeout, not the sum of every rank's."""
    if not pids:
        return {}
    if reads is not None:
        return reads.ask_all(pids, ask, who)
    if len(pids) == 1:
        return {pids[0]: ask(pids[0])}
    with ThreadPoolExecutor(max_workers=min(PROBES_AT_ONCE, len(pids)), thread_name_prefix="hangdoc-probe") as pool:
        return dict(zip(pids, pool.map(ask, pids), strict=True))


def read_gpu_state(pids: Sequence[int], *, listen: float, timeout: float, ras: bool, host: str = "") -> NodeDevices:
    """NVML and, with ``ras``, NCCL's RAS read at once on this node (``capture.read.gpu``,
    ``capture.read.ncclras``): each has its own deadline and says why it gave nothing."""
    if not pids:
        return NodeDevices()
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="hangdoc-gpu-state") as pool:
        asked = pool.submit(query_ras, pids, timeout, host) if ras else None
        reading = read_gpus(pids, listen=listen, timeout=timeout)
        query = asked.result() if asked is not None else RasQuery(None, quiet=True)
    return NodeDevices(reading.gpus, reading.reason, query.report, "" if query.quiet else query.reason)
