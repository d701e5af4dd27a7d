"""What the ranks' GPUs (NVML) and NCCL's RAS report add to the stack diagnosis.

Evidence, each line saying where it came from:

* **idle and busy GPUs** (the seed guide's "some GPUs idle while others at 100%"): NVML's
  utilisation is the percent of its last sample period (1/6 s to 1 s) in which a kernel
  ran (``nvidia-smi --help-query-gpu``, ``utilization.gpu``). A NCCL collective's kernel
  waits for its peers on the GPU, polling, so the GPU of a rank inside a launched
  collective reads 100% however long it waits; a GPU with no kernel reads 0%. Public
  reports of hung NCCL jobs show exactly this split: one process skipped ``allGather`` and
  the other three GPUs sat at 100% (https://github.com/cupy/cupy/issues/3557); "all GPUs
  pegged at 100% except for one which is at 0%" (https://github.com/Theano/libgpuarray/issues/387).
  A rank reads *idle* at ``IDLE_AT_MOST`` % or less and *busy* at ``BUSY_AT_LEAST`` % or
  more; the margins take a kernel that started or ended inside the sample period; values
  between are neither. Only a GPU used by one rank counts (utilisation is the GPU's, not
  a process's), and the split is said only when both sides have ranks and the stacks do
  not show the job progressing.
* **XID errors, a lost GPU, uncorrectable ECC errors** on a rank's GPU, as NVML reported
  them, with a next step (the node's kernel log).
* **NCCL RAS**: ranks RAS could not reach (``unresponsive``) or gave up on (dead), NCCL
  errors a rank reports (``async_error``, a failed init, an abort), and ranks of a
  communicator that launched fewer collectives than the others (RAS's own "MISMATCH"
  reading; said only when the stacks saw no progress: RAS's counts differ for a moment in
  any busy job, its guide says).

RAS numbers ranks within each communicator. A communicator rank is named as the job's
global rank when its pid is the pid of exactly one rank process hangdoc found (and no
other pid of that communicator contradicts it), or when the communicator is as large as
the world: torch creates a group's NCCL communicator with the group's ranks in ascending
global order, so in a world-sized one the two numbers are the same.

What it may change (the rule is ``settle.by_devices``; its levels rows of
``confidence``), and why that is sound:

* ``nccl_timeout`` names no culprit "unless transport evidence names ranks"
  (docs/verdicts.md). RAS naming a rank of the job unresponsive or dead, a rank's GPU
  lost, or an XID on it during the capture, is such evidence: those ranks become the
  culprits; verdict and confidence stay.
* ``nccl_timeout`` says every rank waits in the same collective. If RAS shows, in the
  stuck job, members of a communicator that launched fewer collectives than the others
  (every type no more, at least one fewer), the stacks were wrong about "the same": the
  members ahead wait in a collective the others never launched, and a NCCL collective
  completes only once every member has launched it. That is a ``straggler`` with the
  ranks behind as culprits, at medium confidence (the counts are one reading; the stacks
  could not see which host sync the ranks behind wait at), and the report says RAS
  overrode the stacks. Other verdicts keep theirs; agreeing evidence is added to the basis.

GPU utilisation alone never changes a verdict or its confidence: a straggler computing on
its GPU reads 100% as well.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..model import (
    GpuState,
    JobSnapshot,
    NcclRasReport,
    RasCommunicator,
    RasRank,
    counted,
)
from ..rankranges import rank_phrase

IDLE_AT_MOST = 5  # percent: no kernel over (almost) all of NVML's sample period
BUSY_AT_LEAST = 95  # percent: a kernel resident over (almost) all of it
# NCCL's ncclResult_t values (nccl.h), as RAS reports async_error and init_state
NCCL_RESULTS = {
    1: "unhandled CUDA error",
    2: "system error",
    3: "internal error",
    4: "invalid argument",
    5: "invalid usage",
    6: "remote process error",
    7: "in progress",
}
_IN_PROGRESS = 7
_LIST_MAX = 8  # ranks or processes quoted in one line


@dataclass(frozen=True, slots=True)
class DeviceFindings:
    """What the GPUs and RAS say, before ``settle`` weighs it. The utilisation split and
    RAS's launch-count lags are said only of a job the stacks saw stuck (``evidence``)."""

    split: str = ""  # the idle/busy split line
    faults: tuple[str, ...] = ()  # XIDs, lost GPUs, ECC errors
    ras: tuple[str, ...] = ()  # RAS's unreachable ranks and errors
    lags: tuple[tuple[tuple[int, ...], str], ...] = ()  # per communicator: (ranks behind, the line)
    idle: tuple[int, ...] = ()  # ranks whose own GPUs are idle
    busy: tuple[int, ...] = ()  # ranks whose own GPUs are busy
    faulty: tuple[int, ...] = ()  # ranks whose GPU had an XID, is lost or unreachable
    unreachable: tuple[int, ...] = ()  # ranks RAS could not reach or gave up on
    next_steps: tuple[str, ...] = ()

    def evidence(self, progressing: bool) -> tuple[str, ...]:
        """The lines said of a job the stacks saw moving (``progressing``) or stuck."""
        if progressing:
            return (*self.faults, *self.ras)
        return (*((self.split,) if self.split else ()), *self.faults, *self.ras, *(line for _, line in self.lags))

    def behind(self, progressing: bool) -> tuple[tuple[int, ...], str]:
        """The ranks behind in the one communicator with a lag, and its line; none when the
        job moves, when several communicators lag, or when its ranks are not all named."""
        if progressing or len(self.lags) != 1 or not self.lags[0][0]:
            return (), ""
        return self.lags[0]


