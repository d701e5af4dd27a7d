"""The jobs the service watches, as its agents report them, and what is due for each.

Pure bookkeeping over values: every node's last look (``jobwatch.NodeJobs``), merged per job
across nodes; each job's track (running, suspected, hung with its open incident, dismissed
until a time). ``due`` says which jobs to diagnose now and which open incidents have ended;
the service loop (``loop``) does the work.

The rule: a job is suspected when any of its ranks, on any node, has shown the same stack
(and heartbeat) for ``stall_after`` seconds. A hung job's ranks all stay put; a straggler
that computes forever keeps moving while the others wait, so the longest-still rank, not
the least, is the one that tells. A job whose incident is open is not diagnosed again; it
has resumed once no rank has been still that long, and ended once no node reports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from ..fleet.jobwatch import NodeJobs
from .records import AgentView, JobState, JobView, NodeJob


@dataclass(frozen=True, slots=True)
class Report:
    """An agent's last look at its node."""

    agent: str  # the address the service reaches it at
    registered: bool  # it reported by itself (--server); else the service polled it
    node: NodeJobs | None  # None: never answered
    at: float | None  # when (None: never)
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Track:
    state: JobState
    incident: int | None = None
    until: float = 0.0  # DISMISSED: not looked at again before this time
    since: float = 0.0  # when the state began
    nodes: tuple[str, ...] = ()  # HUNG: the nodes that held the job when it was diagnosed


@dataclass(frozen=True, slots=True)
class Due:
    diagnose: tuple[str, ...]  # jobs to diagnose now
    resumed: tuple[tuple[str, int], ...]  # (job, incident) whose ranks moved again
    ended: tuple[tuple[str, int], ...]  # (job, incident) no node reports any more


def job_views(reports: Iterable[Report], tracks: dict[str, Track], fresh_after: float) -> list[JobView]:
    """Each job reported by an agent heard from since ``fresh_after``, across its nodes."""
    parts: dict[str, list[NodeJob]] = {}
    world: dict[str, int | None] = {}
    for report in reports:
        if report.node is None or report.at is None or report.at < fresh_after:
            continue
        for job in report.node.jobs:
            parts.setdefault(job.job, []).append(
                NodeJob(
                    node=report.node.host,
                    agent=report.agent,
                    ranks=tuple(r.rank for r in job.ranks if r.rank is not None),
                    pids=tuple(r.pid for r in job.ranks),
                    still_for=max((r.still_seconds for r in job.ranks), default=0.0),
                    reported_at=report.at,
                )
            )
            world[job.job] = world.get(job.job) or job.world_size
    views = []
    for spec, nodes in sorted(parts.items()):
        track = tracks.get(spec, Track(JobState.RUNNING))
        views.append(JobView(spec, track.state, world[spec], tuple(nodes), track.incident))
    return views


def due(
    views: Iterable[JobView], tracks: dict[str, Track], now: float, stall_after: float, heard: Iterable[str]
) -> Due:
    """What to do now, given the jobs as reported, the tracks as they stand, and the nodes
    heard from lately (``heard``): a hung job has ended only when every node that held it
    has reported since without it (after a restart of the service, or while a node is
    silent, its incident stays open)."""
    heard = set(heard)
    diagnose: list[str] = []
    resumed: list[tuple[str, int]] = []
    seen = set()
    for view in views:
        seen.add(view.job)
        track = tracks.get(view.job, Track(JobState.RUNNING))
        still = view.still_for >= stall_after
        if track.state is JobState.HUNG:
            if not still and track.incident is not None:
                resumed.append((view.job, track.incident))
        elif track.state is JobState.SUSPECTED:
            continue  # a diagnosis is running
        elif track.state is JobState.DISMISSED and now < track.until:
            continue
        elif still:
            diagnose.append(view.job)
    ended = tuple(
        (job, track.incident)
        for job, track in sorted(tracks.items())
        if track.state is JobState.HUNG
        and track.incident is not None
        and job not in seen
        and track.nodes
        and set(track.nodes) <= heard
    )
    return Due(tuple(diagnose), tuple(resumed), ended)


def agent_views(reports: Iterable[Report]) -> list[AgentView]:
    return [
        AgentView(r.agent, r.node.host if r.node is not None else "", r.registered, r.at, r.error)
        for r in sorted(reports, key=lambda r: r.agent)
    ]


def failed(report: Report, error: str) -> Report:
    """A polled agent that did not answer this time: its last look is kept, marked."""
    return dataclasses.replace(report, error=error)
