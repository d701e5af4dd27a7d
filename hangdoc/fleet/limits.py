"""How much of an agent one caller may hold: threads, probe reads, connections, descriptors.

A node runs a few dozen ranks (8 on a GPU node, up to 128 on the largest CPU nodes) and
has a few callers: the operator's coordinator (one call per node per step of a diagnosis,
a few at once with ``watch``) and now and then a local user asking about their own job.
Every number below is sized for that, with room, and bounds what an attacker can take:

- **Requests** run in threads, never on the event loop. The operator (token, client
  certificate, ``--insecure``, or a local caller that reads every process: root) has
  ``OPERATOR_WORKERS`` threads of its own, which no other caller can occupy. Local users
  share ``USER_WORKERS`` threads, and one user (one uid) has at most
  ``REQUESTS_PER_USER`` requests in flight; one more is refused at once
  (``RESOURCE_EXHAUSTED``), never queued.
- **Probe reads** (``Flight``, and ``Heartbeats`` of ranks whose record is out of sight)
  run on their own threads: ``OPERATOR_PROBE_READS`` for the operator,
  ``USER_PROBE_READS`` shared by local users with ``PROBE_READS_PER_USER`` for one uid.
  Each read is bounded by its deadline, and each answer costs its reader at most the probe
  client's ``PEAK_ANSWER_BYTES`` (measured with hostile answers), so answers being read at
  once take at most ``(OPERATOR_PROBE_READS + USER_PROBE_READS) × PEAK_ANSWER_BYTES``
  (``answer_memory_bound``).
- **Connections**: gRPC closes a connection that sends no HTTP/2 preface within
  ``HANDSHAKE_TIMEOUT_MS``, one without a call for ``IDLE_MS``, any after ``AGE_MS`` (calls
  in flight get ``AGE_GRACE_MS``), and accepts at most ``max_connections(limit)`` at once
  (half the descriptor limit: the rest stay free for the work itself); past that it
  closes new ones at once. gRPC has no per-peer cap (grpc/grpc#12737): that belongs to the
  firewall (docs/security.md).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from ..capture.read import probe_client
from ..errors import HangdocError
from .callers import Caller
from .node import ProbeReads, Quota

log = logging.getLogger("hangdoc.agent")
T = TypeVar("T")

# A diagnosis sends a node one call at a time per step (FindRanks, Sample, Sources, Flight,
# Devices); `watch` adds a Heartbeats poll; two operators at once: 8 threads, never shared.
OPERATOR_WORKERS = 8
# Local users share these; one uid has at most 2 requests in flight (its FindRanks and a
# Sample, or a diagnosis and a watch): four users at once before anyone waits.
USER_WORKERS = 8
REQUESTS_PER_USER = 2
# A probe answers in milliseconds (a rank blocked in a collective has released the GIL):
# 8 at once read a 128-rank node in 16 short rounds, and 8 ranks that hold the GIL cost one
# timeout. Answers held at once stay under the unit's MemoryMax=1G: (8 + 4) x 64 MiB.
OPERATOR_PROBE_READS = 8
# A local user's job is a few ranks; 2 reads at once for one uid, 4 for all of them.
USER_PROBE_READS = 4
PROBE_READS_PER_USER = 2

HANDSHAKE_TIMEOUT_MS = 5_000  # a real client sends its preface at once (TLS: a few round trips)
IDLE_MS = 60_000  # a connection without a call for a minute: the client reconnects when it needs to
AGE_MS = 10 * 60_000
AGE_GRACE_MS = 75_000  # the longest call: Devices, 60 s of timeout + 10 s of listening, and margin
MAX_CONNECTIONS = 1024  # of 65,536 descriptors (the unit's LimitNOFILE): every client a node needs, many times
MAX_STREAMS = 32  # calls at once on one connection; a coordinator sends a node a few
MAX_CALLS = 256  # calls at once in all (past it: RESOURCE_EXHAUSTED), each a coroutine on the loop
STOP_GRACE_S = 2.0
NO_THREAD_HELP = (
    "The agent's node could not start a thread (its task limit: kernel.pid_max, the agent's "
    "ulimit -u, or its unit's TasksMax, shared with everything else on the node). Raise the "
    "limit or stop what holds the tasks; the call may be retried."
)  # calls in flight when the agent is told to stop get this long


def max_connections(fd_limit: int) -> int:
    """Connections accepted at once under a soft descriptor limit of ``fd_limit``: at most
    half of it, so the work (py-spy's pipes, /proc, probe sockets) always has descriptors."""
    return max(16, min(MAX_CONNECTIONS, fd_limit // 2))


def server_options(fd_limit: int) -> list[tuple[str, int]]:
    """gRPC core's server options (all in grpcio's core since 1.5x; checked in its library)."""
    return [
        ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
        ("grpc.max_connection_idle_ms", IDLE_MS),
        ("grpc.max_connection_age_ms", AGE_MS),
        ("grpc.max_connection_age_grace_ms", AGE_GRACE_MS),
        ("grpc.max_allowed_incoming_connections", max_connections(fd_limit)),
        ("grpc.max_concurrent_streams", MAX_STREAMS),
    ]


def raise_fd_limit() -> int:
    """Raise this process's soft descriptor limit to its hard limit (a systemd service
    starts at 1,024 whatever its LimitNOFILE); the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and hard != resource.RLIM_INFINITY:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError) as exc:
            log.warning("cannot raise the descriptor limit from %d to %d: %s", soft, hard, exc)
            return soft
        log.info("descriptor limit raised from %d to %d", soft, hard)
        return hard
    return soft


def fd_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_CONNECTIONS * 2 if soft == resource.RLIM_INFINITY else soft


def answer_memory_bound() -> int:
    """Bytes of probe answers the agent holds at once, at most."""
    return (OPERATOR_PROBE_READS + USER_PROBE_READS) * probe_client.PEAK_ANSWER_BYTES


class OverQuota(Exception):
    """A local user already has ``REQUESTS_PER_USER`` requests in flight."""


@dataclass(frozen=True)
class Lane:
    """Where one request of one caller runs: its threads, its probe reads, its quota key."""

    pool: ThreadPoolExecutor
    probes: ProbeReads
    who: Hashable
    quota: Quota | None


class Lanes:
    """The agent's threads, split so that no caller can take another's (module docstring)."""

    def __init__(self) -> None:
        self.operator = Lane(
            ThreadPoolExecutor(OPERATOR_WORKERS, "hangdoc-op"),
            ProbeReads(OPERATOR_PROBE_READS, None, "hangdoc-op-probe"),
            "operator",
            None,
        )
        self._user_pool = ThreadPoolExecutor(USER_WORKERS, "hangdoc-user")
        self._user_probes = ProbeReads(USER_PROBE_READS, PROBE_READS_PER_USER, "hangdoc-user-probe")
        self._user_quota = Quota(REQUESTS_PER_USER)
        self._running = 0
        self._lock = threading.Lock()

    def lane(self, caller: Caller) -> Lane:
        if caller.reads_all:
            return self.operator
        # a caller the agent cannot name shares one key: it reads nothing anyway
        who = caller.uid if caller.uid is not None else "unknown"
        return Lane(self._user_pool, self._user_probes, who, self._user_quota)

    async def run(self, lane: Lane, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on ``lane``'s threads; raises ``OverQuota`` at once when its caller
        already has all its requests in flight. The quota is given back when the work
        ends (or, still queued, is cancelled), not when the call does: a caller that
        cancels its calls cannot pile up threads."""
        if lane.quota is not None and not lane.quota.try_take(lane.who):
            raise OverQuota(
                f"{REQUESTS_PER_USER} requests of this user are already in flight on this agent, "
                "the most one user may have; retry when one has ended"
            )
        try:
            future = lane.pool.submit(self._counted, fn, *args)
        except BaseException as exc:
            if lane.quota is not None:
                lane.quota.give(lane.who)
            if isinstance(exc, RuntimeError):  # no thread to be had (or the pool shut down)
                raise HangdocError(f"this agent could not start the call's work: {exc}", help=NO_THREAD_HELP) from None
            raise
        if lane.quota is not None:
            quota, who = lane.quota, lane.who
            future.add_done_callback(lambda _: quota.give(who))
        return await asyncio.wrap_future(future)

    def _counted(self, fn: Callable[..., T], *args: object) -> T:
        with self._lock:
            self._running += 1
        try:
            return fn(*args)
        finally:
            with self._lock:
                self._running -= 1

    @property
    def running(self) -> int:
        """Requests whose work is running in a thread now."""
        with self._lock:
            return self._running

    def shutdown(self) -> int:
        """Start no more work; what runs ends by its own deadlines, unwaited. Returns how
        many requests were still running."""
        for pool in (self.operator.pool, self._user_pool):
            pool.shutdown(wait=False, cancel_futures=True)
        self.operator.probes.shutdown()
        self._user_probes.shutdown()
        return self.running


__all__ = [
    "Lane",
    "Lanes",
    "OverQuota",
    "answer_memory_bound",
    "fd_limit",
    "max_connections",
    "raise_fd_limit",
    "server_options",
]
