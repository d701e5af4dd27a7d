"""A node reached through its ``hangdoc agent`` over gRPC: the remote ``Node``.

Translates the coordinator's calls to RPCs and back to the data model, so a snapshot
merged from agents is the same data as one captured locally. Errors become ``HangdocError``
values with the agent's address in them: the coordinator lists such a node as unreachable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import grpc
from google.protobuf.message import Message

from .. import SCHEMA_VERSION
from ..capture.find.discover import Discovery
from ..capture.find.jobspec import JobSpec
from ..capture.read.flight_recorder import FlightRecordInvalid, read_flight_record
from ..capture.read.ncclras import RasReportInvalid, read_ras_report
from ..capture.read.source import keeps_source
from ..errors import HangdocError, JobNotFound, PermissionDenied, UsageError
from ..model import (
    PID_MAX,
    Frame,
    Heartbeat,
    ProbeAnswer,
    ProbeStatus,
    RankProcess,
    Sample,
    SourceFile,
    ThreadException,
)
from ..probe import MAX_EXCEPTIONS
from . import wire
from .credfiles import check_tls, read_private, read_token
from .jobwatch import NodeJobs
from .node import NodeDevices, ProbeAnswers, Waited
from .v1 import agent_pb2 as pb
from .v1 import agent_pb2_grpc as pb_grpc
from .wire import ERROR_HELP, ERROR_KIND

Metadata = tuple[tuple[str, str], ...]
# each Agent method's response message, to read an answer that came through a relay
RESPONSES: dict[str, type[Message]] = {
    m.name: getattr(pb, m.output_type.name) for m in pb.DESCRIPTOR.services_by_name["Agent"].methods
}
_planning = threading.local()  # .plan: the Plan answering this thread's calls, if any


class Plan(Protocol):
    """Answers a ``RemoteNode``'s calls in place of the agent (``fleet.tree``): the agent's
    serialized answer or a decoded one, or raises the call's error, or ``Planned``."""

    def answer(self, node: RemoteNode, method: str, request: Message, timeout: float) -> object: ...


class Planned(BaseException):  # noqa: N818 - not an error: a call put aside (callers catch Exception)
    """A call a ``Plan`` has no answer for yet: it will make it through the relays."""


@contextmanager
def planning(plan: Plan) -> Iterator[None]:
    """Calls of ``RemoteNode``s in this thread answered by ``plan`` within the block."""
    _planning.plan = plan
    try:
        yield
    finally:
        _planning.plan = None


_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 256 * 1024 * 1024)]
MAX_THREADS_WAITING = 4096  # waits kept of one process's answer
MAX_PEERS = 1024  # peer processes kept of one answer

_PROBE_STATUS = {
    pb.PROBE_STATUS_ANSWERED: ProbeStatus.ANSWERED,
    pb.PROBE_STATUS_NO_PROBE: ProbeStatus.NO_PROBE,
    pb.PROBE_STATUS_FAILED: ProbeStatus.FAILED,
}


class AgentError(HangdocError):
    """An agent could not be reached or refused the call."""

    exit_code = 7
    help = (
        "Check that `hangdoc agent` runs on that node, that its port is reachable from here, "
        "and that --token-file / --tls-* match the agent's."
    )


@dataclass(frozen=True)
class AgentAuth:
    """How to authenticate to agents: a shared token and/or mutual TLS files."""

    token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None

    def channel(self, address: str) -> grpc.Channel:
        if not self.tls_ca:
            return grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        return grpc.secure_channel(address, self._credentials(), options=_CHANNEL_OPTIONS)

    def aio_channel(self, address: str) -> grpc.aio.Channel:
        """The same channel for an event loop's calls (a relay's)."""
        if not self.tls_ca:
            return grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
        return grpc.aio.secure_channel(address, self._credentials(), options=_CHANNEL_OPTIONS)

    def _credentials(self) -> grpc.ChannelCredentials:
        check_tls(self.tls_cert, self.tls_key, self.tls_ca, server=False)
        return grpc.ssl_channel_credentials(
            root_certificates=read_private(self.tls_ca or "", "TLS CA"),
            private_key=read_private(self.tls_key, "TLS key") if self.tls_key else None,
            certificate_chain=read_private(self.tls_cert, "TLS certificate") if self.tls_cert else None,
        )

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


