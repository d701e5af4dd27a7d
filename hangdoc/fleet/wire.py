"""Translate between the agent API's messages (``v1/agent_pb2``) and the data model.

This module, the agent server and its client are the only code that imports ``*_pb2``;
everything else sees ``RankProcess``, ``Sample``, ``Discovery`` and ``SourceFile``. Every
conversion is exact: ``x_from_proto(x_to_proto(v)) == v`` for every model value ``v``.

- ``X | None`` scalars are proto3 ``optional`` fields and message fields have presence,
  so None and 0 / "" stay apart.
- Enums are mapped member by member in tables below; a value the other side sent that this
  side does not know raises ``AgentApiError`` naming it, instead of being guessed.
- A ``SampleResponse`` interns frames and stacks, like the bundle: each distinct frame and
  stack is sent once and threads refer to stacks by index.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ..bundle import StackTable
from ..capture.find.discover import Discovery
from ..capture.find.wholejob import Elsewhere
from ..errors import HangdocError
from ..memo import SharedValues, shared_values
from ..model import (
    MAX_WORLD_SIZE,
    PID_MAX,
    CaptureError,
    CaptureErrorKind,
    Frame,
    FrameLocals,
    GpuState,
    Heartbeat,
    Note,
    NoteKind,
    ProcessState,
    RankProcess,
    RankSource,
    Sample,
    SourceFile,
    Stack,
    ThreadCounters,
    ThreadStack,
    ThreadWait,
    WaitKind,
)
from . import jobreport
from .jobwatch import NodeJobs, WatchedJob, WatchedRank
from .v1 import agent_pb2 as pb

# Trailing metadata of a failed call: the agent's HangdocError class name and its help
# text (UTF-8, a binary key), so the caller raises the same error with the same help.
ERROR_KIND = "hangdoc-error-kind"
ERROR_HELP = "hangdoc-error-help-bin"


class AgentApiError(HangdocError):
    """A message from an agent (or coordinator) that this hangdoc cannot read."""

    exit_code = 2
    help = (
        "The agent and this hangdoc disagree about the agent API: install the same hangdoc "
        "version on every node (`hangdoc agent --version`)."
    )


# ------------------------------------------------------------------ enums

_RANK_SOURCE_TO_PB = {
    RankSource.ENV: pb.RANK_SOURCE_ENV,
    RankSource.INFERRED: pb.RANK_SOURCE_INFERRED,
    RankSource.RAY: pb.RANK_SOURCE_RAY,
}
_RANK_SOURCE_FROM_PB = {v: k for k, v in _RANK_SOURCE_TO_PB.items()}

_ERROR_KIND_TO_PB = {
    CaptureErrorKind.PROCESS_GONE: pb.CAPTURE_ERROR_KIND_PROCESS_GONE,
    CaptureErrorKind.PTRACE_DENIED: pb.CAPTURE_ERROR_KIND_PTRACE_DENIED,
    CaptureErrorKind.NOT_PYTHON: pb.CAPTURE_ERROR_KIND_NOT_PYTHON,
    CaptureErrorKind.TIMEOUT: pb.CAPTURE_ERROR_KIND_TIMEOUT,
    CaptureErrorKind.PYSPY_MISSING: pb.CAPTURE_ERROR_KIND_PYSPY_MISSING,
    CaptureErrorKind.PYSPY_FAILED: pb.CAPTURE_ERROR_KIND_PYSPY_FAILED,
}
_ERROR_KIND_FROM_PB = {v: k for k, v in _ERROR_KIND_TO_PB.items()}

_WAIT_KIND_TO_PB = {kind: getattr(pb, f"WAIT_KIND_{kind.name}") for kind in WaitKind}
_WAIT_KIND_FROM_PB = {v: k for k, v in _WAIT_KIND_TO_PB.items()}
_PEERS_KEPT = 64  # peers kept of one thread's wait: a pipe many processes hold
_WAITS_TEXT = 4096  # characters kept of a wait's call, target or address

_NODES_KEPT = 64  # other node names kept from one agent's answer (a note shows 16)
K = TypeVar("K")
V = TypeVar("V")


def _lookup(table: Mapping[K, V], value: K, what: str) -> V:
    try:
        return table[value]
    except KeyError:
        raise AgentApiError(f"unknown {what} value {value!r} in an agent API message") from None


# ------------------------------------------------------------------ optional scalars


def _opt(msg: object, name: str) -> object:
    """The value of optional field ``name``, or None when it is not set."""
    return getattr(msg, name) if msg.HasField(name) else None  # type: ignore[attr-defined]


def _opt_int(msg: object, name: str) -> int | None:
    value = _opt(msg, name)
    return None if value is None else int(value)  # type: ignore[call-overload]


def _rank_count(msg: object, name: str, limit: int = MAX_WORLD_SIZE) -> int | None:
    """A rank number or world size from another process: None when absent or not below
    ``limit`` + 1 (an agent, old or hostile, cannot make analysis build a huge range)."""
    value = _opt_int(msg, name)
    return value if value is not None and 0 <= value <= limit else None


def _opt_str(msg: object, name: str) -> str | None:
    value = _opt(msg, name)
    return None if value is None else str(value)


# ------------------------------------------------------------------ discovery


def rank_process_to_proto(proc: RankProcess) -> pb.RankProcess:
    msg = pb.RankProcess(
        pid=proc.pid,
        host=proc.host,
        rank_evidence=proc.rank_evidence,
        cmdline=proc.cmdline,
        env=[pb.EnvVar(name=k, value=v) for k, v in proc.env],
        rank=proc.rank,
        world_size=proc.world_size,
        local_rank=proc.local_rank,
        launcher_pid=proc.launcher_pid,
    )
    if proc.rank_source is not None:
        msg.rank_source = _lookup(_RANK_SOURCE_TO_PB, proc.rank_source, "RankSource")
    return msg


def rank_process_from_proto(msg: pb.RankProcess) -> RankProcess:
    source = None
    if msg.rank_source != pb.RANK_SOURCE_UNSPECIFIED:
        source = _lookup(_RANK_SOURCE_FROM_PB, msg.rank_source, "RankSource")
    return RankProcess(
        pid=msg.pid,
        host=msg.host,
        rank=_rank_count(msg, "rank", MAX_WORLD_SIZE - 1),
        rank_source=source,
        rank_evidence=msg.rank_evidence,
        world_size=_rank_count(msg, "world_size"),
        local_rank=_rank_count(msg, "local_rank", MAX_WORLD_SIZE - 1),
        cmdline=tuple(msg.cmdline),
        env=tuple((e.name, e.value) for e in msg.env),
        launcher_pid=_opt_int(msg, "launcher_pid"),
    )


def discovery_to_proto(found: Discovery) -> pb.Discovery:
    return pb.Discovery(
        ranks=[rank_process_to_proto(p) for p in found.ranks],
        world_size=found.world_size,
        notes=[n.words() for n in found.notes],
        searched=found.searched,
        elsewhere=None
        if found.elsewhere is None
        else pb.Elsewhere(
            host=found.elsewhere.host, why=found.elsewhere.why, nodes=found.elsewhere.nodes, job=found.elsewhere.job
        ),
        noted=[pb.Note(text=n.text, kind=n.kind.value, pids=n.pids, listed=n.listed) for n in found.notes],
    )


def discovery_from_proto(msg: pb.Discovery) -> Discovery:
    return Discovery(
        ranks=tuple(rank_process_from_proto(p) for p in msg.ranks),
        world_size=_rank_count(msg, "world_size"),
        notes=tuple(map(_note, msg.noted)) if msg.noted else tuple(Note(n) for n in msg.notes),
        searched=msg.searched,
        elsewhere=_elsewhere(msg.elsewhere) if msg.HasField("elsewhere") else None,
    )


def _note(msg: pb.Note) -> Note:
    """A note an agent sent (``NoteKind.read`` its kind); pids no process can have are left out."""
    pids = tuple(p for p in msg.pids if 0 <= p <= PID_MAX)  # as a bundle allows: a dump's pid 0
    return Note(msg.text, NoteKind.read(msg.kind), pids=pids, listed=msg.listed)


def _elsewhere(msg: pb.Elsewhere) -> Elsewhere:
    job = msg.job if msg.HasField("job") else None
    return Elsewhere(msg.host, msg.why, tuple(msg.nodes[:_NODES_KEPT]), job)


# ------------------------------------------------------------------ frames and sources


def frame_to_proto(frame: Frame) -> pb.Frame:
    return pb.Frame(
        function=frame.function, filename=frame.filename, line=frame.line, native=frame.native, code=frame.code
    )


def frame_from_proto(msg: pb.Frame) -> Frame:
    return Frame(*_frame_fields(msg))


def _frame_fields(msg: pb.Frame) -> tuple[str, str, int | None, bool, str | None]:
    """A frame's fields, in ``Frame``'s order: what it is made of, and what it is shared by."""
    return msg.function, msg.filename, _opt_int(msg, "line"), msg.native, _opt_str(msg, "code")


def source_file_to_proto(src: SourceFile) -> pb.SourceFile:
    lines = [pb.SourceLine(number=n, text=text) for n, text in src.lines]
    return pb.SourceFile(filename=src.filename, lines=lines)


def source_file_from_proto(msg: pb.SourceFile) -> SourceFile:
    return SourceFile(filename=msg.filename, lines=tuple((line.number, line.text) for line in msg.lines))


# ------------------------------------------------------------------ samples


def _state_to_proto(state: ProcessState) -> pb.ProcessState:
    return pb.ProcessState(
        status=state.status,
        cpu_seconds=state.cpu_seconds,
        num_threads=state.num_threads,
        read_chars=state.read_chars,
        write_chars=state.write_chars,
        ctx_switches=state.ctx_switches,
        rss_bytes=state.rss_bytes,
        threads=[
            pb.ThreadCounters(
                native_id=c.native_id,
                cpu_seconds=c.cpu_seconds,
                ctx_switches=c.ctx_switches,
                read_chars=c.read_chars,
                write_chars=c.write_chars,
            )
            for c in state.threads
        ],
    )


def _state_from_proto(msg: pb.ProcessState) -> ProcessState:
    return ProcessState(
        status=msg.status,
        cpu_seconds=msg.cpu_seconds,
        num_threads=msg.num_threads,
        read_chars=_opt_int(msg, "read_chars"),
        write_chars=_opt_int(msg, "write_chars"),
        ctx_switches=_opt_int(msg, "ctx_switches"),
        rss_bytes=_opt_int(msg, "rss_bytes"),
        threads=tuple(
            ThreadCounters(
                native_id=c.native_id,
                cpu_seconds=c.cpu_seconds,
                ctx_switches=_opt_int(c, "ctx_switches"),
                read_chars=_opt_int(c, "read_chars"),
                write_chars=_opt_int(c, "write_chars"),
            )
            for c in msg.threads
        ),
    )


def _locals_to_proto(found: FrameLocals) -> pb.FrameLocals:
    return pb.FrameLocals(index=found.index, values=[pb.LocalValue(name=k, value=v) for k, v in found.values])


def _locals_from_proto(msg: pb.FrameLocals, depth: int) -> FrameLocals:
    if msg.index >= depth:
        raise AgentApiError(f"locals of frame {msg.index} of a stack of {depth} frames")
    return FrameLocals(msg.index, tuple((v.name, v.value) for v in msg.values))


def _sample_to_proto(sample: Sample, out: pb.Sample, table: StackTable) -> None:
    out.t = sample.t
    for th in sample.threads:
        out.threads.add(
            thread_id=th.thread_id,
            name=th.name,
            stack=table.stack_id(th.frames),
            native_id=th.native_id,
            active=th.active,
            owns_gil=th.owns_gil,
            locals=[_locals_to_proto(found) for found in th.locals],
        )
    if sample.state is not None:
        out.state.CopyFrom(_state_to_proto(sample.state))
    if sample.error is not None:
        out.error.kind = _lookup(_ERROR_KIND_TO_PB, sample.error.kind, "CaptureErrorKind")
        out.error.message = sample.error.message
    out.waits.extend(wait_to_proto(w) for w in sample.waits)


def wait_to_proto(wait: ThreadWait) -> pb.ThreadWait:
    msg = pb.ThreadWait(
        native_id=wait.native_id,
        syscall=wait.syscall,
        kind=_lookup(_WAIT_KIND_TO_PB, wait.kind, "WaitKind"),
        target=wait.target,
        peers=wait.peers,
        remote=wait.remote,
        local=wait.local,
        peer_host=wait.peer_host,
    )
    if wait.fd is not None:
        msg.fd = wait.fd
    return msg


def wait_from_proto(msg: pb.ThreadWait) -> ThreadWait:
    """A wait as an agent sent it; pids out of range are errors (never a guessed process)."""
    for pid in (msg.native_id, *msg.peers):
        if not 0 <= pid <= PID_MAX:
            raise AgentApiError(f"a wait names pid {pid}, outside 0..{PID_MAX}")
    fd = _opt_int(msg, "fd")
    return ThreadWait(
        native_id=msg.native_id,
        syscall=msg.syscall[:_WAITS_TEXT],
        kind=_lookup(_WAIT_KIND_FROM_PB, msg.kind, "WaitKind"),
        fd=fd if fd is not None and 0 <= fd < 2**31 else None,
        target=msg.target[:_WAITS_TEXT],
        peers=tuple(msg.peers[:_PEERS_KEPT]),
        remote=msg.remote[:_WAITS_TEXT],
        local=msg.local[:_WAITS_TEXT],
        peer_host=msg.peer_host[:_WAITS_TEXT],
    )


def samples_to_proto(
    samples: Mapping[int, Sample] | Iterable[tuple[int, Sample]], discovery: Discovery | None = None
) -> pb.SampleResponse:
    """A ``SampleResponse`` with one sample per pid (in the given order), stacks interned.

    ``discovery`` is included when the request named a job rather than processes.
    """
    items = samples.items() if isinstance(samples, Mapping) else samples
    response = pb.SampleResponse()
    table = StackTable()
    for pid, sample in items:
        entry = response.samples.add(pid=pid)
        _sample_to_proto(sample, entry.sample, table)
    response.frames.extend(frame_to_proto(f) for f in table.frames)
    for stack in table.stacks:
        response.stacks.add(frames=[table.frame_id(f) for f in stack])
    if discovery is not None:
        response.discovery.CopyFrom(discovery_to_proto(discovery))
    return response


def _stacks_from_proto(msg: pb.SampleResponse | pb.RelayTable) -> list[Stack]:
    """The answer's stacks; during a capture, each frame and stack the one object of its
    value (``memo.share_values``)."""
    shared = shared_values()
    frames = [frame_from_proto(f) for f in msg.frames] if shared is None else _shared_frames(msg.frames, shared)
    stacks = []
    for i, stack in enumerate(msg.stacks):
        try:
            frames_of = tuple(frames[j] for j in stack.frames)
        except IndexError:
            raise AgentApiError(f"stack {i} refers to a frame outside the frame table ({len(frames)} frames)") from None
        if shared is not None:  # its frames are each the one of its value: their ids say it
            frames_of = shared.stacks.setdefault(tuple(map(id, frames_of)), frames_of)
        stacks.append(frames_of)
    return stacks


def _shared_frames(msgs: Iterable[pb.Frame], shared: SharedValues) -> list[Frame]:
    table = shared.frames
    frames = []
    for msg in msgs:
        key = _frame_fields(msg)
        frame = table.get(key)
        if frame is None:
            frame = table[key] = Frame(*key)
        frames.append(frame)
    return frames


def _sample_from_proto(msg: pb.Sample, stacks: list[Stack]) -> Sample:
    shared = shared_values()
    threads = []
    for th in msg.threads:
        if th.stack >= len(stacks):
            raise AgentApiError(f"a thread refers to stack {th.stack}, the table has {len(stacks)} stacks")
        frames, name, native_id = stacks[th.stack], _opt_str(th, "name"), _opt_int(th, "native_id")
        key = None
        if shared is not None and not th.locals:  # a rank's thread as it was last round: the same
            key = (th.thread_id, name, id(frames), native_id, th.active, th.owns_gil)
            if (known := shared.threads.get(key)) is not None:
                threads.append(known)
                continue
        thread = ThreadStack(
            thread_id=th.thread_id,
            name=name,
            frames=frames,
            native_id=native_id,
            active=th.active,
            owns_gil=th.owns_gil,
            locals=tuple(_locals_from_proto(found, len(frames)) for found in th.locals),
        )
        if key is not None:
            shared.threads[key] = thread  # type: ignore[union-attr]
        threads.append(thread)
    error = None
    if msg.HasField("error"):
        kind = _lookup(_ERROR_KIND_FROM_PB, msg.error.kind, "CaptureErrorKind")
        error = CaptureError(kind=kind, message=msg.error.message)
    state = _state_from_proto(msg.state) if msg.HasField("state") else None
    waits = tuple(wait_from_proto(w) for w in msg.waits)
    listed = tuple(threads)
    if shared is not None:
        listed = shared.thread_lists.setdefault(tuple(map(id, listed)), listed)
    return Sample(t=msg.t, threads=listed, state=state, error=error, waits=waits)


@dataclass(frozen=True, slots=True)
class NodeSamples:
    """One node's Sample answer as a relay merged it (``RelayTable``): the table's stacks,
    decoded once for all of its nodes, and the node's own entries."""

    stacks: list[Stack]
    samples: Sequence[pb.PidSample]


