"""``hangdoc agent``: the per-node gRPC server that finds and samples a job's ranks there.

It serves the ``hangdoc.v1.Agent`` API (``proto/hangdoc/v1/agent.proto``) and the standard
gRPC health service, on loopback by default. Off loopback it refuses to start without a
token (``--token-file``, checked on every call as ``authorization: Bearer <token>``) or
mutual TLS, unless ``--insecure`` is given on purpose. It only reads: discovery, py-spy
dumps, /proc; it never signals the job. Blocking work runs in threads so that one slow
dump does not stall other callers, in pools split by caller (``hangdoc.fleet.limits``): the
operator always has threads of its own, a local user has a small quota of requests and
probe reads, and connections are capped and timed out, so that no caller can starve
another or take the agent's descriptors. SIGTERM ends it within ``STOP_GRACE_S`` seconds
whatever its callers do; a second SIGTERM or SIGINT at once.

Without a token or certificate a caller is identified by the kernel (hangdoc.callers) and
sees only the processes it could read with py-spy itself. Every request, denied and
invalid ones included, gets one audit line on stderr (logger ``hangdoc.audit``).

``serve_in_thread`` runs the same server, under the same listen policy, from a thread of a
process that has other work to do (a Ray actor: ``hangdoc.fleet.ray_agents``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import math
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NoReturn, Protocol, TypeVar

import grpc
import psutil
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from .. import SCHEMA_VERSION, __version__
from ..addresses import is_loopback_host
from ..bundle import load_snapshot
from ..capture.find.discover import Discovery
from ..capture.find.jobspec import parse_job_spec
from ..capture.read.flight_recorder import flight_record_to_json
from ..capture.read.ncclras import ras_report_to_json
from ..capture.read.pyspy import find_pyspy
from ..errors import HangdocError, JobNotFound, PermissionDenied, PySpyMissing, UsageError, one_line
from ..model import (
    MAX_INCLUDE,
    MAX_INCLUDE_CHARS,
    CaptureError,
    CaptureErrorKind,
    Frame,
    Heartbeat,
    ProbeAnswer,
    ProbeStatus,
    Sample,
    SourceFile,
    counted,
)
from . import limits, wire
from .callers import OPERATOR_BY_CERT, OPERATOR_BY_TOKEN, Caller, identify
from .client import AgentAuth, AgentError, Metadata, call_error
from .credfiles import check_tls, read_private, read_token
from .jobwatch import JobWatch, NodeJobs, Position, main_position
from .limits import Lanes, OverQuota
from .node import MAX_SOCKETS, LocalNode, NodeDevices, ProbeAnswers, ReplayNode, Waited
from .serverlink import ServerLink
from .tree import FANOUT, RELAY_SLACK
from .v1 import agent_pb2 as pb
from .v1 import agent_pb2_grpc as pb_grpc
from .wire import ERROR_HELP, ERROR_KIND

DEFAULT_LISTEN = "127.0.0.1:7420"
API_VERSION = "hangdoc.v1"
log = logging.getLogger("hangdoc.agent")
audit_log = logging.getLogger("hangdoc.audit")
T = TypeVar("T")

# What one request may ask for. A node runs a few dozen ranks (128 on the largest CPU
# nodes); a py-spy dump of a hung rank takes 0.05-1 s (--native: ~1 s).
MAX_PIDS_PER_CALL = 1024
MAX_JOB_SPEC = 1024
MAX_DUMP_TIMEOUT = 60.0
MAX_SOURCE_FRAMES = 20_000
# optional RPCs and evidence (AgentInfo.features); "probe-state": Flight carries each probe's
# status, heartbeat and live exceptions besides its flight recorder dump
FEATURES = ["sources", "heartbeats", "flight", "probe-state", "devices", "waits", "jobs"]
FEATURES_REPLAY = ["sources", "flight", "probe-state", "devices", "waits"]
MAX_XID_LISTEN = 10.0  # seconds a Devices call may listen for XID events
# what a relay forwards (the Agent API's reads of a diagnosis), how deep, how long
RELAYED = frozenset({"GetInfo", "FindRanks", "Sample", "SampleSources", "Heartbeats", "Flight", "Devices", "Waits"})
MAX_RELAY_DEPTH = 3  # levels below a relay: 64**3 = 262,144 nodes
MAX_RELAY_TIMEOUT = 600.0  # a find_ranks over 50,000 agents on a loaded machine
MAX_RELAY_CHANNELS = 4096  # children whose channels a relay keeps open
VIA = "x-hangdoc-via"  # metadata a relay adds: whom it asks for (the children's audit lines)
_PROBE_STATUS = {
    ProbeStatus.ANSWERED: pb.PROBE_STATUS_ANSWERED,
    ProbeStatus.NO_PROBE: pb.PROBE_STATUS_NO_PROBE,
    ProbeStatus.FAILED: pb.PROBE_STATUS_FAILED,
}


@dataclass(frozen=True)
class AgentConfig:
    listen: str = DEFAULT_LISTEN
    token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    insecure: bool = False
    dump_timeout: float = 5.0
    host: str | None = None  # the node name reported for its ranks (default: the host name)
    open_health: bool = False  # answer grpc.health.v1 without the token (Kubernetes' health checks)
    replay: str | None = None  # serve this saved snapshot instead of live processes (benchmarks)
    replay_rank_offset: int = 0
    replay_world_size: int | None = None
    server: str | None = None  # `hangdoc server` to report this node's jobs to (serverlink)
    advertise: str | None = None  # the address the server reaches this agent at (default: seen from the server)
    # a rank's position in a sample, to tell whether it moved (jobwatch); the CLI passes
    # the analysis' relevant thread
    position: Position = main_position


def split_address(address: str) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT``; port 0 asks for any free port."""
    host, sep, port = address.rpartition(":")
    if not sep or not host.strip("[]") or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise UsageError(f"listen address {address!r} is not HOST:PORT with a port 0-65535")
    return host.strip("[]"), int(port)