class RemoteNode:
    """The ``Node`` behind one agent address (``host:port``)."""

    def __init__(self, address: str, auth: AgentAuth = AgentAuth(), connect_timeout: float = 5.0) -> None:
        self.address = address
        self.auth = auth
        self.connect_timeout = connect_timeout
        self._channel = auth.channel(address)
        self._stub = pb_grpc.AgentStub(self._channel)
        self._host: str | None = None
        # the last Sample request's processes, as sent: a watch asks for the same ones every
        # round; one attribute, so a concurrent call sees a matching pair or none
        self._asked: tuple[tuple[RankProcess, ...], pb.RankProcessList] | None = None
        self._raw: dict[str, Callable[..., bytes]] = {}  # Agent methods taking and giving bytes (relays)
        self.relay_failed = False  # as a relay, in this diagnosis: not asked to relay again (fleet.tree)

    @property
    def name(self) -> str:
        return self.address

    def info(self) -> pb.AgentInfo:
        info: pb.AgentInfo = self._call("GetInfo", pb.GetInfoRequest(), self.connect_timeout)
        return self._checked(info)

    def _checked(self, info: pb.AgentInfo) -> pb.AgentInfo:
        """``info`` of an agent that speaks this hangdoc's schema; ``AgentError`` otherwise."""
        if info.schema_version != SCHEMA_VERSION:
            raise AgentError(
                f"agent {self.address} speaks schema {info.schema_version} (hangdoc "
                f"{info.hangdoc_version}); this hangdoc speaks {SCHEMA_VERSION}: run the same "
                "hangdoc version on every node"
            )
        self._host = info.host
        return info

    def find_ranks(self, spec: JobSpec) -> Discovery:
        """The job's ranks on this node. Asked directly, the first time, ``GetInfo`` comes
        first: answered within the connect timeout, it tells a stopped agent sooner than
        FindRanks' longer deadline would. Through relays the relay bounds the connection
        instead (``RelayChild.connect_seconds``) and the FindRanks answer carries what
        ``GetInfo`` says: one call, one pass through the tree (an older agent's answer does
        not carry it: it is then asked)."""
        if self._host is None and getattr(_planning, "plan", None) is None:
            self.info()
        msg = self._call("FindRanks", pb.FindRanksRequest(job=spec.raw), self.connect_timeout + 10)
        if self._host is None and msg.HasField("agent"):
            self._checked(msg.agent)
        elif self._host is None:
            self.info()  # an agent older than Discovery.agent
        return wire.discovery_from_proto(msg)

    def sample(self, procs: Sequence[RankProcess], t: float, *, native: bool, timeout: float) -> list[Sample]:
        request = pb.SampleRequest(processes=self._process_list(procs), t=t, native=native, timeout_seconds=timeout)
        response = self._call("Sample", request, timeout + 2.0)
        by_pid = wire.samples_from_proto(response)
        return [by_pid[p.pid] for p in procs]

    def _process_list(self, procs: Sequence[RankProcess]) -> pb.RankProcessList:
        """``procs`` on the wire, translated again only when they differ from the last call's
        (about 7% of the coordinator's CPU per agent in a round: docs/benchmarks.md)."""
        key, asked = tuple(procs), self._asked  # read once: another thread may replace it
        if asked is None or asked[0] != key:
            asked = self._asked = (key, pb.RankProcessList(processes=[wire.rank_process_to_proto(p) for p in key]))
        return asked[1]

    def sources(self, wanted: Mapping[int, Sequence[Frame]]) -> tuple[SourceFile, ...]:
        queries = []
        for pid, frames in wanted.items():
            kept = {f for f in frames if not f.native and f.line and keeps_source(f.filename)}
            if kept:
                queries.append(pb.SourceQuery(pid=pid, frames=[wire.frame_to_proto(f) for f in kept]))
        if not queries:
            return ()
        try:
            response = self._call("SampleSources", pb.SampleSourcesRequest(queries=queries), self.connect_timeout)
        except AgentError:
            return ()  # source lines refine the analysis; their absence does not stop it
        return tuple(wire.source_file_from_proto(f) for f in response.files)

    def heartbeats(self, pids: Sequence[int]) -> dict[int, Heartbeat]:
        response = self._call("Heartbeats", pb.HeartbeatsRequest(pids=list(pids)), self.connect_timeout)
        return {b.pid: wire.heartbeat_from_proto(b) for b in response.heartbeats}

    def probe(self, pids: Sequence[int], timeout: float) -> ProbeAnswers:
        request = pb.FlightRequest(pids=list(pids), timeout_seconds=timeout)
        try:
            response = self._call("Flight", request, timeout + self.connect_timeout)
        except AgentError as err:  # an agent without the call: probes refine, never block
            return {pid: ProbeAnswer(ProbeStatus.FAILED, f"its agent gave none: {err}") for pid in pids}
        return {rank.pid: self._probe_answer(rank) for rank in response.ranks}

    def _probe_answer(self, msg: pb.RankFlight) -> ProbeAnswer:
        status = _PROBE_STATUS.get(msg.status)
        if status is None:  # an agent before "probe-state": a dump, or no probe
            status = ProbeStatus.ANSWERED if msg.dump else ProbeStatus.NO_PROBE
        reason, record = msg.reason[:300], None
        if msg.dump:
            try:
                record = read_flight_record(msg.dump.encode(), source=f"probe via {self.address}")
            except FlightRecordInvalid as err:
                reason = f"its agent sent a dump hangdoc cannot read: {err}"
        exceptions = tuple(
            ThreadException(
                e.thread_id,
                e.thread_name if e.HasField("thread_name") else None,
                e.type_name,
                wire.frame_from_proto(e.raised_at),
            )
            for e in msg.exceptions[:MAX_EXCEPTIONS]
        )
        heartbeat = wire.heartbeat_from_proto(msg.heartbeat) if msg.HasField("heartbeat") else None
        return ProbeAnswer(status, reason, record, heartbeat, exceptions)

    def devices(self, pids: Sequence[int], *, listen: float, timeout: float, ras: bool) -> NodeDevices:
        request = pb.DevicesRequest(pids=list(pids), listen_seconds=listen, timeout_seconds=timeout, ras=ras)
        try:
            response = self._call("Devices", request, timeout + listen + self.connect_timeout + 4.0)
        except AgentError as err:  # an agent without the call: GPU state refines, never blocks
            return NodeDevices(gpu_reason=f"its agent gave none: {err}", ras_reason=f"its agent gave none: {err}")
        wanted = set(pids)
        gpus = {
            r.pid: tuple(wire.gpu_state_from_proto(g) for g in r.gpus[:64])
            for r in response.ranks
            if r.pid in wanted and r.gpus
        }
        report, ras_reason = None, response.ras_reason[:300]
        if response.ras_output:
            try:
                report = read_ras_report(response.ras_output, source=f"ncclras via {self.address}")
            except RasReportInvalid as err:
                ras_reason = f"its agent sent a RAS report hangdoc cannot read: {err}"
        return NodeDevices(gpus, response.gpu_reason[:600], report, ras_reason)

    def waits(
        self, pids: Sequence[int], include: Sequence[str] = (), sockets: Sequence[tuple[str, str]] = ()
    ) -> Waited:
        """What the agent reads of ``pids``' waits; nothing from an agent without the call
        (older than the "waits" feature): the wait is then not followed on its node."""
        try:
            request = pb.WaitsRequest(pids=list(pids), include=list(include), sockets=[f"{a}>{b}" for a, b in sockets])
            response = self._call("Waits", request, 10.0 + self.connect_timeout)
        except AgentError:
            return Waited()
        wanted = set(pids)
        waits = {
            w.pid: tuple(wire.wait_from_proto(x) for x in w.waits[:MAX_THREADS_WAITING])
            for w in response.waits
            if w.pid in wanted
        }
        asked = {f"{a}>{b}": (a, b) for a, b in sockets}
        holders = {
            asked[h.socket]: tuple(p for p in h.pids[:MAX_PEERS] if 0 <= p <= PID_MAX)
            for h in response.holders
            if h.socket in asked
        }
        named = {p for ws in waits.values() for w in ws for p in w.peers} | {p for ps in holders.values() for p in ps}
        peers = {}
        for msg in response.peers[:MAX_PEERS]:
            proc = wire.rank_process_from_proto(msg)
            if proc.pid in named or include:
                peers[proc.pid] = replace(proc, rank=None)  # the host as the agent names its node
        return Waited(waits, peers, holders)

    def jobs(self, timeout: float = 60.0) -> NodeJobs:
        """One look at the node's jobs (``jobwatch``); an agent without the call raises
        ``AgentError`` like any failed call."""
        response = self._call("Jobs", pb.JobsRequest(), timeout + self.connect_timeout)
        return wire.node_jobs_from_proto(response)

    def close(self) -> None:
        self._channel.close()

    def forward(self, method: str, request: bytes, timeout: float, metadata: Metadata) -> bytes:
        """``method`` of the Agent API with a request serialized elsewhere, its answer as sent:
        what a relay does for its caller, with the caller's ``metadata``."""
        call = self._raw.get(method)
        if call is None:
            call = self._raw[method] = self._channel.unary_unary(f"/hangdoc.v1.Agent/{method}")
        answer: bytes = self._invoke(call, request, timeout, metadata)
        return answer

    def relay(self, request: bytes, timeout: float, metadata: Metadata) -> bytes:
        """This agent's relay role (``Relay.Forward``) for a serialized ``RelayRequest``
        (``wire.relay_request``): its serialized ``RelayResponse``."""
        call = self._channel.unary_unary("/hangdoc.v1.Relay/Forward")
        answer: bytes = self._invoke(call, request, timeout, metadata)
        return answer

    def _call(self, method: str | Callable[..., object], request: Message, timeout: float) -> Any:
        """``method`` (an Agent method's name) of this agent; while a ``Plan`` is under way
        in this thread (``fleet.tree``), the plan answers it instead."""
        if not isinstance(method, str):
            return self._invoke(method, request, timeout, self.auth.metadata)
        plan: Plan | None = getattr(_planning, "plan", None)
        if plan is None:
            return self._invoke(getattr(self._stub, method), request, timeout, self.auth.metadata)
        got = plan.answer(self, method, request, timeout)
        return RESPONSES[method].FromString(got) if isinstance(got, bytes) else got

    def _invoke(self, method: Callable[..., Any], request: object, timeout: float, metadata: Metadata) -> Any:
        try:
            return method(request, timeout=timeout, metadata=metadata)
        except grpc.RpcError as err:
            raise call_error(self.address, err, timeout) from None