def tabled_samples(table: pb.RelayTable) -> dict[str, NodeSamples]:
    """Each node's answer in a relay's merged table, by the node's address."""
    stacks = _stacks_from_proto(table)
    return {node.target: NodeSamples(stacks, node.samples) for node in table.nodes}


def samples_from_proto(msg: pb.SampleResponse | NodeSamples) -> dict[int, Sample]:
    """The samples of a ``SampleResponse`` by pid, in the order the agent sent them."""
    stacks = msg.stacks if isinstance(msg, NodeSamples) else _stacks_from_proto(msg)
    out: dict[int, Sample] = {}
    for entry in msg.samples:
        if entry.pid in out:
            raise AgentApiError(f"the agent sent two samples for pid {entry.pid}")
        out[entry.pid] = _sample_from_proto(entry.sample, stacks)
    return out


def heartbeat_to_proto(beat: Heartbeat) -> pb.Heartbeat:
    msg = pb.Heartbeat(pid=beat.pid, beats=beat.beats, in_step=beat.in_step, age_seconds=beat.age_seconds)
    if beat.step is not None:
        msg.step = beat.step
    return msg


def heartbeat_from_proto(msg: pb.Heartbeat) -> Heartbeat:
    return Heartbeat(msg.pid, _opt_int(msg, "step"), msg.beats, msg.in_step, msg.age_seconds)


