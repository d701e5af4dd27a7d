"""The API's JSON objects: an incident as listed and as shown whole, a job, an agent; times
as ISO 8601 in UTC (``iso``), the form every answer and notification writes them in."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from .metrics import agent_live
from .records import AgentView, Incident, JobView


def iso(epoch: float | None) -> str | None:
    """``2026-11-28T12:00:00Z`` for epoch seconds; None for None."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def incident_entry(incident: Incident, seen_before: list[Incident]) -> dict[str, object]:
    """An incident as ``/api/incidents`` lists it."""
    return {
        "id": incident.id,
        "job": incident.job,
        "nodes": list(incident.nodes),
        "verdict": incident.verdict,
        "culprit_ranks": list(incident.culprits),
        "confidence": incident.confidence,
        "summary": incident.summary,
        "fingerprint": incident.fingerprint,
        "state": incident.state.value,
        "detected_at": iso(incident.detected_at),
        "diagnosed_at": iso(incident.diagnosed_at),
        "ended_at": iso(incident.ended_at),
        "seen_before": [e.id for e in seen_before],
        "url": f"/incidents/{incident.id}",
    }


def incident_object(incident: Incident, report_text: str, seen_before: list[Incident]) -> dict[str, object]:
    """An incident as ``/api/incidents/ID`` shows it: its JSON report, and what the server
    knows of it."""
    report = json.loads(report_text)
    if not isinstance(report, dict):
        raise ValueError(f"the stored report of incident {incident.id} is not a JSON object")
    return {
        **report,
        "id": incident.id,
        "job": incident.job,
        "nodes": list(incident.nodes),
        "fingerprint": incident.fingerprint,
        "state": incident.state.value,
        "detected_at": iso(incident.detected_at),
        "diagnosed_at": iso(incident.diagnosed_at),
        "ended_at": iso(incident.ended_at),
        "seen_before": [
            {"id": e.id, "job": e.job, "detected_at": iso(e.detected_at), "state": e.state.value, "verdict": e.verdict}
            for e in seen_before
        ],
        "url": f"/incidents/{incident.id}",
        "snapshot_url": f"/incidents/{incident.id}/snapshot.json.gz",
    }


def job_entry(job: JobView) -> dict[str, object]:
    return {
        "job": job.job,
        "state": job.state.value,
        "world_size": job.world_size,
        "still_for": round(job.still_for, 3),
        "incident": job.incident,
        "nodes": [
            {
                "node": n.node,
                "agent": n.agent,
                "ranks": list(n.ranks),
                "pids": list(n.pids),
                "still_for": round(n.still_for, 3),
                "reported_at": iso(n.reported_at),
            }
            for n in job.nodes
        ],
    }


def agent_entry(agent: AgentView, now: float, stale_after: float) -> dict[str, object]:
    return {
        "address": agent.address,
        "node": agent.node,
        "registered": agent.registered,
        "state": "live" if agent_live(agent, now, stale_after) else "stale",
        "last_report": iso(agent.last_report),
        "error": agent.error,
    }