def check_listen_policy(config: AgentConfig) -> None:
    """Refuse to expose ptrace-backed reads off loopback without authentication."""
    host, _ = split_address(config.listen)
    tls = bool(config.tls_cert and config.tls_key and config.tls_ca)
    if any((config.tls_cert, config.tls_key, config.tls_ca)) and not tls:
        raise UsageError("mutual TLS needs all of --tls-cert, --tls-key and --tls-ca")
    if not is_loopback_host(host) and not (config.token or tls or config.insecure):
        raise UsageError(
            f"refusing to listen on {config.listen} without authentication: give --token-file "
            "or --tls-cert/--tls-key/--tls-ca (or --insecure, if the network is trusted)"
        )


_HEALTH = "/grpc.health.v1.Health/"


class TokenAuth(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc ships no type hints
    """Rejects every call whose ``authorization`` metadata does not carry the token."""

    def __init__(self, token: str, open_health: bool = False) -> None:
        self._expected = f"Bearer {token}".encode()
        self._open_health = open_health

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if self._open_health and details.method.startswith(_HEALTH):
            return await continuation(details)  # opted in: the kubelet's gRPC health checks carry no token
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                if hmac.compare_digest(given, self._expected):
                    return await continuation(details)
        method = details.method

        async def deny(request: object, context: grpc.aio.ServicerContext) -> None:
            audit(context.peer(), "unauthenticated", method, "-", "denied: no valid token", 0.0)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong hangdoc token")

        return grpc.unary_unary_rpc_method_handler(deny)


class _CallContext(Protocol):
    """What a request's ``grpc.aio.ServicerContext`` offers ``AgentService._run`` (grpc ships
    no type hints: its ``abort`` never returns, it raises)."""

    def peer(self) -> str: ...

    def set_trailing_metadata(self, trailing_metadata: tuple[tuple[str, str | bytes], ...]) -> None: ...

    async def abort(self, code: grpc.StatusCode, details: str) -> NoReturn: ...


class AgentService(pb_grpc.AgentServicer):
    """Translates RPCs to the local node's discovery and sampling; never raises raw errors.

    Every request is checked before any work: its caller is identified (hangdoc.callers)
    and sees only processes it may read; numbers are finite and in range; lists and
    strings are bounded. One audit line per request says who asked what and how it ended.
    """

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        # per rank process this agent found: the files its own dumps showed, the only ones
        # SampleSources reads (and only through that process)
        self.seen: dict[int, set[str]] = {}
        # rank processes this agent found: the only ones Sample and Heartbeats look at
        self.found_pids: set[int] = set()
        # processes that are not ranks, named by the kernel as the other end of a wait of a
        # process above (Waits): Sample and Waits accept them too
        self.named_pids: set[int] = set()
        self.node: LocalNode | ReplayNode = LocalNode(config.host)
        if config.replay:
            self.node = ReplayNode(
                load_snapshot(config.replay),
                config.host or socket.gethostname(),
                config.replay_rank_offset,
                config.replay_world_size,
            )
        self.watch = JobWatch(self.node.name, config.position, config.dump_timeout)
        self.lanes = Lanes()
        self._identify = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hangdoc-identify")
        if not (config.token or config.tls_cert):
            # its thread started now, counted with the agent's own; an agent that knows its
            # callers by token or certificate never identifies one (and thousands of hosted
            # agents, bench_fanout's, would hold a task each: kernel.pid_max is 32,768 here)
            self._identify.submit(int)

    async def caller(self, context: grpc.aio.ServicerContext) -> Caller:
        if self.config.token:
            return OPERATOR_BY_TOKEN  # the interceptor let only token holders through
        if self.config.tls_cert:
            return OPERATOR_BY_CERT  # the TLS layer let only certificates from the CA through
        # the socket tables and /proc/*/fd are read in a thread of its own (a few ms; a root
        # caller's holder is looked for among every process), never on the event loop
        ask = functools.partial(identify, context.peer(), trust_remote=self.config.insecure)
        return await asyncio.get_running_loop().run_in_executor(self._identify, ask)

    async def GetInfo(self, request: pb.GetInfoRequest, context: grpc.aio.ServicerContext) -> pb.AgentInfo:
        info = self._info()
        audit(context.peer(), "-", "GetInfo", "-", "ok", 0.0)
        return info

    def _info(self) -> pb.AgentInfo:
        info = pb.AgentInfo(
            hangdoc_version=__version__,
            schema_version=SCHEMA_VERSION,
            api_version=API_VERSION,
            host=self.node.name,
            pid=os.getpid(),
            native=True,
            features=FEATURES_REPLAY if self.config.replay else FEATURES,
            python_version=sys.version.split()[0],
        )
        try:
            info.pyspy_path = find_pyspy()
        except PySpyMissing:
            pass
        return info

    async def FindRanks(self, request: pb.FindRanksRequest, context: grpc.aio.ServicerContext) -> pb.Discovery:
        caller = await self.caller(context)
        found = await self._run(context, caller, "FindRanks", f"job={request.job}", self._find, request.job, caller)
        answer = wire.discovery_to_proto(found)
        answer.agent.CopyFrom(self._info())  # what GetInfo says: one call finds a job
        return answer

    async def Sample(self, request: pb.SampleRequest, context: grpc.aio.ServicerContext) -> pb.SampleResponse:
        caller = await self.caller(context)
        target = request.WhichOneof("target")
        pids = [p.pid for p in request.processes.processes] if target == "processes" else []
        what = f"job={request.job}" if target == "job" else f"pids={_pid_list(pids)}"
        response = await self._run(context, caller, "Sample", what, self._sample, request, caller)
        return response

    async def SampleSources(
        self, request: pb.SampleSourcesRequest, context: grpc.aio.ServicerContext
    ) -> pb.SampleSourcesResponse:
        caller = await self.caller(context)
        pids = [q.pid for q in request.queries]
        sources = await self._run(
            context, caller, "SampleSources", f"pids={_pid_list(pids)}", self._sources, request, caller
        )
        return pb.SampleSourcesResponse(files=[wire.source_file_to_proto(s) for s in sources])

    async def Heartbeats(
        self, request: pb.HeartbeatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.HeartbeatsResponse:
        caller = await self.caller(context)
        lane = self.lanes.lane(caller)

        def beats() -> dict[int, Heartbeat]:
            if len(request.pids) > MAX_PIDS_PER_CALL:
                raise UsageError(f"{len(request.pids)} pids in one call; at most {MAX_PIDS_PER_CALL}")
            pids = [pid for pid in dict.fromkeys(request.pids) if pid in self.found_pids and caller.may_read(pid)]
            return self.node.heartbeats(pids, lane.probes, lane.who)

        found = await self._run(context, caller, "Heartbeats", f"pids={_pid_list(request.pids)}", beats)
        return pb.HeartbeatsResponse(heartbeats=[wire.heartbeat_to_proto(b) for b in found.values()])

    async def Flight(self, request: pb.FlightRequest, context: grpc.aio.ServicerContext) -> pb.FlightResponse:
        caller = await self.caller(context)
        lane = self.lanes.lane(caller)

        def answers() -> ProbeAnswers:
            if len(request.pids) > MAX_PIDS_PER_CALL:
                raise UsageError(f"{len(request.pids)} pids in one call; at most {MAX_PIDS_PER_CALL}")
            timeout = request.timeout_seconds
            if not (math.isfinite(timeout) and 0 < timeout <= MAX_DUMP_TIMEOUT):
                raise UsageError(f"timeout_seconds must be in (0, {MAX_DUMP_TIMEOUT:g}], not {timeout!r}")
            pids = [pid for pid in dict.fromkeys(request.pids) if pid in self.found_pids and caller.may_read(pid)]
            return self.node.probe(pids, timeout, lane.probes, lane.who)

        found = await self._run(context, caller, "Flight", f"pids={_pid_list(request.pids)}", answers)
        return pb.FlightResponse(ranks=[_rank_flight(pid, answer) for pid, answer in found.items()])

    async def Devices(self, request: pb.DevicesRequest, context: grpc.aio.ServicerContext) -> pb.DevicesResponse:
        caller = await self.caller(context)
        found = await self._run(
            context,
            caller,
            "Devices",
            f"pids={_pid_list(request.pids)} ras={request.ras}",
            self._devices,
            request,
            caller,
        )
        return pb.DevicesResponse(
            ranks=[
                pb.RankGpus(pid=pid, gpus=[wire.gpu_state_to_proto(g) for g in gpus])
                for pid, gpus in found.gpus.items()
            ],
            gpu_reason=found.gpu_reason,
            ras_output=ras_report_to_json(found.ras) if found.ras else "",
            ras_reason=found.ras_reason,
        )

    async def Waits(self, request: pb.WaitsRequest, context: grpc.aio.ServicerContext) -> pb.WaitsResponse:
        caller = await self.caller(context)
        found = await self._run(
            context, caller, "Waits", f"pids={_pid_list(request.pids)}", self._waits, request, caller
        )
        return pb.WaitsResponse(
            waits=[pb.PidWaits(pid=pid, waits=[wire.wait_to_proto(w) for w in ws]) for pid, ws in found.waits.items()],
            peers=[wire.rank_process_to_proto(p) for p in found.peers.values()],
            holders=[pb.SocketHolders(socket=f"{a}>{b}", pids=list(pids)) for (a, b), pids in found.holders.items()],
        )

    async def Jobs(self, request: pb.JobsRequest, context: grpc.aio.ServicerContext) -> pb.JobsResponse:
        caller = await self.caller(context)
        found = await self._run(context, caller, "Jobs", "-", self._jobs, caller)
        return wire.node_jobs_to_proto(found)

    # ------------------------------------------------------------ the work, in a thread

    def _jobs(self, caller: Caller) -> NodeJobs:
        if self.config.replay:
            raise UsageError("an agent replaying a snapshot watches no job")
        if not caller.reads_all and caller.uid is None:
            raise PermissionDenied(
                f"this agent cannot tell who is calling ({caller.how}), so it shows no process",
                help="Call it over loopback from the job's node, or give the operator's "
                "--token-file or client certificate.",
            )
        return self.watch.look(None if caller.reads_all else caller.may_read)

    def _waits(self, request: pb.WaitsRequest, caller: Caller) -> Waited:
        """The waits of found or named processes the caller may read; the peers it may read
        are named, and accepted from then on."""
        if len(request.pids) > MAX_PIDS_PER_CALL:
            raise UsageError(f"{len(request.pids)} pids in one call; at most {MAX_PIDS_PER_CALL}")
        if len(request.include) > MAX_INCLUDE or any(len(w) > MAX_INCLUDE_CHARS or not w for w in request.include):
            raise UsageError(f"at most {MAX_INCLUDE} include words of 1 to {MAX_INCLUDE_CHARS} characters")
        known = self.found_pids | self.named_pids
        pids = [pid for pid in dict.fromkeys(request.pids) if pid in known and caller.may_read(pid)]
        if len(request.sockets) > MAX_SOCKETS:
            raise UsageError(f"{len(request.sockets)} sockets in one call; at most {MAX_SOCKETS}")
        pairs = [(local, remote) for text in request.sockets for local, _, remote in [text.partition(">")]]
        found = self.node.waits(pids, list(request.include), pairs, None if caller.reads_all else caller.may_read)
        self.named_pids.update(found.peers)
        return found

    def _devices(self, request: pb.DevicesRequest, caller: Caller) -> NodeDevices:
        """NVML (and RAS when asked) for the found processes the caller may read."""
        if len(request.pids) > MAX_PIDS_PER_CALL:
            raise UsageError(f"{len(request.pids)} pids in one call; at most {MAX_PIDS_PER_CALL}")
        timeout, listen = request.timeout_seconds, request.listen_seconds
        if not (math.isfinite(timeout) and 0 < timeout <= MAX_DUMP_TIMEOUT):
            raise UsageError(f"timeout_seconds must be in (0, {MAX_DUMP_TIMEOUT:g}], not {timeout!r}")
        if not (math.isfinite(listen) and 0 <= listen <= MAX_XID_LISTEN):
            raise UsageError(f"listen_seconds must be in [0, {MAX_XID_LISTEN:g}], not {listen!r}")
        pids = [pid for pid in dict.fromkeys(request.pids) if pid in self.found_pids and caller.may_read(pid)]
        return self.node.devices(pids, listen=listen, timeout=timeout, ras=request.ras)

    def _find(self, job: str, caller: Caller) -> Discovery:
        if len(job) > MAX_JOB_SPEC:
            raise UsageError(f"job spec of {len(job)} characters; at most {MAX_JOB_SPEC}")
        spec = parse_job_spec(job)
        if not caller.reads_all and caller.uid is None:
            raise PermissionDenied(
                f"this agent cannot tell who is calling ({caller.how}), so it shows no process",
                help="Call it over loopback from the job's node, or give the operator's "
                "--token-file or client certificate.",
            )
        found = self.node.find_ranks(spec, readable=None if caller.reads_all else caller.may_read)
        self.found_pids = {pid for pid in self.found_pids if psutil.pid_exists(pid)}
        self.named_pids = {pid for pid in self.named_pids if psutil.pid_exists(pid)}
        self.found_pids.update(p.pid for p in found.ranks)
        for pid in [pid for pid in self.seen if pid not in self.found_pids]:
            del self.seen[pid]
        return found

    def _sample(self, request: pb.SampleRequest, caller: Caller) -> pb.SampleResponse:
        timeout = request.timeout_seconds if request.HasField("timeout_seconds") else self.config.dump_timeout
        if not (math.isfinite(timeout) and 0 < timeout <= MAX_DUMP_TIMEOUT):
            raise UsageError(f"timeout_seconds must be in (0, {MAX_DUMP_TIMEOUT:g}], not {timeout!r}")
        if not math.isfinite(request.t):
            raise UsageError(f"t must be a finite number, not {request.t!r}")
        found = None
        if request.WhichOneof("target") == "job":
            found = self._find(request.job, caller)
            procs = list(found.ranks)
        else:
            if len(request.processes.processes) > MAX_PIDS_PER_CALL:
                raise UsageError(
                    f"{len(request.processes.processes)} processes in one call; at most {MAX_PIDS_PER_CALL}"
                )
            unique = {p.pid: p for p in request.processes.processes}
            procs = [wire.rank_process_from_proto(p) for p in unique.values()]
        refused = {p.pid: self._refusal(p.pid, caller) for p in procs}
        allowed = [p for p in procs if refused[p.pid] is None]
        taken = dict(
            zip(
                (p.pid for p in allowed),
                self.node.sample(allowed, request.t, native=request.native, timeout=timeout),
                strict=False,
            )
        )
        for pid, sample in taken.items():
            self.seen.setdefault(pid, set()).update(f.filename for th in sample.threads for f in th.frames)
        samples = [(p.pid, taken.get(p.pid) or Sample(t=request.t, error=refused[p.pid])) for p in procs]
        return wire.samples_to_proto(samples, found)

    def _refusal(self, pid: int, caller: Caller) -> CaptureError | None:
        if pid not in self.found_pids and pid not in self.named_pids:
            return CaptureError(
                CaptureErrorKind.PTRACE_DENIED, f"pid {pid} is not a rank process this agent found (FindRanks first)"
            )
        if not caller.may_read(pid):
            return CaptureError(CaptureErrorKind.PTRACE_DENIED, f"the caller ({caller.label}) may not read pid {pid}")
        return None

    def _sources(self, request: pb.SampleSourcesRequest, caller: Caller) -> tuple[SourceFile, ...]:
        count = len(request.frames) + sum(len(q.frames) for q in request.queries)
        if count > MAX_SOURCE_FRAMES or len(request.queries) > MAX_PIDS_PER_CALL:
            raise UsageError(f"{count} frames in one call; at most {MAX_SOURCE_FRAMES}")
        wanted: dict[int, list[Frame]] = {}
        for query in request.queries:
            names = self.seen.get(query.pid, set()) if caller.may_read(query.pid) else set()
            frames = [f for raw in query.frames if (f := wire.frame_from_proto(raw)).filename in names]
            wanted.setdefault(query.pid, []).extend(frames)
        for raw in request.frames:  # without a pid: through any process that showed the file
            frame = wire.frame_from_proto(raw)
            pid = next(
                (pid for pid, names in self.seen.items() if frame.filename in names and caller.may_read(pid)), None
            )
            if pid is not None:
                wanted.setdefault(pid, []).append(frame)
        return self.node.sources({pid: frames for pid, frames in wanted.items() if frames})

    async def _run(
        self, context: _CallContext, caller: Caller, method: str, what: str, fn: Callable[..., T], *args: object
    ) -> T:
        t0 = time.monotonic()
        peer = context.peer()
        if via := _via(context):
            what = f"{what} via={via}"
        try:
            result = await self.lanes.run(self.lanes.lane(caller), fn, *args)
        except Exception as exc:  # noqa: BLE001 - the agent stays up whatever one request hits
            failure = exc
        else:
            audit(peer, caller.label, method, what, "ok", _ms(t0))
            return result
        await self._refuse(context, caller, method, what, failure, t0)

    async def _refuse(
        self, context: _CallContext, caller: Caller, method: str, what: str, failure: Exception, t0: float
    ) -> NoReturn:
        """Audit ``failure`` and end the call with its status (and its kind and help)."""
        peer = context.peer()
        outcome, code = _status_of(failure)
        told = isinstance(failure, (HangdocError, OverQuota))
        detail = str(failure) if told else f"{type(failure).__name__}: {failure}"
        if code is grpc.StatusCode.INTERNAL:
            log.error("%s from %s failed", method, _clean(peer), exc_info=failure)
        audit(peer, caller.label, method, what, f"{outcome}: {detail}", _ms(t0))
        if isinstance(failure, HangdocError):
            # the error's kind and help travel beside the status, so the user gets the same
            # help (ptrace rights, how to name one job) as on a single node
            context.set_trailing_metadata(((ERROR_KIND, type(failure).__name__), (ERROR_HELP, failure.help.encode())))
        await context.abort(code, detail)


def _via(context: object) -> str:
    """The caller a relay asked for (metadata ``x-hangdoc-via``): for the audit log only."""
    metadata = getattr(context, "invocation_metadata", None)
    found = (v for k, v in (metadata() or ()) if k == VIA) if callable(metadata) else iter(())
    return str(next(found, ""))


class RelayService(pb_grpc.RelayServicer):
    """The agent's relay role (docs/scale.md): the caller's call, made to the agents the
    request names, all at once from the agent's event loop (no thread a call), with
    ``RELAY_SLACK`` less than its own deadline; their answers merged (Sample answers into
    one table) and the nodes that failed named with their errors. It serves operators only,
    asks with the caller's ``authorization`` (and its own TLS certificate), and keeps
    nothing of what it forwards."""

    def __init__(self, agent: AgentService) -> None:
        self.agent = agent
        self._channels: dict[str, grpc.aio.Channel] = {}  # its children's, kept open between calls
        config = agent.config
        self._auth = AgentAuth(None, config.tls_cert, config.tls_key, config.tls_ca)

    async def Forward(self, request: pb.RelayRequest, context: grpc.aio.ServicerContext) -> pb.RelayResponse:
        caller = await self.agent.caller(context)
        what = f"method={request.method[:40]} children={len(request.children)}"
        t0 = time.monotonic()
        try:
            if caller not in (OPERATOR_BY_TOKEN, OPERATOR_BY_CERT):
                raise PermissionDenied(
                    f"a relay serves only the operator (token or client certificate), not {caller.label}",
                    help="A caller without the token is known only to its own node's agent: call that "
                    "node's agent directly (hangdoc diagnose --agents HOST:PORT), or give the "
                    "operator's --token-file or client certificate.",
                )
            _check_relay(request)
        except HangdocError as refused:
            await self.agent._refuse(context, caller, "Relay.Forward", what, refused, t0)
        metadata = tuple((k, str(v)) for k, v in context.invocation_metadata() or () if k == "authorization")
        metadata += ((VIA, f"{caller.label} at relay {self.agent.node.name}"),)
        answer = await self._forward(request, metadata)
        audit(context.peer(), caller.label, "Relay.Forward", what, "ok", _ms(t0))
        return answer

    async def _forward(self, request: pb.RelayRequest, metadata: Metadata) -> pb.RelayResponse:
        budget = request.timeout_seconds - RELAY_SLACK

        async def ask(child: pb.RelayChild) -> tuple[bytes | None, HangdocError | None]:
            channel = self._channel(child.address)
            if child.children:
                call = channel.unary_unary(
                    "/hangdoc.v1.Relay/Forward", request_serializer=pb.RelayRequest.SerializeToString
                )
                body: object = pb.RelayRequest(method=request.method, children=child.children, timeout_seconds=budget)
                timeout = budget
            else:
                call = channel.unary_unary(f"/hangdoc.v1.Agent/{request.method}")
                body, timeout = child.request, min(child.timeout_seconds, budget)
            # a leaf not connected yet: its call waits for the connection (through a failed
            # attempt: 12,500 relayed connections at once on 2 cores saw "Did not receive HTTP/2
            # settings before handshake timeout"), at most connect_seconds
            connecting = 0 < child.connect_seconds < timeout and not _connected(channel)
            try:
                made = call(body, timeout=timeout, metadata=metadata, wait_for_ready=connecting or None)
                if connecting:
                    done, _ = await asyncio.wait({asyncio.ensure_future(made)}, timeout=child.connect_seconds)
                    if not done and not _connected(channel):
                        made.cancel()
                        return None, AgentError(
                            f"agent {child.address} did not answer within {child.connect_seconds:.1f} s"
                        )
                return await made, None
            except grpc.RpcError as err:
                return None, call_error(child.address, err, timeout)

        answers = await asyncio.gather(*(ask(child) for child in request.children))
        out = pb.RelayResponse()
        merger = wire.TableMerger() if request.method == "Sample" else None
        for child, (got, error) in zip(request.children, answers, strict=True):
            if got is None:
                _failed(out, child, error)
            elif child.children:
                try:
                    out.MergeFromString(got)
                except DecodeError:
                    _failed(
                        out, child, wire.AgentApiError(f"relay {child.address} sent an answer that is no RelayResponse")
                    )
            elif merger is not None:
                try:
                    merger.add(child.address, pb.SampleResponse.FromString(got))
                except (DecodeError, HangdocError) as err:
                    _failed(out, child, err)
            else:
                out.answers.add(target=child.address, response=got)
        if merger is not None and merger.table.nodes:
            out.tables.append(merger.table)
        return out

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            if len(self._channels) >= MAX_RELAY_CHANNELS:
                old = self._channels.pop(next(iter(self._channels)))
                asyncio.get_running_loop().create_task(old.close())
            channel = self._channels[address] = self._auth.aio_channel(address)
        return channel


def _connected(channel: grpc.aio.Channel) -> bool:
    return bool(channel.get_state() is grpc.ChannelConnectivity.READY)


def _check_relay(request: pb.RelayRequest | pb.RelayChild, depth: int = 0) -> None:
    """A relay request within bounds: a method a relay forwards, at most ``FANOUT`` children
    a level, at most ``MAX_RELAY_DEPTH`` levels, a finite deadline."""
    if isinstance(request, pb.RelayRequest):
        timeout = request.timeout_seconds
        if request.method not in RELAYED:
            raise UsageError(f"a relay forwards {', '.join(sorted(RELAYED))}, not {request.method[:40]!r}")
        if not (math.isfinite(timeout) and RELAY_SLACK < timeout <= MAX_RELAY_TIMEOUT):
            raise UsageError(f"timeout_seconds must be in ({RELAY_SLACK:g}, {MAX_RELAY_TIMEOUT:g}], not {timeout!r}")
    children: Sequence[pb.RelayChild] = request.children
    if len(children) > FANOUT:
        raise UsageError(f"{len(children)} children of one relay; at most {FANOUT}")
    if depth >= MAX_RELAY_DEPTH:
        raise UsageError(f"a relay tree deeper than {MAX_RELAY_DEPTH} levels")
    for child in children:
        split_address(child.address)
        if child.children:
            _check_relay(child, depth + 1)
        elif not (math.isfinite(child.timeout_seconds) and 0 < child.timeout_seconds <= MAX_RELAY_TIMEOUT):
            raise UsageError(
                f"a child's timeout_seconds must be in (0, {MAX_RELAY_TIMEOUT:g}], not {child.timeout_seconds!r}"
            )


def _failed(out: pb.RelayResponse, child: pb.RelayChild, exc: BaseException | None) -> None:
    """``child`` (and, for a sub-relay, every node below it) failed this call."""
    failure = _failure(child.address, exc)
    if not child.children:
        out.answers.add(target=child.address, failure=failure)
        return
    below = pb.RelayFailure(
        message=f"relay {child.address}: {failure.message}",
        kind=AgentError.__name__,
        help=failure.help,
        relay=child.address,
    )
    for leaf in _leaves(child):
        out.answers.add(target=leaf, failure=below)


def _leaves(child: pb.RelayChild) -> list[str]:
    return [a for c in child.children for a in _leaves(c)] if child.children else [child.address]


def _failure(address: str, exc: BaseException | None) -> pb.RelayFailure:
    if isinstance(exc, HangdocError):
        return pb.RelayFailure(message=str(exc), kind=type(exc).__name__, help=exc.help)
    text = f"{type(exc).__name__}: {exc}" if exc is not None else "failed"
    return pb.RelayFailure(message=f"agent {address}: {text}", kind=AgentError.__name__, help=AgentError.help)


def _status_of(failure: Exception) -> tuple[str, grpc.StatusCode]:
    """The audit outcome and gRPC status for an error raised by a request's work."""
    if isinstance(failure, OverQuota):
        return "refused", grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(failure, JobNotFound):
        return "not found", grpc.StatusCode.NOT_FOUND
    if isinstance(failure, UsageError):
        return "invalid", grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(failure, PermissionDenied):
        return "denied", grpc.StatusCode.PERMISSION_DENIED
    if isinstance(failure, HangdocError):
        return "failed", grpc.StatusCode.FAILED_PRECONDITION
    return "error", grpc.StatusCode.INTERNAL


def _pid_list(pids: Collection[int]) -> str:
    shown = ",".join(str(p) for p in list(pids)[:16])
    return shown + (f",...({len(pids)} in all)" if len(pids) > 16 else "") if pids else "-"


def _rank_flight(pid: int, answer: ProbeAnswer) -> pb.RankFlight:
    """One process's probe answer on the wire (``RankFlight``)."""
    msg = pb.RankFlight(
        pid=pid,
        dump=flight_record_to_json(answer.flight) if answer.flight else "",
        reason=answer.reason,
        status=_PROBE_STATUS[answer.status],
    )
    if answer.heartbeat is not None:
        msg.heartbeat.CopyFrom(wire.heartbeat_to_proto(answer.heartbeat))
    for exc in answer.exceptions:
        out = msg.exceptions.add(
            thread_id=exc.thread_id, type_name=exc.type_name, raised_at=wire.frame_to_proto(exc.raised_at)
        )
        if exc.thread_name is not None:
            out.thread_name = exc.thread_name
    return msg


def _clean(text: str, limit: int = 160) -> str:
    """A caller-supplied string made safe for one log line: escaped, bounded, ASCII."""
    return one_line(text[: limit + 1], limit).encode("ascii", "backslashreplace").decode()


def audit(peer: str, caller: str, method: str, what: str, outcome: str, ms: float) -> None:
    """One line per request on the ``hangdoc.audit`` logger (stderr by default)."""
    audit_log.info(
        "audit peer=%s caller=%s method=%s %s outcome=%s ms=%.0f",
        _clean(peer, 64),
        _clean(caller, 64),
        _clean(method, 64),
        _clean(what),
        _clean(outcome, 240),
        ms,
    )


def _ms(t0: float) -> float:
    return (time.monotonic() - t0) * 1000


def _credentials(config: AgentConfig) -> grpc.ServerCredentials | None:
    if not config.tls_cert:
        return None
    check_tls(config.tls_cert, config.tls_key, config.tls_ca, server=True)
    key = read_private(config.tls_key or "", "TLS key")
    cert = read_private(config.tls_cert, "TLS certificate")
    ca = read_private(config.tls_ca or "", "TLS CA")
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


async def serve(
    config: AgentConfig, ready: Callable[[int], None] | None = None, stop: asyncio.Event | None = None
) -> int:
    """Run until SIGTERM/SIGINT, or until ``stop`` is set when one is given (then no signal
    handler is installed: see ``serve_in_thread``). ``ready(port)`` is called once the port
    is bound. Calls in flight get ``STOP_GRACE_S`` seconds; returns how many requests'
    work was still running in threads then (each ends by its own deadline, unwaited)."""
    check_listen_policy(config)
    interceptors = [TokenAuth(config.token, config.open_health)] if config.token else []
    fds = limits.fd_limit()
    server = grpc.aio.server(
        interceptors=interceptors, options=limits.server_options(fds), maximum_concurrent_rpcs=limits.MAX_CALLS
    )
    service = AgentService(config)
    pb_grpc.add_AgentServicer_to_server(service, server)
    pb_grpc.add_RelayServicer_to_server(RelayService(service), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    creds = _credentials(config)
    try:
        if creds is not None:
            port = server.add_secure_port(config.listen, creds)
        else:
            port = server.add_insecure_port(config.listen)
    except RuntimeError as exc:
        raise UsageError(f"cannot listen on {config.listen}: {exc}") from None
    if port == 0:
        raise UsageError(f"cannot listen on {config.listen}: address in use or not local")
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set("hangdoc.v1.Agent", health_pb2.HealthCheckResponse.SERVING)
    if stop is None:
        stop = _stop_on_signals()
    auth = "token" if config.token else "mTLS" if creds else "none"
    log.info(
        "hangdoc agent %s on %s (port %d, auth: %s, host %s)",
        __version__,
        config.listen,
        port,
        auth,
        socket.gethostname(),
    )
    log.info(
        "limits: %d connections (descriptor limit %d), operator %d threads and %d probe reads, "
        "local users %d threads (%d requests per user) and %d probe reads (%d per user); "
        "probe answers held at once <= %d MiB",
        limits.max_connections(fds),
        fds,
        limits.OPERATOR_WORKERS,
        limits.OPERATOR_PROBE_READS,
        limits.USER_WORKERS,
        limits.REQUESTS_PER_USER,
        limits.USER_PROBE_READS,
        limits.PROBE_READS_PER_USER,
        limits.answer_memory_bound() >> 20,
    )
    if ready:
        ready(port)
    link = _server_link(config, service.watch, port)
    await stop.wait()
    log.info("shutting down")
    if link is not None:
        await asyncio.get_running_loop().run_in_executor(None, link.stop)
    await health_servicer.enter_graceful_shutdown()
    await server.stop(grace=limits.STOP_GRACE_S)
    running = service.lanes.shutdown()
    if running:
        log.info("%s still running after the grace period, not waited for", counted(running, "request"))
    return running


def _server_link(config: AgentConfig, watch: JobWatch, port: int) -> ServerLink | None:
    """With ``--server``: report the node's jobs to it from now on."""
    if not config.server:
        return None
    token = config.token
    cert = (config.tls_cert, config.tls_key) if config.tls_cert and config.tls_key else None
    link = ServerLink(config.server, watch, port, token=token, ca=config.tls_ca, cert=cert, advertise=config.advertise)
    link.start()
    return link


def _stop_on_signals() -> asyncio.Event:
    """An event set by the first SIGTERM or SIGINT; the next one ends the process at once."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def first(sig: signal.Signals) -> None:
        log.info("%s: stopping (again to stop at once)", sig.name)
        stop.set()
        for each in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(each, _exit_now, each)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, first, sig)
    return stop


def _exit_now(sig: signal.Signals) -> None:
    log.info("%s again: stopping now", sig.name)
    _flush_and_exit(128 + sig)


def _flush_and_exit(code: int) -> None:
    """``os._exit``: no thread is joined (the work left ends by its own deadlines, or with
    the process); the log is flushed first."""
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(code)


class BackgroundAgent:
    """An agent served by a thread of this process (``serve_in_thread``); ``stop()`` ends it."""

    def __init__(
        self, port: int, loop: asyncio.AbstractEventLoop, stop: asyncio.Event, thread: threading.Thread
    ) -> None:
        self.port = port
        self._loop, self._stop, self._thread = loop, stop, thread

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (in-flight calls get the server's grace period) and join the thread."""
        if self._thread.is_alive():
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:
                pass  # the loop has already closed
            self._thread.join(timeout)


def serve_in_thread(config: AgentConfig, timeout: float = 30.0) -> BackgroundAgent:
    """Start ``serve(config)`` in a daemon thread with its own event loop and return once
    its port is bound, for a process that must go on with other work (a Ray actor). The
    listen policy is checked as for ``hangdoc agent``; no signal handler is installed."""
    check_listen_policy(config)
    started: queue.Queue[tuple[int, asyncio.AbstractEventLoop, asyncio.Event] | BaseException] = queue.Queue()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        await serve(config, lambda port: started.put((port, loop, stop)), stop)

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller still waiting
            started.put(exc)

    thread = threading.Thread(target=run, name="hangdoc-agent", daemon=True)
    thread.start()
    try:
        got = started.get(timeout=timeout)
    except queue.Empty:
        raise UsageError(f"the agent on {config.listen} did not start within {timeout:g} s") from None
    if isinstance(got, BaseException):
        thread.join(timeout)
        raise got
    port, loop, stop = got
    return BackgroundAgent(port, loop, stop, thread)


def run_agent(config: AgentConfig) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s hangdoc-agent %(message)s")
    check_listen_policy(config)
    limits.raise_fd_limit()

    def announce(port: int) -> None:
        print(f"hangdoc agent listening on port {port}", file=sys.stderr, flush=True)

    if asyncio.run(serve(config, announce)):
        _flush_and_exit(0)  # threads still reading a probe or running py-spy are not joined
    return 0


__all__ = [
    "AgentConfig",
    "BackgroundAgent",
    "check_listen_policy",
    "read_token",
    "run_agent",
    "serve",
    "serve_in_thread",
]