_GPU_OPTIONAL = (
    "utilization_percent",
    "memory_used_bytes",
    "memory_total_bytes",
    "process_memory_bytes",
    "ecc_uncorrected",
)


def gpu_state_to_proto(gpu: GpuState) -> pb.GpuState:
    msg = pb.GpuState(
        index=gpu.index, uuid=gpu.uuid, name=gpu.name, xids=list(gpu.xids), lost=gpu.lost, matched_by=gpu.matched_by
    )
    for name in _GPU_OPTIONAL:
        if (value := getattr(gpu, name)) is not None:
            setattr(msg, name, value)
    return msg


def gpu_state_from_proto(msg: pb.GpuState) -> GpuState:
    """The GPU as the agent sent it; a reading out of its range is taken as none."""
    values = {name: _opt_int(msg, name) for name in _GPU_OPTIONAL}
    values = {name: v if v is not None and v >= 0 else None for name, v in values.items()}
    if values["utilization_percent"] is not None and values["utilization_percent"] > 100:
        values["utilization_percent"] = None
    return GpuState(
        index=msg.index,
        uuid=msg.uuid[:200],
        name=msg.name[:200],
        xids=tuple(msg.xids[:64]),
        lost=msg.lost,
        matched_by=msg.matched_by[:200],
        **values,
    )


