"""The server's numbers for Prometheus (``GET /metrics``).

Counters and the diagnosis histogram count what the service loop did (it calls
``incident``, ``diagnosed``, ``notified``, ``agent_reported``); the gauges are read from the
view at each scrape (``render(view)``): open incidents, jobs by state, agents live or stale.
Everything lives in the board's own ``CollectorRegistry``, never the library's global one
(which would mix in the process's own metrics and clash with a second server in one
process, as the tests start). Names follow Prometheus' conventions (``hangdoc_server_*``,
``_total`` counters, ``_seconds``, an ``_info`` metric); the page holds numbers and verdict
names only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Literal, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, Info
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from .. import __version__
from ..model import Verdict
from .records import AgentView, JobState, JobView
from .store import Store

PREFIX = "hangdoc_server"
DIAGNOSIS_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
DiagnosisOutcome = Literal["incident", "not_hung", "failed"]
NotificationOutcome = Literal["sent", "failed"]
DIAGNOSIS_OUTCOMES: tuple[DiagnosisOutcome, ...] = ("incident", "not_hung", "failed")
NOTIFICATION_OUTCOMES: tuple[NotificationOutcome, ...] = ("sent", "failed")
AGENT_STATES = ("live", "stale")


class MetricsView(Protocol):
    """What a scrape reads (``api.ServiceView`` is one)."""

    store: Store

    def jobs(self) -> list[JobView]: ...

    def agents(self) -> list[AgentView]: ...


def agent_live(agent: AgentView, now: float, stale_after: float) -> bool:
    """Whether ``agent`` reported (or answered a poll) within ``stale_after`` seconds of
    ``now``; one that never answered is stale."""
    return agent.last_report is not None and now - agent.last_report <= stale_after


class ServiceMetrics:
    """The counters the service loop bumps, and the registry ``render`` writes out.

    ``stale_after``: seconds without a report after which an agent counts as stale (three
    check intervals)."""

    def __init__(self, stale_after: float, clock: Callable[[], float] = time.time) -> None:
        self.stale_after = stale_after
        self.clock = clock
        self.registry = CollectorRegistry(auto_describe=True)
        self._incidents = Counter(
            f"{PREFIX}_incidents", "Incidents stored, by verdict.", ["verdict"], registry=self.registry
        )
        self._diagnoses = Counter(
            f"{PREFIX}_diagnoses",
            "Diagnoses run, by outcome (incident: hung; not_hung: moving; failed: could not run).",
            ["outcome"],
            registry=self.registry,
        )
        self._notifications = Counter(
            f"{PREFIX}_notifications", "Notifications of incidents, by outcome.", ["outcome"], registry=self.registry
        )
        self._agent_reports = Counter(
            f"{PREFIX}_agent_reports", "Reports pushed by registered agents.", registry=self.registry
        )
        self._seconds = Histogram(
            f"{PREFIX}_diagnosis_seconds",
            "Seconds a diagnosis took, from its start to its verdict.",
            buckets=DIAGNOSIS_BUCKETS,
            registry=self.registry,
        )
        Info(PREFIX, "The server: hangdoc's version.", registry=self.registry).info({"version": __version__})
        for verdict in Verdict:  # every series from the first scrape, at 0
            if verdict is not Verdict.NOT_HUNG:
                self._incidents.labels(verdict.value)
        for diagnosis in DIAGNOSIS_OUTCOMES:
            self._diagnoses.labels(diagnosis)
        for notification in NOTIFICATION_OUTCOMES:
            self._notifications.labels(notification)

    def incident(self, verdict: str) -> None:
        self._incidents.labels(verdict).inc()

    def diagnosed(self, outcome: DiagnosisOutcome, seconds: float) -> None:
        if outcome not in DIAGNOSIS_OUTCOMES:
            raise ValueError(f"diagnosis outcome {outcome!r} is none of {DIAGNOSIS_OUTCOMES}")
        self._diagnoses.labels(outcome).inc()
        self._seconds.observe(seconds)

    def notified(self, outcome: NotificationOutcome) -> None:
        if outcome not in NOTIFICATION_OUTCOMES:
            raise ValueError(f"notification outcome {outcome!r} is none of {NOTIFICATION_OUTCOMES}")
        self._notifications.labels(outcome).inc()

    def agent_reported(self) -> None:
        self._agent_reports.inc()

    def render(self, view: MetricsView) -> bytes:
        """The page in Prometheus' text format: the counters, and the gauges read from
        ``view`` now."""
        return generate_latest(_Scrape(self, view))


class _Scrape(Collector):
    """One scrape: the registry's metrics, then the gauges of ``view`` at this moment."""

    def __init__(self, metrics: ServiceMetrics, view: MetricsView) -> None:
        self.metrics, self.view = metrics, view

    def collect(self) -> Iterable[Metric]:
        yield from self.metrics.registry.collect()
        yield from _gauges(self.view, self.metrics.clock(), self.metrics.stale_after)


def _gauges(view: MetricsView, now: float, stale_after: float) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        f"{PREFIX}_open_incidents", "Incidents whose job is still hung.", value=len(view.store.open_incidents())
    )
    jobs = GaugeMetricFamily(f"{PREFIX}_jobs", "Jobs watched, by state.", labels=["state"])
    states = [job.state for job in view.jobs()]
    for state in JobState:
        jobs.add_metric([state.value], states.count(state))
    yield jobs
    agents = GaugeMetricFamily(
        f"{PREFIX}_agents", f"Agents known: live, or stale (no report for {stale_after:g} s).", labels=["state"]
    )
    live = [agent_live(a, now, stale_after) for a in view.agents()]
    agents.add_metric(["live"], live.count(True))
    agents.add_metric(["stale"], live.count(False))
    yield agents