def find(snapshot: JobSnapshot) -> DeviceFindings | None:
    """The findings of the snapshot's GPU states and RAS report; None when it has neither."""
    if snapshot.ras is None and not any(r.gpus for r in snapshot.ranks):
        return None
    gpus = {r.rank: r.gpus for r in snapshot.ranks if r.rank is not None and r.gpus}
    hosts = {r.rank: r.process.host for r in snapshot.ranks if r.rank is not None}
    idle, busy = utilisation_split(gpus, hosts)
    faulty, fault_lines = _faults(gpus)
    next_steps: tuple[str, ...] = ()
    if faulty:
        next_steps = (
            (
                f"Look for Xid lines in the kernel log of the nodes of {rank_phrase(faulty)} "
                "(`dmesg -T | grep -i xid`) and check the GPU there (`nvidia-smi -q`)"
            ),
        )
    ras = read_ras(snapshot, snapshot.ras) if snapshot.ras is not None else RasFindings((), (), ())
    return DeviceFindings(
        _split_line(gpus, idle, busy) if idle and busy else "",
        tuple(fault_lines),
        ras.evidence,
        ras.lags,
        idle,
        busy,
        faulty,
        ras.unreachable,
        next_steps,
    )


# ------------------------------------------------------------------ NVML


def utilisation_split(
    gpus: dict[int, tuple[GpuState, ...]], hosts: dict[int, str] | None = None
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ranks whose GPUs all read idle, ranks whose GPUs all read busy); a GPU shared by
    several ranks (``hosts``: each rank's node, to tell GPUs without a UUID apart), or with
    no reading, makes its ranks neither."""
    hosts = hosts or {}
    keys = {rank: {_gpu_key(g, hosts.get(rank, "")) for g in states} for rank, states in gpus.items()}
    users = Counter(key for mine in keys.values() for key in mine)
    idle, busy = [], []
    for rank, states in sorted(gpus.items()):
        readings = [g.utilization_percent for g in states]
        if any(users[key] > 1 for key in keys[rank]):
            continue
        if all(u is not None and u <= IDLE_AT_MOST for u in readings):
            idle.append(rank)
        elif all(u is not None and u >= BUSY_AT_LEAST for u in readings):
            busy.append(rank)
    return tuple(idle), tuple(busy)


def _gpu_key(gpu: GpuState, host: str) -> str:
    return gpu.uuid or f"{host} index {gpu.index}"


def _split_line(gpus: dict[int, tuple[GpuState, ...]], idle: Sequence[int], busy: Sequence[int]) -> str:
    return (
        f"GPUs of {rank_phrase(idle)} at {_percent(gpus, idle)} while {_whose(busy)} at "
        f"{_percent(gpus, busy)} (NVML utilisation: a rank inside a launched NCCL "
        "collective keeps its GPU busy; an idle GPU has no collective running)"
    )


def _percent(gpus: dict[int, tuple[GpuState, ...]], ranks: Iterable[int]) -> str:
    values = sorted({g.utilization_percent for r in ranks for g in gpus[r] if g.utilization_percent is not None})
    return f"{values[0]}%" if len(values) == 1 else f"{values[0]}-{values[-1]}%"


def _faults(gpus: dict[int, tuple[GpuState, ...]]) -> tuple[tuple[int, ...], list[str]]:
    faulty: list[int] = []
    lines: list[str] = []
    for rank, states in sorted(gpus.items()):
        for gpu in states:
            said = []
            if gpu.lost:
                said.append("is lost (NVML: fallen off the bus or inaccessible)")
            if gpu.xids:
                said.append(f"reported XID {', '.join(map(str, gpu.xids))} during the capture (NVML events)")
            if said:
                faulty.append(rank)
                lines.append(f"rank {rank}'s GPU {gpu.index} " + " and ".join(said))
            if gpu.ecc_uncorrected:
                lines.append(
                    f"rank {rank}'s GPU {gpu.index} counts {counted(gpu.ecc_uncorrected, 'uncorrectable ECC error')} "
                    "since its driver loaded (NVML)"
                )
    return tuple(sorted(set(faulty))), lines


# ------------------------------------------------------------------ NCCL RAS


@dataclass(frozen=True, slots=True)
class RasFindings:
    evidence: tuple[str, ...]
    unreachable: tuple[int, ...]  # global ranks RAS could not reach or gave up on
    # per communicator with a lag: (its global ranks behind, () unless all are known; the line)
    lags: tuple[tuple[tuple[int, ...], str], ...]


def read_ras(snapshot: JobSnapshot, report: NcclRasReport) -> RasFindings:
    """The report's missing ranks and errors (evidence) and launch-count lags, named as
    global ranks where the module doc's rules allow."""
    evidence: list[str] = []
    unreachable: set[int] = set()
    lags: list[tuple[tuple[int, ...], str]] = []
    origin = f"NCCL RAS{f' {report.nccl_version}' if report.nccl_version else ''}"
    for comm in report.communicators:
        names = global_ranks(snapshot, comm)
        label = f"communicator {comm.hash or '?'} ({comm.size} ranks)"
        gone = [r for r in comm.missing if r.unresponsive or r.dead]
        if gone:
            unreachable.update(names[r.comm_rank] for r in gone if r.comm_rank in names)
            dead = [r for r in gone if r.dead]
            evidence.append(
                f"{origin}: {label} cannot reach {_ras_who(gone, names)}"
                + (f"; {len(dead)} considered dead" if dead else "")
            )
        quiet = [r for r in comm.missing if not (r.unresponsive or r.dead)]
        if quiet:
            evidence.append(
                f"{origin}: {label} got no data from {_ras_who(quiet, names)} "
                "(reachable, but not a member: starting or leaving the communicator)"
            )
        for line in _errors(comm, names):
            evidence.append(f"{origin}: {label}: {line}")
        found = _lag(comm, names)
        if found is not None:
            lags.append((found[0], f"{origin}: {label}: {found[1]}"))
    if report.timeouts:
        evidence.append(f"{origin}: {counted(report.timeouts, 'timeout')} while RAS gathered its data")
    return RasFindings(tuple(evidence), tuple(sorted(unreachable)), tuple(lags))


def global_ranks(snapshot: JobSnapshot, comm: RasCommunicator) -> dict[int, int]:
    """The global rank of each of the communicator's ranks that can be named (module doc)."""
    owners = Counter(r.process.pid for r in snapshot.ranks)
    by_pid = {r.process.pid: r.rank for r in snapshot.ranks if r.rank is not None and owners[r.process.pid] == 1}
    named = {r.comm_rank: by_pid[r.pid] for r in comm.ranks if r.pid is not None and r.pid in by_pid}
    world = snapshot.world_size or max((r.process.world_size or 0 for r in snapshot.ranks), default=0)
    if comm.size and comm.size == world and all(g == c for c, g in named.items()):
        return {r.comm_rank: r.comm_rank for r in comm.ranks}
    counts = Counter(named.values())
    return {c: g for c, g in named.items() if counts[g] == 1}


def _errors(comm: RasCommunicator, names: dict[int, int]) -> list[str]:
    lines = []
    failed = [r for r in comm.ranks if r.async_error not in (None, 0, _IN_PROGRESS)]
    for code in sorted({r.async_error for r in failed if r.async_error is not None}):
        ranks = [r for r in failed if r.async_error == code]
        lines.append(
            f"{_ras_who(ranks, names)} report{'s' if len(ranks) == 1 else ''} NCCL error "
            f"{code} ({NCCL_RESULTS.get(code, 'unknown')})"
        )
    init = [r for r in comm.ranks if r.init_state not in (None, 0, _IN_PROGRESS)]
    if init:
        lines.append(f"initialisation failed on {_ras_who(init, names)}")
    aborted = [r for r in comm.ranks if r.abort_flag]
    if aborted:
        lines.append(f"{_ras_who(aborted, names)} aborted the communicator")
    return lines


def _lag(comm: RasCommunicator, names: dict[int, int]) -> tuple[tuple[int, ...], str] | None:
    """(global ranks behind, where all are known; the line) when some present members
    launched fewer collectives than the others, every type no more; None otherwise."""
    present = [r for r in comm.ranks if not r.missing and r.collectives]
    if len(present) < 2:
        return None
    counts = {r.comm_rank: dict(r.collectives) for r in present}
    kinds = sorted({k for c in counts.values() for k in c})
    front = {k: max(c.get(k, 0) for c in counts.values()) for k in kinds}
    ahead = [r for r in present if all(counts[r.comm_rank].get(k, 0) == front[k] for k in kinds)]
    front_ids = {id(r) for r in ahead}
    behind = [r for r in present if id(r) not in front_ids]
    if not ahead or not behind:
        return None  # none lags, or no member is ahead in every type: counts only cross
    short = sorted({k for r in behind for k in kinds if counts[r.comm_rank].get(k, 0) < front[k]})
    per = ", ".join(f"{k} {front[k]}" for k in short)
    mine = "; ".join(
        f"{_ras_who([r], names)} " + ", ".join(f"{k} {counts[r.comm_rank].get(k, 0)}" for k in short)
        for r in behind[:_LIST_MAX]
    )
    line = (
        f"{_ras_who(behind, names)} launched fewer collectives than {_ras_who(ahead, names)} "
        f"({per} launched by the latter; {mine}): the ranks ahead wait in a collective the "
        "others have not launched"
    )
    known = tuple(sorted(names[r.comm_rank] for r in behind if r.comm_rank in names))
    return (known if len(known) == len(behind) else ()), line


def _ras_who(ranks: Sequence[RasRank], names: dict[int, int]) -> str:
    """``rank 3 (pid 4711 on 10.0.0.2)`` for known global ranks, communicator terms else."""
    known = sorted(names[r.comm_rank] for r in ranks if r.comm_rank in names)
    unknown = [r for r in ranks if r.comm_rank not in names]
    parts = [rank_phrase(known)] if known else []
    for r in unknown[:_LIST_MAX]:
        where = " on ".join(x for x in ((f"pid {r.pid}" if r.pid is not None else ""), r.host) if x)
        parts.append(f"communicator rank {r.comm_rank}" + (f" ({where})" if where else ""))
    if len(unknown) > _LIST_MAX:
        parts.append(f"{len(unknown) - _LIST_MAX} more")
    return ", ".join(parts)


def _whose(ranks: Sequence[int]) -> str:
    return f"{rank_phrase(ranks)}'s" if len(ranks) == 1 else f"those of {rank_phrase(ranks)}"