def node_jobs_to_proto(node: NodeJobs) -> pb.JobsResponse:
    return pb.JobsResponse(
        host=node.host,
        left_out=node.left_out,
        jobs=[
            pb.WatchedJob(
                job=job.job,
                world_size=job.world_size,
                ranks=[pb.WatchedRank(pid=r.pid, rank=r.rank, still_seconds=r.still_seconds) for r in job.ranks],
            )
            for job in node.jobs
        ],
    )


def node_jobs_from_proto(msg: pb.JobsResponse) -> NodeJobs:
    """An agent's answer, checked as an agent's push is (``jobreport``)."""
    jobs = []
    for job in msg.jobs[: jobreport.MAX_JOBS]:
        ranks = tuple(
            WatchedRank(r.pid, r.rank if r.HasField("rank") else None, r.still_seconds)
            for r in job.ranks[: jobreport.MAX_RANKS]
            if 0 < r.pid <= jobreport.MAX_PID and math.isfinite(r.still_seconds) and r.still_seconds >= 0
        )
        world = job.world_size if job.HasField("world_size") and job.world_size > 0 else None
        if job.job and len(job.job) <= jobreport.MAX_NAME and job.job.isprintable():
            jobs.append(WatchedJob(job.job, world, ranks))
    return NodeJobs(msg.host[: jobreport.MAX_NAME], tuple(jobs), max(0, msg.left_out))


