"""``hangdoc agent``: the per-node gRPC server that finds and samples a job's ranks there.

It serves the ``hangdoc.v1.Agent`` API (``proto/hangdoc/v1/agent.proto``) and the standard
gRPC health service, on loopback by default. Off loopback it refuses to start without a
token (``--token-file``, checked on every call as ``authorization: Bearer <token>``) or
mutual TLS, unless ``--insecure`` is given on purpose. It only reads: discovery, py-spy
dumps, /proc; it never signals the job. Blocking work runs in threads so that one slow
dump does not stall other callers; one log line per request goes to stderr.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from . import SCHEMA_VERSION, __version__
from .agentapi import convert
from .agentapi.v1 import agent_pb2 as pb
from .agentapi.v1 import agent_pb2_grpc as pb_grpc
from .bundle import load_snapshot
from .errors import HangdocError, JobNotFound, PySpyMissing, UsageError
from .jobspec import parse_job_spec
from .model import ThreadStack
from .node import LocalNode, ReplayNode
from .pyspy import find_pyspy

DEFAULT_LISTEN = "127.0.0.1:7420"
API_VERSION = "hangdoc.v1"
log = logging.getLogger("hangdoc.agent")


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
    open_health: bool = False  # answer grpc.health.v1 without the token (Kubernetes probes)
    replay: str | None = None  # serve this saved snapshot instead of live processes (benchmarks)
    replay_rank_offset: int = 0
    replay_world_size: int | None = None


def read_token(path: str) -> str:
    """The token in ``path`` (whitespace stripped); a clear error when unusable."""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise UsageError(f"cannot read token file {path}: {exc.strerror}") from None
    if len(token) < 16:
        raise UsageError(f"token in {path} is shorter than 16 characters; use `openssl rand -hex 32`")
    return token


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise UsageError(f"listen address {address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen_policy(config: AgentConfig) -> None:
    """Refuse to expose ptrace-backed reads off loopback without authentication."""
    host, _ = split_address(config.listen)
    tls = bool(config.tls_cert and config.tls_key and config.tls_ca)
    if any((config.tls_cert, config.tls_key, config.tls_ca)) and not tls:
        raise UsageError("mutual TLS needs all of --tls-cert, --tls-key and --tls-ca")
    if not is_loopback(host) and not (config.token or tls or config.insecure):
        raise UsageError(
            f"refusing to listen on {config.listen} without authentication: give --token-file "
            "or --tls-cert/--tls-key/--tls-ca (or --insecure, if the network is trusted)"
        )


_HEALTH = "/grpc.health.v1.Health/"


class TokenAuth(grpc.aio.ServerInterceptor):
    """Rejects every call whose ``authorization`` metadata does not carry the token."""

    def __init__(self, token: str, open_health: bool = False) -> None:
        self._expected = f"Bearer {token}".encode()
        self._open_health = open_health

        async def deny(request: object, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong hangdoc token")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if self._open_health and details.method.startswith(_HEALTH):
            return await continuation(details)  # opted in: kubelet gRPC probes carry no token
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                if hmac.compare_digest(given, self._expected):
                    return await continuation(details)
        log.info("denied %s: no valid token", details.method)
        return self._deny


class AgentService(pb_grpc.AgentServicer):
    """Translates RPCs to the local node's discovery and sampling; never raises raw errors."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        # files seen in stacks this agent captured: the only ones SampleSources will read
        self.seen_files: set[str] = set()
        # rank processes this agent found: the only ones Heartbeats will look at
        self.found_pids: set[int] = set()
        self.node: LocalNode | ReplayNode = LocalNode(config.host)
        if config.replay:
            self.node = ReplayNode(load_snapshot(config.replay), config.host or socket.gethostname(),
                                   config.replay_rank_offset, config.replay_world_size)

    async def GetInfo(self, request: pb.GetInfoRequest, context: grpc.aio.ServicerContext) -> pb.AgentInfo:
        info = pb.AgentInfo(
            hangdoc_version=__version__, schema_version=SCHEMA_VERSION, api_version=API_VERSION,
            host=self.node.name, pid=os.getpid(), native=True, features=["sources"] if self.config.replay else ["sources", "heartbeats"],
            python_version=sys.version.split()[0],
        )
        try:
            info.pyspy_path = find_pyspy()
        except PySpyMissing:
            pass
        return info

    async def FindRanks(self, request: pb.FindRanksRequest, context: grpc.aio.ServicerContext) -> pb.Discovery:
        found = await self._run(context, "FindRanks", request.job, self._find, request.job)
        return convert.discovery_to_proto(found)

    async def Sample(self, request: pb.SampleRequest, context: grpc.aio.ServicerContext) -> pb.SampleResponse:
        timeout = request.timeout_seconds if request.HasField("timeout_seconds") else self.config.dump_timeout
        found = None
        if request.WhichOneof("target") == "job":
            found = await self._run(context, "Sample", request.job, self._find, request.job)
            procs = list(found.ranks)
        else:
            procs = [convert.rank_process_from_proto(p) for p in request.processes.processes]
        samples = await self._run(
            context, "Sample", f"{len(procs)} pid(s)",
            lambda: self.node.sample(procs, request.t, native=request.native, timeout=timeout),
        )
        self.seen_files.update(f.filename for s in samples for th in s.threads for f in th.frames)
        response = convert.samples_to_proto([(p.pid, s) for p, s in zip(procs, samples)])
        if found is not None:
            response.discovery.CopyFrom(convert.discovery_to_proto(found))
        return response

    async def SampleSources(
        self, request: pb.SampleSourcesRequest, context: grpc.aio.ServicerContext
    ) -> pb.SampleSourcesResponse:
        # only lines of files that appeared in this agent's own captures: a caller must not
        # turn the agent into a reader of arbitrary files on the node
        frames = tuple(
            frame for f in request.frames
            if (frame := convert.frame_from_proto(f)).filename in self.seen_files
        )
        thread = ThreadStack(0, None, frames)
        sources = await self._run(context, "SampleSources", f"{len(frames)} frame(s)",
                                  self.node.sources, [thread])
        return pb.SampleSourcesResponse(files=[convert.source_file_to_proto(s) for s in sources])

    async def Heartbeats(
        self, request: pb.HeartbeatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.HeartbeatsResponse:
        pids = [pid for pid in request.pids if pid in self.found_pids]
        beats = await self._run(context, "Heartbeats", f"{len(pids)} pid(s)", self.node.heartbeats, pids)
        return pb.HeartbeatsResponse(heartbeats=[convert.heartbeat_to_proto(b) for b in beats.values()])

    def _find(self, job: str):
        found = self.node.find_ranks(parse_job_spec(job))
        self.found_pids.update(p.pid for p in found.ranks)
        return found

    async def _run(self, context, method: str, what: str, fn, *args):
        t0 = time.monotonic()
        peer = context.peer()
        try:
            result = await asyncio.to_thread(fn, *args)
        except JobNotFound as exc:
            log.info("%s %s from %s: not found (%.0f ms)", method, what, peer, _ms(t0))
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except UsageError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except HangdocError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except Exception as exc:  # the agent stays up whatever one request hits
            log.exception("%s %s from %s failed", method, what, peer)
            await context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        log.info("%s %s from %s: ok (%.0f ms)", method, what, peer, _ms(t0))
        return result


def _ms(t0: float) -> float:
    return (time.monotonic() - t0) * 1000


def _credentials(config: AgentConfig) -> grpc.ServerCredentials | None:
    if not config.tls_cert:
        return None
    try:
        key = Path(config.tls_key or "").read_bytes()
        cert = Path(config.tls_cert).read_bytes()
        ca = Path(config.tls_ca or "").read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read TLS file {exc.filename}: {exc.strerror}") from None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


async def serve(config: AgentConfig, ready: Callable[[int], None] | None = None) -> None:
    """Run until SIGTERM/SIGINT. ``ready(port)`` is called once the port is bound."""
    check_listen_policy(config)
    interceptors = [TokenAuth(config.token, config.open_health)] if config.token else []
    server = grpc.aio.server(interceptors=interceptors)
    pb_grpc.add_AgentServicer_to_server(AgentService(config), server)
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
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    auth = "token" if config.token else "mTLS" if creds else "none"
    log.info("hangdoc agent %s on %s (port %d, auth: %s, host %s)", __version__, config.listen,
             port, auth, socket.gethostname())
    if ready:
        ready(port)
    await stop.wait()
    log.info("shutting down")
    await health_servicer.enter_graceful_shutdown()
    await server.stop(grace=2.0)


def run_agent(config: AgentConfig) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s hangdoc-agent %(message)s")
    check_listen_policy(config)

    def announce(port: int) -> None:
        print(f"hangdoc agent listening on port {port}", file=sys.stderr, flush=True)

    asyncio.run(serve(config, announce))
    return 0


__all__ = ["AgentConfig", "check_listen_policy", "read_token", "run_agent", "serve"]
