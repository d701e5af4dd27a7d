"""The service: hears its agents (reports they push, polls of the listed ones), decides what
is due (``watcher``), diagnoses a suspected job across every live agent as
`hangdoc diagnose --agents` does, stores the incident, links it to earlier ones with the same
fingerprint, and tells the webhook. The HTTP side (``api``) reads it through ``ServiceView``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..bundle.writer import snapshot_bytes
from ..errors import HangdocError, UsageError
from ..fleet import jobreport
from ..fleet.client import AgentAuth, RemoteNode
from ..fleet.jobreport import from_json
from ..fleet.jobwatch import NodeJobs
from ..model import Verdict, counted
from ..pipeline import CaptureOptions, diagnose
from ..report.html import render_html
from ..report.json_report import render_json
from .fingerprint import fingerprint
from .metrics import ServiceMetrics
from .notify import Notifier, incident_message
from .records import AgentView, Incident, IncidentState, JobState, JobView, NewIncident
from .store import Store
from .watcher import Report, Track, agent_views, due, failed, job_views

log = logging.getLogger("hangdoc.server")

# An agent not heard from for this many check intervals is stale: its jobs are not shown,
# and it is not asked in a diagnosis.
STALE_INTERVALS = 3
DIAGNOSES_AT_ONCE = 4
LOOKS_TO_END = 2
POLL_TIMEOUT = 60.0  # one look samples every rank of a node once: seconds at most
MAX_JOB_CHARS = jobreport.MAX_NAME  # as an agent's report bounds it: the store indexes the job


@dataclass(frozen=True)
class ServiceConfig:
    stall_after: float = 600.0
    check_interval: float = 30.0
    agents: tuple[str, ...] = ()  # polled; agents started with --server report by themselves
    auth: AgentAuth = AgentAuth()
    capture: CaptureOptions = CaptureOptions()
    public_url: str | None = None  # links in notifications

    @property
    def stale_after(self) -> float:
        return STALE_INTERVALS * self.check_interval


class HangService:
    """What ``hangdoc server`` runs; ``run`` ticks until ``stop``."""

    def __init__(
        self,
        config: ServiceConfig,
        store: Store,
        notifier: Notifier | None = None,
        clock: Callable[[], float] = time.time,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self.config, self.store, self.notifier, self.clock = config, store, notifier, clock
        self.metrics = metrics or ServiceMetrics(config.stale_after)
        self._lock = threading.Lock()
        self._reports: dict[str, Report] = {a: Report(a, False, None, None) for a in config.agents}
        self._tracks: dict[str, Track] = {}
        for incident in store.open_incidents():  # a restart keeps watching what was hung
            self._tracks[incident.job] = Track(
                JobState.HUNG, incident.id, since=incident.detected_at, nodes=incident.nodes
            )
        self._pool = ThreadPoolExecutor(DIAGNOSES_AT_ONCE, thread_name_prefix="hangdoc-diagnose")
        self._polls = ThreadPoolExecutor(16, thread_name_prefix="hangdoc-poll")
        self._stop = threading.Event()
        self._diagnosing: set[futures.Future[None]] = set()
        self._missing: dict[str, int] = {}  # hung jobs missing from their nodes: checks in a row
        self.started = clock()

    # ------------------------------------------------------------ ServiceView

    def jobs(self) -> list[JobView]:
        with self._lock:
            return job_views(self._reports.values(), self._tracks, self.clock() - self.config.stale_after)

    def agents(self) -> list[AgentView]:
        with self._lock:
            return agent_views(self._reports.values())

    def healthy(self) -> bool:
        try:
            self.store.list(limit=1)  # one indexed row: the store answers
        except Exception:  # noqa: BLE001 - any failure of the store is "not healthy"
            return False
        return not self._stop.is_set()

    def agent_report(self, peer_host: str, body: bytes) -> dict[str, object]:
        node, port, advertised = from_json(body)
        host = f"[{peer_host}]" if ":" in peer_host else peer_host
        address = advertised or f"{host}:{port}"
        with self._lock:
            known = address in self._reports
            self._reports[address] = Report(address, True, node, self.clock())
        if not known:
            log.info("agent %s (node %s) registered", address, node.host)
        self.metrics.agent_reported()
        return {"interval": self.config.check_interval}

    def diagnose_now(self, job: str) -> tuple[Incident | None, str]:
        """Diagnose ``job`` now across the live agents (a person asked: not deduplicated)."""
        if len(job) > MAX_JOB_CHARS:
            raise UsageError(f"a job spec of {len(job)} characters; at most {MAX_JOB_CHARS}")
        return self._diagnose(job, self.clock())

    # ------------------------------------------------------------ the loop

    def run(self) -> None:
        log.info(
            "watching: stall after %g s, checks every %g s, %s",
            self.config.stall_after,
            self.config.check_interval,
            counted(len(self.config.agents), "polled agent"),
        )
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the service outlives any one tick
                log.exception("a check failed")
            self._stop.wait(self.config.check_interval)

    def request_stop(self) -> None:
        """Make ``run`` return after the tick in progress (safe from a signal handler)."""
        self._stop.set()

    def stop(self, grace: float = 30.0) -> None:
        """Stop ticking; diagnoses running get ``grace`` seconds to be stored."""
        self._stop.set()
        self._polls.shutdown(wait=False, cancel_futures=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
        futures.wait(self._diagnosing, timeout=grace)

    def tick(self) -> None:
        self._poll()
        now = self.clock()
        fresh = now - self.config.stale_after
        with self._lock:
            views = job_views(self._reports.values(), self._tracks, fresh)
            heard = {r.node.host for r in self._reports.values() if r.node is not None and r.at and r.at >= fresh}
            todo = due(views, self._tracks, now, self.config.stall_after, heard)
            for job in todo.diagnose:
                self._tracks[job] = Track(JobState.SUSPECTED, since=now)
        for job, incident in todo.resumed:
            self._close(job, incident, IncidentState.RESUMED, now)
        # a job ends when it is missing from its nodes' looks twice in a row: one look that
        # missed it (a rank caught between states) does not close an incident
        missing = {job: self._missing.get(job, 0) + 1 for job, _ in todo.ended}
        self._missing = missing
        for job, incident in todo.ended:
            if missing[job] >= LOOKS_TO_END:
                self._close(job, incident, IncidentState.ENDED, now)
        for job in todo.diagnose:
            log.info("%s: a rank has been still for %g s or more: diagnosing", job, self.config.stall_after)
            self._diagnosing = {f for f in self._diagnosing if not f.done()}
            self._diagnosing.add(self._pool.submit(self._suspected, job, now))

    def _poll(self) -> None:
        if not self.config.agents:
            return
        asked = {a: self._polls.submit(self._look, a) for a in self.config.agents}
        for address, future in asked.items():
            try:
                node = future.result(timeout=POLL_TIMEOUT + 10)
            except Exception as exc:  # noqa: BLE001 - one agent's failure is that agent's
                why = str(exc) if isinstance(exc, HangdocError) else f"{type(exc).__name__}: {exc}"
                with self._lock:
                    self._reports[address] = failed(self._reports[address], why)
                continue
            with self._lock:
                self._reports[address] = Report(address, False, node, self.clock())

    def _look(self, address: str) -> NodeJobs:
        node = RemoteNode(address, self.config.auth)
        try:
            return node.jobs(POLL_TIMEOUT)
        finally:
            node.close()

    def _close(self, job: str, incident: int, state: IncidentState, now: float) -> None:
        self.store.set_state(incident, state, now)
        with self._lock:
            self._tracks[job] = Track(JobState.RUNNING, since=now)
        log.info("%s: incident %d %s", job, incident, state.value)

    def _suspected(self, job: str, detected_at: float) -> None:
        try:
            incident, _ = self._diagnose(job, detected_at)
        except Exception as exc:  # noqa: BLE001 - a failed diagnosis is looked at again later
            why = str(exc) if isinstance(exc, HangdocError) else f"{type(exc).__name__}: {exc}"
            log.warning("%s: the diagnosis failed: %s", job, why)
            self._set(job, Track(JobState.DISMISSED, until=self.clock() + self.config.stall_after))
            return
        if incident is None:
            self._set(job, Track(JobState.DISMISSED, until=self.clock() + self.config.stall_after))
        else:
            self._set(job, Track(JobState.HUNG, incident.id, since=incident.detected_at, nodes=incident.nodes))

    def _set(self, job: str, track: Track) -> None:
        with self._lock:
            self._tracks[job] = dataclasses.replace(track, since=track.since or self.clock())

    def _live_agents(self) -> list[str]:
        fresh = self.clock() - self.config.stale_after
        with self._lock:
            return sorted(a for a, r in self._reports.items() if r.at is not None and r.at >= fresh and not r.error)

    def _diagnose(self, job: str, detected_at: float) -> tuple[Incident | None, str]:
        agents = self._live_agents()
        if not agents:
            raise UsageError(
                "no agent has reported to this server lately, so no node can be searched",
                help="Start agents with --server pointing here, or give the server --agents/--hostfile.",
            )
        nodes = [RemoteNode(a, self.config.auth) for a in agents]
        t0 = time.monotonic()
        try:
            snapshot, diagnosis = diagnose(job, self.config.capture, nodes=nodes)
        except Exception:
            self.metrics.diagnosed("failed", time.monotonic() - t0)
            raise
        finally:
            for node in nodes:
                node.close()
        report = render_json(diagnosis, snapshot)
        if diagnosis.verdict is Verdict.NOT_HUNG:
            self.metrics.diagnosed("not_hung", time.monotonic() - t0)
            log.info("%s: not hung (%s)", job, diagnosis.summary)
            return None, report
        self.metrics.diagnosed("incident", time.monotonic() - t0)
        hosts = tuple(sorted({r.process.host for r in snapshot.ranks}))
        incident = self.store.add(
            NewIncident(
                job=job,
                nodes=hosts,
                verdict=diagnosis.verdict.value,
                culprits=tuple(diagnosis.culprit_ranks),
                confidence=diagnosis.confidence.value,
                summary=diagnosis.summary,
                fingerprint=fingerprint(diagnosis).key,
                detected_at=detected_at,
                diagnosed_at=self.clock(),
                report_json=report,
                report_html=render_html(diagnosis, snapshot),
                bundle=snapshot_bytes(snapshot, compress=True),
            )
        )
        self.metrics.incident(incident.verdict)
        earlier = self.store.seen_before(incident)
        log.info(
            "%s: incident %d: %s, culprits %s%s",
            job,
            incident.id,
            incident.verdict,
            list(incident.culprits) or "none",
            f", seen before as {', '.join(f'#{e.id}' for e in earlier)}" if earlier else "",
        )
        if self.notifier is not None:
            link = f"{self.config.public_url.rstrip('/')}/incidents/{incident.id}" if self.config.public_url else None
            self.notifier.send(incident_message(incident, earlier, link))
        return incident, report