class TableMerger:
    """A leaf relay's children's Sample answers in one ``RelayTable``: each distinct frame
    and stack of them once, each sample's stack indices rewritten into it."""

    def __init__(self) -> None:
        self.table = pb.RelayTable()
        self._frames: dict[bytes, int] = {}
        self._stacks: dict[tuple[int, ...], int] = {}

    def add(self, target: str, response: pb.SampleResponse) -> None:
        """``response``, one node's answer, into the table; ``AgentApiError`` when its
        indices point outside its own tables (nothing of it is added then)."""
        frames = [self._frame(f) for f in response.frames]
        try:
            stacks = [self._stack(tuple(frames[i] for i in s.frames)) for s in response.stacks]
            for entry in response.samples:
                for thread in entry.sample.threads:
                    thread.stack = stacks[thread.stack]
        except IndexError:
            raise AgentApiError(f"{target} sent a stack or thread outside its own tables") from None
        self.table.nodes.add(target=target).samples.extend(response.samples)

    def _frame(self, frame: pb.Frame) -> int:
        key = frame.SerializeToString(deterministic=True)
        index = self._frames.get(key)
        if index is None:
            index = self._frames[key] = len(self.table.frames)
            self.table.frames.append(frame)
        return index

    def _stack(self, frames: tuple[int, ...]) -> int:
        index = self._stacks.get(frames)
        if index is None:
            index = self._stacks[frames] = len(self.table.stacks)
            self.table.stacks.add(frames=frames)
        return index


