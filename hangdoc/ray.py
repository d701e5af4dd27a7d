"""Diagnose or watch a Ray job (``ray:JOB``): its workers found on the cluster, agents placed by Ray.

``fleet_source`` is what ``diagnose`` and ``watch`` use for a ``ray:`` job. For as long as
its block runs (one diagnosis, or a whole watch) it reads the job's training workers and
their world ranks from the cluster (``capture.find.ray_job``), connects as a Ray driver, starts
one hangdoc agent actor on each Ray node that holds a worker (``fleet.ray_agents``: pinned
to its node, zero CPUs, a token made for this block), asks each agent for the job's
processes on its node, and hands over the fleet: the selected workers, numbered by Ray
Train, each reached through its node's agent. On the way out the agents are removed
(unless ``keep_agents``) and the driver disconnects.

From Python::

    import hangdoc.ray
    diagnosis = hangdoc.ray.diagnose("raysubmit_abc123", address="auto")
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .capture.find.discover import Discovery
from .capture.find.jobspec import JobSpec, parse_job_spec
from .capture.find.ray_job import find_ray_job
from .capture.find.ray_workers import RayJob, RayWorker
from .errors import RayNotInstalled, RayUnreachable, UsageError, one_line
from .fleet.client import AgentAuth, RemoteNode
from .fleet.coordinator import Fleet, fan_out
from .fleet.ray_agents import ray_agents
from .model import Diagnosis, JobSnapshot, Note, RankProcess, Unreachable, counted
from .pipeline import CaptureOptions, FleetFinder, FleetSource, Message
from .pipeline import diagnose as diagnose_job

FIND_TIMEOUT = 30.0  # seconds for every agent to list the job's processes on its node


@dataclass(frozen=True)
class RayOptions:
    """How to reach the cluster and what to diagnose in it."""

    address: str | None = None  # --ray-address; None: RAY_ADDRESS, else auto
    workers: tuple[str, ...] = ()  # --workers patterns; (): the training workers
    keep_agents: bool = False  # --keep-agents


def fleet_source(options: RayOptions) -> FleetSource:
    """The fleet source for ``ray:`` jobs: agents placed for as long as its block runs (a
    diagnosis, or a whole watch)."""
    return lambda _say: _Session(options)


class _Session:
    """The cluster as one diagnosis or one watch uses it. Its finder reads the job's workers
    again each time and places an agent on every node that holds one and has none yet
    (Ray Train may restart its workers elsewhere). Leaving the block removes the agents
    (unless ``keep_agents``) and then disconnects. The driver connects only when a first
    agent is needed: a job id that names nothing is told without it."""

    def __init__(self, options: RayOptions) -> None:
        self.options = options
        self.token = secrets.token_hex(32)  # made for this session: every call to its agents carries it
        self.auth = AgentAuth(self.token)
        self.nodes: dict[str, _RayNode] = {}
        self.failed: dict[str, str] = {}  # node id -> why it has no agent; not tried again
        self.stack = contextlib.ExitStack()
        self.connected = False

    def __enter__(self) -> FleetFinder:
        return self.find

    def __exit__(self, *exc: object) -> None:
        self.stack.close()  # agents first, then the driver

    def find(self, job: JobSpec, say: Message) -> Fleet:
        assert job.ray_job is not None
        found = find_ray_job(job.ray_job, address=self.options.address, patterns=self.options.workers)
        say(
            f"Ray job {found.job_id}: {counted(len(found.workers), 'worker')} on {counted(len(found.node_ids), 'node')}"
        )
        self._place([n for n in found.node_ids if n not in self.nodes and n not in self.failed], say)
        nodes = {n: self.nodes[n] for n in found.node_ids if n in self.nodes}
        failed = {n: self.failed[n] for n in found.node_ids if n in self.failed}
        return _fleet(found, nodes, failed, parse_job_spec(f"ray:{found.job_id}"))

    def _place(self, node_ids: list[str], say: Message) -> None:
        if not node_ids:
            return
        if not self.connected:
            self.stack.enter_context(_driver(self.options.address))
            self.connected = True
        keep = self.options.keep_agents
        agents = self.stack.enter_context(ray_agents(node_ids, token=self.token, keep=keep, partial=True))
        say(
            f"started {counted(len(agents), 'hangdoc agent actor')}"
            + (" (kept after the diagnosis: --keep-agents)" if keep else "")
        )
        self.nodes.update({node_id: _RayNode(node_id, address, self.auth) for node_id, address in agents.items()})
        self.failed.update(agents.failed)


class _RayNode(RemoteNode):
    """An agent placed on a Ray node, named by the node (its id, not its IP: several Ray
    nodes can share one)."""

    def __init__(self, node_id: str, address: str, auth: AgentAuth) -> None:
        super().__init__(address, auth)
        self.node_id = node_id

    @property
    def name(self) -> str:
        return f"ray node {self.node_id[:12]} ({self.address})"


def _fleet(found: RayJob, nodes: dict[str, _RayNode], failed: dict[str, str], spec: JobSpec) -> Fleet:
    """The selected workers, each on the agent of its node; workers on a node whose agent
    did not start, or did not list them, are unreachable with their ranks."""
    answers = fan_out(list(nodes.values()), lambda n: n.find_ranks(spec), FIND_TIMEOUT)
    listed: dict[str, set[int]] = {}
    unreachable = [
        Unreachable(f"ray node {node_id[:12]}", f"no agent: {reason}", _ranks(found.workers, node_id))
        for node_id, reason in failed.items()
    ]
    for asked, answer, error in answers:
        assert isinstance(asked, _RayNode)
        if isinstance(answer, Discovery):
            listed[asked.node_id] = {p.pid for p in answer.ranks}
        else:
            unreachable.append(Unreachable(asked.name, one_line(str(error)), _ranks(found.workers, asked.node_id)))
    placed: list[tuple[RemoteNode, RankProcess]] = []
    notes = [Note(n) for n in found.notes]
    for worker in found.workers:
        agent = nodes.get(worker.node_id)
        if agent is None or worker.node_id not in listed:
            continue
        if worker.pid not in listed[worker.node_id]:
            notes.append(Note(f"worker pid {worker.pid} ({worker.actor_class}) was gone when its node's agent looked"))
            continue
        placed.append((agent, worker.to_rank_process(agent.name)))
    sizes = {w.world_size for w in found.workers if w.world_size}
    return Fleet(tuple(placed), max(sizes) if sizes else None, tuple(notes), tuple(unreachable))


def _ranks(workers: Sequence[RayWorker], node_id: str) -> tuple[int, ...]:
    return tuple(w.world_rank for w in workers if w.node_id == node_id and w.world_rank is not None)


@contextlib.contextmanager
def _driver(address: str | None) -> Iterator[None]:
    """Connected to the cluster as a Ray driver for the block (agents are actors), quietly."""
    try:
        import ray
    except ImportError:
        raise RayNotInstalled("hangdoc needs Ray to diagnose a ray: job", help=RayNotInstalled.help) from None
    if address is not None and address.startswith(("http://", "https://")):
        raise UsageError(
            f"--ray-address {address}: placing agents needs the cluster's GCS "
            "address (HOST:6379), `auto` or ray://HOST:10001, not the dashboard's URL"
        )
    if ray.is_initialized():
        yield  # a caller inside a Ray driver already: its connection serves
        return
    # a driver's error listener prints the cluster's warnings ("(raylet) WARNING: ...") to
    # sys.stdout whatever log_to_driver says: stdout carries the report alone (--json), so
    # they go to stderr; ray.shutdown() joins that thread before stdout is given back
    with contextlib.redirect_stdout(sys.stderr):
        try:
            ray.init(
                address=address or "auto",
                namespace="hangdoc",
                log_to_driver=False,
                logging_level=logging.WARNING,
                configure_logging=False,
            )
        except Exception as exc:  # noqa: BLE001 - Ray raises many kinds; the user gets one line
            raise RayUnreachable(
                one_line(f"cannot connect to the Ray cluster at {address or 'auto'} as a driver: {exc}"),
                help=RayUnreachable.help,
            ) from None
        try:
            yield
        finally:
            ray.shutdown()


def diagnose(
    job: str,
    *,
    address: str | None = None,
    workers: Sequence[str] = (),
    keep_agents: bool = False,
    options: CaptureOptions | None = None,
    progress: Message | None = None,
) -> Diagnosis:
    """Diagnose Ray job ``job`` (hex job id or submission id): the same ``Diagnosis``
    ``hangdoc diagnose ray:JOB`` reports."""
    return capture(job, address=address, workers=workers, keep_agents=keep_agents, options=options, progress=progress)[
        1
    ]


def capture(
    job: str,
    *,
    address: str | None = None,
    workers: Sequence[str] = (),
    keep_agents: bool = False,
    options: CaptureOptions | None = None,
    progress: Message | None = None,
) -> tuple[JobSnapshot, Diagnosis]:
    """``diagnose``, with the snapshot it rests on (save it with ``hangdoc.bundle``)."""
    spec = job if job.startswith("ray:") else f"ray:{job}"
    source = fleet_source(RayOptions(address, tuple(workers), keep_agents))
    return diagnose_job(spec, options or CaptureOptions(), progress, source=source)
