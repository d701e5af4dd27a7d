"""What the service keeps and shows, as frozen values: incidents, and the jobs it watches.

Times are seconds since the epoch (UTC); the API writes them as ISO 8601.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class IncidentState(StrEnum):
    """How an incident stands: the job is still hung, moved again, or its ranks are gone."""

    HUNG = "hung"
    RESUMED = "resumed"
    ENDED = "ended"


@dataclass(frozen=True, slots=True)
class NewIncident:
    """A diagnosed hang, before the store gives it an id."""

    job: str  # the job spec the diagnosis ran on (HOST:PORT, slurm:JOB.STEP, ...)
    nodes: tuple[str, ...]  # the nodes that hold the job's ranks
    verdict: str
    culprits: tuple[int, ...]
    confidence: str
    summary: str
    fingerprint: str
    detected_at: float  # when the first node said the job was still
    diagnosed_at: float
    report_json: str  # the JSON report, as `hangdoc diagnose --json` prints it
    report_html: str  # the HTML report, as --html writes it
    bundle: bytes  # the snapshot, as --save writes it (gzip)


@dataclass(frozen=True, slots=True)
class Incident:
    """A stored incident, without its (large) reports."""

    id: int
    job: str
    nodes: tuple[str, ...]
    verdict: str
    culprits: tuple[int, ...]
    confidence: str
    summary: str
    fingerprint: str
    detected_at: float
    diagnosed_at: float
    state: IncidentState
    ended_at: float | None = None  # when it resumed or ended


class JobState(StrEnum):
    """How the service sees a job now."""

    RUNNING = "running"  # its ranks moved within the stall timeout
    SUSPECTED = "suspected"  # a rank has been still for the stall timeout: being diagnosed
    HUNG = "hung"  # diagnosed as hung: its incident is open
    DISMISSED = "dismissed"  # diagnosed as progressing: not looked at again for a timeout


@dataclass(frozen=True, slots=True)
class NodeJob:
    """One node's part of a job, as its agent last told it."""

    node: str  # the node's name
    agent: str  # the agent's address
    ranks: tuple[int, ...]  # rank numbers seen there (unknown ranks left out)
    pids: tuple[int, ...]
    still_for: float  # seconds the longest-still rank there has shown the same stack
    reported_at: float


@dataclass(frozen=True, slots=True)
class JobView:
    """A job the service watches, across its nodes."""

    job: str
    state: JobState
    world_size: int | None
    nodes: tuple[NodeJob, ...]
    incident: int | None = None  # the open incident's id, while hung

    @property
    def still_for(self) -> float:
        return max((n.still_for for n in self.nodes), default=0.0)


@dataclass(frozen=True, slots=True)
class AgentView:
    """An agent the service knows: registered (it reports by itself) or listed (polled)."""

    address: str
    node: str
    registered: bool  # True: it reports to the server; False: the server polls it
    last_report: float | None  # None: never answered
    error: str | None = None  # why the last poll failed