# ------------------------------------------------------------------ relays


@dataclass(frozen=True, slots=True)
class RelayTarget:
    """One agent a relay asks: a leaf (its serialized ``request`` and ``timeout``) or a
    sub-relay (its ``children``)."""

    address: str
    request: bytes = b""
    timeout: float = 0.0
    children: tuple[RelayTarget, ...] = ()
    connect: float = 0.0  # the most the relay waits for a connection to a leaf (0: its timeout)


@dataclass(frozen=True, slots=True)
class RelayFailed:
    """Why a relay got no answer from a node (``RelayFailure``)."""

    kind: str
    message: str
    help: str
    relay: str = ""  # the sub-relay that failed, when the node itself was not asked


def relay_request(method: str, children: Sequence[RelayTarget], timeout: float) -> bytes:
    """A serialized ``RelayRequest``."""
    request = pb.RelayRequest(method=method, children=map(_relay_child, children), timeout_seconds=timeout)
    data: bytes = request.SerializeToString()
    return data


def _relay_child(target: RelayTarget) -> pb.RelayChild:
    if target.children:
        return pb.RelayChild(address=target.address, children=map(_relay_child, target.children))
    return pb.RelayChild(
        address=target.address, request=target.request, timeout_seconds=target.timeout, connect_seconds=target.connect
    )


def relay_answers(raw: bytes) -> dict[str, bytes | NodeSamples | RelayFailed]:
    """A relay's ``RelayResponse``: each node's serialized answer, merged samples, or failure."""
    response = pb.RelayResponse.FromString(raw)
    out: dict[str, bytes | NodeSamples | RelayFailed] = {}
    for answer in response.answers:
        failure = answer.failure
        out[answer.target] = (
            RelayFailed(failure.kind, failure.message, failure.help, failure.relay)
            if answer.HasField("failure")
            else answer.response
        )
    for table in response.tables:
        out.update(tabled_samples(table))
    return out