def call_error(address: str, err: grpc.RpcError, timeout: float) -> HangdocError:
    """What a failed call to the agent at ``address`` raises: the agent's own error (its kind
    and help came along), or one for the call's status."""
    code = err.code() if hasattr(err, "code") else None
    detail = err.details() if hasattr(err, "details") else str(err)
    if (known := _agent_error(address, err, detail)) is not None:
        return known
    if code == grpc.StatusCode.NOT_FOUND:
        return JobNotFound(detail)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(f"agent {address}: {detail}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return AgentError(f"agent {address} refused the call: {detail}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return AgentError(f"agent {address} did not answer within {timeout:.1f} s")
    if code == grpc.StatusCode.UNAVAILABLE:
        return AgentError(f"agent {address} unavailable: {detail}")
    name = code.name if code is not None else "error"
    return AgentError(f"agent {address}: {name}: {detail}")


def _agent_error(address: str, err: grpc.RpcError, detail: str) -> HangdocError | None:
    """The agent's own HangdocError, rebuilt from the kind and help it sent along, or
    None when it sent none (an older agent, a transport failure)."""
    trailing = dict(err.trailing_metadata() or ()) if hasattr(err, "trailing_metadata") else {}
    name = str(trailing.get(ERROR_KIND, ""))
    kind = next((cls for cls in _subclasses(HangdocError) if cls.__name__ == name), None)
    if kind is None:
        return None
    raw_help = trailing.get(ERROR_HELP, b"")
    help_text = raw_help.decode(errors="replace") if isinstance(raw_help, bytes) else str(raw_help)
    message = detail if kind is JobNotFound else f"agent {address}: {detail}"
    try:
        return kind(message, help=help_text or None)
    except TypeError:  # a class that takes other arguments: keep the status mapping
        return None


def rebuilt_error(kind: str, message: str, help_text: str) -> HangdocError:
    """The error a relay reported for a node (``RelayFailure``), as the caller would have
    raised it asking the node itself; ``AgentError`` for a kind this side does not know."""
    cls = next((c for c in _subclasses(HangdocError) if c.__name__ == kind), AgentError)
    try:
        return cls(message[:2000], help=help_text[:2000] or None)
    except TypeError:
        return AgentError(message[:2000], help=help_text[:2000] or None)


def _subclasses(cls: type[HangdocError]) -> list[type[HangdocError]]:
    return [cls] + [s for sub in cls.__subclasses__() for s in _subclasses(sub)]


def named_agents(
    agents: str | None,
    hostfile: str | None,
    token_file: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_ca: str | None,
) -> list[RemoteNode]:
    """The agents ``--agents``/``--hostfile`` name, each with the authentication the token
    and TLS files give; [] when they name none (the token is then not read)."""
    addresses = parse_agents(agents, hostfile)
    if not addresses:
        return []
    auth = AgentAuth(read_token(token_file) if token_file else None, tls_cert, tls_key, tls_ca)
    return [RemoteNode(a, auth) for a in addresses]


def parse_agents(agents: str | None, hostfile: str | None, default_port: int = 7420) -> list[str]:
    """Agent addresses from ``--agents a:7420,b`` and/or a hostfile (one per line, # comments)."""
    entries: list[str] = []
    if agents:
        entries += [a.strip() for a in agents.split(",") if a.strip()]
    if hostfile:
        try:
            text = Path(hostfile).read_text()
        except OSError as exc:
            raise UsageError(f"cannot read hostfile {hostfile}: {exc.strerror}") from None
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                entries.append(line.split()[0])
    out = []
    for entry in entries:
        host, sep, port = entry.rpartition(":")
        valid_port = port.isascii() and port.isdigit() and 1 <= int(port) <= 65535
        if sep and valid_port and host:
            out.append(entry)
        elif sep:
            raise UsageError(f"agent address {entry!r} is not HOST[:PORT] with a port from 1 to 65535")
        else:
            out.append(f"{entry}:{default_port}")
    return list(dict.fromkeys(out))
