"""The server's HTTP side on a real socket: a ``ThreadingHTTPServer`` on 127.0.0.1:0 in a
thread, a real SQLite ``Store`` holding incidents made from recorded diagnoses (corpus
snapshots analysed and rendered as ``hangdoc diagnose`` does), and a recorded-evidence
double of the service loop for the jobs, the agents and ``diagnose_now``.

Each route's status and JSON shape, the filters, the token (bearer, cookie, ``/?token=``),
the errors (one line of JSON each), the headers, the metrics page, the page's escaping, a
socket that says nothing, and HTTPS with a throwaway CA.
"""

from __future__ import annotations

import gzip
import http.client
import json
import logging
import re
import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support.multinode import make_tls
from support.paths import REPO

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot, snapshot_bytes
from hangdoc.errors import JobNotFound, UsageError
from hangdoc.model import Diagnosis, JobSnapshot, Verdict
from hangdoc.report.html import render_html
from hangdoc.report.json_report import render_json
from hangdoc.service import api, shapes
from hangdoc.service.api import make_http_server
from hangdoc.service.fingerprint import fingerprint
from hangdoc.service.metrics import ServiceMetrics
from hangdoc.service.page import render_index
from hangdoc.service.records import (
    AgentView,
    Incident,
    IncidentState,
    JobState,
    JobView,
    NewIncident,
    NodeJob,
)
from hangdoc.service.store import Store

SNAPSHOTS = REPO / "tests" / "snapshots"
TOKEN = "s3rver-token-0123456789abcdef"
T0 = 1_795_000_000.0  # 2026-11-18T...Z: the first incident's detection
HOSTILE = "<script>alert(1)</script>:29500"
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


@dataclass(frozen=True)
class Recorded:
    """One corpus job, diagnosed and rendered as `hangdoc diagnose --json --html --save` would."""

    snapshot: JobSnapshot
    diagnosis: Diagnosis
    report_json: str
    report_html: str
    bundle: bytes

    def incident(self, job: str, detected_at: float) -> NewIncident:
        d = self.diagnosis
        return NewIncident(
            job=job,
            nodes=tuple(sorted({r.process.host for r in self.snapshot.ranks})),
            verdict=d.verdict.value,
            culprits=d.culprit_ranks,
            confidence=d.confidence.value,
            summary=d.summary,
            fingerprint=fingerprint(d).key,
            detected_at=detected_at,
            diagnosed_at=detected_at + 7,
            report_json=self.report_json,
            report_html=self.report_html,
            bundle=self.bundle,
        )


def record(name: str) -> Recorded:
    snapshot = load_snapshot(SNAPSHOTS / f"{name}.json.gz")
    diagnosis = analyse(snapshot)
    return Recorded(
        snapshot,
        diagnosis,
        render_json(diagnosis, snapshot),
        render_html(diagnosis, snapshot),
        snapshot_bytes(snapshot, compress=True),
    )


@pytest.fixture(scope="module")
def corpus() -> dict[str, Recorded]:
    return {
        "mismatch": record("mismatch_ddp_uneven_epoch_end"),
        "straggler": record("straggler_crop_retry_spin"),
        "not_hung": record("not_hung_fast_steps"),
    }


@dataclass
class RecordedService:
    """The service loop's part, from recorded diagnoses: ``diagnose_now(spec)`` looks the
    spec up in ``specs`` (a corpus entry), stores an incident when it is hung."""

    store: Store
    metrics: ServiceMetrics
    specs: dict[str, Recorded]
    job_views: list[JobView] = field(default_factory=list)
    agent_views: list[AgentView] = field(default_factory=list)
    reports: list[tuple[str, bytes]] = field(default_factory=list)
    is_healthy: bool = True

    def jobs(self) -> list[JobView]:
        return list(self.job_views)

    def agents(self) -> list[AgentView]:
        return list(self.agent_views)

    def diagnose_now(self, job: str) -> tuple[Incident | None, str]:
        if job.startswith("bad"):
            raise UsageError(f"cannot read the job spec {job!r}", help="Give HOST:PORT or pid:PID.")
        found = self.specs.get(job)
        if found is None:
            raise JobNotFound(f"no rank process of {job} found")
        if found.diagnosis.verdict is Verdict.NOT_HUNG:
            return None, found.report_json
        return self.store.add(found.incident(job, time.time())), found.report_json

    def agent_report(self, peer_host: str, body: bytes) -> dict[str, object]:
        try:
            value = json.loads(body)
        except ValueError:
            raise UsageError("the agent's report is not JSON") from None
        self.reports.append((peer_host, body))
        return {"accepted": True, "node": value.get("node")}

    def healthy(self) -> bool:
        return self.is_healthy


def fill(store: Store, corpus: dict[str, Recorded]) -> list[Incident]:
    """Four incidents, oldest first: #1 (ended) and #3 share a fingerprint; #4's job name is
    hostile markup."""
    added = [
        store.add(corpus["mismatch"].incident("10.0.0.1:29500", T0)),
        store.add(corpus["straggler"].incident("pid:32060", T0 + 100)),
        store.add(corpus["mismatch"].incident("10.0.0.3:29500", T0 + 200)),
        store.add(corpus["straggler"].incident(HOSTILE, T0 + 300)),
    ]
    store.set_state(added[0].id, IncidentState.ENDED, T0 + 50)
    return added


def views() -> tuple[list[JobView], list[AgentView]]:
    """The service's jobs and agents as of now (the server judges an agent live by its
    last report's age: a module-wide time would go stale in a long test run)."""
    now = time.time()
    jobs = [
        JobView(
            "10.0.0.3:29500",
            JobState.HUNG,
            4,
            (
                NodeJob("node-a", "10.0.0.3:7420", (0, 1), (101, 102), 420.0, now - 5),
                NodeJob("node-b", "10.0.0.4:7420", (2, 3), (201, 202), 415.5, now - 4),
            ),
            incident=3,
        ),
        JobView(
            "10.0.0.9:29500", JobState.RUNNING, 2, (NodeJob("node-c", "10.0.0.9:7420", (0, 1), (9, 10), 1.0, now),)
        ),
    ]
    agents = [
        AgentView("10.0.0.3:7420", "node-a", True, now - 5),
        AgentView("10.0.0.4:7420", "node-b", False, now - 4),
        AgentView("10.0.0.5:7420", "node-d", False, None, error="connection refused"),
    ]
    return jobs, agents


@dataclass
class Running:
    url: str
    service: RecordedService
    incidents: list[Incident]
    server: ThreadingHTTPServer

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])


@contextmanager
def serving(
    service: RecordedService, token: str | None = TOKEN, tls: tuple[str, str] | None = None
) -> Iterator[ThreadingHTTPServer]:
    server = make_http_server("127.0.0.1:0", service, token, tls)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(str(tmp_path / "incidents.db"))
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def running(store: Store, corpus: dict[str, Recorded]) -> Iterator[Running]:
    incidents = fill(store, corpus)
    jobs, agents = views()
    specs = {"10.0.0.7:29500": corpus["straggler"], "10.0.0.8:29500": corpus["not_hung"]}
    service = RecordedService(store, ServiceMetrics(stale_after=90.0), specs, jobs, agents)
    with serving(service) as server:
        yield Running(f"http://127.0.0.1:{server.server_address[1]}", service, incidents, server)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        assert self.headers["Content-Type"].startswith("application/json"), self.headers["Content-Type"]
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def ask(
    running: Running,
    path: str,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    auth: bool = True,
) -> Answer:
    conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers={**(AUTH if auth else {}), **(headers or {})})
        response = conn.getresponse()
        return Answer(response.status, response.headers, response.read())
    finally:
        conn.close()


def error_line(answer: Answer, status: int) -> str:
    """The one-line error of an answer that must be one."""
    assert answer.status == status, (answer.status, answer.body[:300])
    value = answer.json()
    assert set(value) <= {"error", "help"} and isinstance(value["error"], str)
    assert "\n" not in value["error"] and "Traceback" not in answer.text
    return str(value["error"])


# ------------------------------------------------------------------ the API


def test_incidents_are_listed_newest_first_with_their_history(running: Running) -> None:
    listed = ask(running, "/api/incidents").json()["incidents"]
    assert [i["id"] for i in listed] == [i.id for i in reversed(running.incidents)]
    first, _, third, fourth = running.incidents
    entry = next(i for i in listed if i["id"] == third.id)
    assert set(entry) == {
        "id", "job", "nodes", "verdict", "culprit_ranks", "confidence", "summary", "fingerprint", "state",
        "detected_at", "diagnosed_at", "ended_at", "seen_before", "url",
    }  # fmt: skip
    assert entry["job"] == "10.0.0.3:29500" and entry["verdict"] == "collective_mismatch"
    assert entry["culprit_ranks"] == [1] and entry["nodes"] == ["vm"] and entry["confidence"] == "medium"
    assert entry["seen_before"] == [first.id] and entry["url"] == f"/incidents/{third.id}"
    assert entry["state"] == "hung" and entry["ended_at"] is None
    assert entry["detected_at"] == shapes.iso(T0 + 200) and ISO.fullmatch(entry["detected_at"])
    assert ISO.fullmatch(entry["diagnosed_at"])
    ended = next(i for i in listed if i["id"] == first.id)
    assert ended["state"] == "ended" and ended["ended_at"] == shapes.iso(T0 + 50) and ended["seen_before"] == []
    assert next(i for i in listed if i["id"] == fourth.id)["job"] == HOSTILE


def test_the_filters(running: Running) -> None:
    first, second, third, fourth = running.incidents

    def ids(query: str) -> list[int]:
        return [i["id"] for i in ask(running, f"/api/incidents?{query}").json()["incidents"]]

    assert ids("job=10.0.0.1%3A29500") == [first.id]
    assert ids("verdict=straggler") == [fourth.id, second.id]
    assert ids("verdict=collective_mismatch&limit=1") == [third.id]
    assert ids("limit=2") == [fourth.id, third.id]
    assert ids(f"since={T0 + 150:.0f}") == [fourth.id, third.id]
    assert ids(f"since={shapes.iso(T0 + 150)}") == [fourth.id, third.id]
    offset = str(shapes.iso(T0 + 150)).replace("Z", "%2B00:00")
    assert ids(f"since={offset}") == [fourth.id, third.id]
    assert ids("job=&verdict=") == ids("")  # an empty field, as a form sends it, is no filter
    assert ids("job=nobody") == []


@pytest.mark.parametrize(
    "query",
    ["limit=0", "limit=1001", "limit=ten", "since=yesterday", "since=nan", "verdict=bogus", "color=red", "job=a&job=b"],
)
def test_a_bad_query_is_a_400(running: Running, query: str) -> None:
    assert error_line(ask(running, f"/api/incidents?{query}"), 400)


def test_one_incident_is_its_report_and_what_the_server_knows(running: Running, corpus: dict[str, Recorded]) -> None:
    first, _, third, _ = running.incidents
    value = ask(running, f"/api/incidents/{third.id}").json()
    report = json.loads(corpus["mismatch"].report_json)
    for key in ("verdict", "culprit_ranks", "summary", "confidence", "evidence", "ranks", "spec", "schema_version"):
        assert value[key] == report[key], key
    assert value["id"] == third.id and value["job"] == "10.0.0.3:29500" and value["nodes"] == ["vm"]
    assert value["fingerprint"] == third.fingerprint and value["state"] == "hung" and value["ended_at"] is None
    assert value["detected_at"] == shapes.iso(T0 + 200) and value["diagnosed_at"] == shapes.iso(T0 + 207)
    assert value["seen_before"] == [
        {"id": first.id, "job": "10.0.0.1:29500", "detected_at": shapes.iso(T0), "state": "ended",
         "verdict": "collective_mismatch"}
    ]  # fmt: skip


def test_the_stored_reports_and_snapshot(running: Running, corpus: dict[str, Recorded], tmp_path: Path) -> None:
    first = running.incidents[0]
    page = ask(running, f"/incidents/{first.id}")
    assert page.status == 200 and page.headers["Content-Type"] == "text/html; charset=utf-8"
    assert page.text == corpus["mismatch"].report_html
    assert "script-src 'unsafe-inline'" in page.headers["Content-Security-Policy"]  # the report draws itself
    raw = ask(running, f"/incidents/{first.id}/report.json")
    assert raw.status == 200 and raw.json() == json.loads(corpus["mismatch"].report_json)
    bundle = ask(running, f"/incidents/{first.id}/snapshot.json.gz")
    assert bundle.status == 200 and bundle.headers["Content-Type"] == "application/gzip"
    assert bundle.headers["Content-Disposition"] == f'attachment; filename="hangdoc-incident-{first.id}.json.gz"'
    (tmp_path / "s.json.gz").write_bytes(bundle.body)
    assert load_snapshot(tmp_path / "s.json.gz").spec == corpus["mismatch"].snapshot.spec
    assert gzip.decompress(bundle.body).startswith(b"{")


def test_jobs_and_agents(running: Running) -> None:
    jobs = ask(running, "/api/jobs").json()["jobs"]
    assert [j["job"] for j in jobs] == ["10.0.0.3:29500", "10.0.0.9:29500"]
    hung = jobs[0]
    assert set(hung) == {"job", "state", "world_size", "still_for", "incident", "nodes"}
    assert hung["state"] == "hung" and hung["world_size"] == 4 and hung["still_for"] == 420.0 and hung["incident"] == 3
    node = hung["nodes"][1]
    assert set(node) == {"node", "agent", "ranks", "pids", "still_for", "reported_at"}
    assert node["node"] == "node-b" and node["ranks"] == [2, 3] and node["pids"] == [201, 202]
    assert node["still_for"] == 415.5 and ISO.fullmatch(node["reported_at"])
    agents = ask(running, "/api/agents").json()["agents"]
    assert [(a["address"], a["registered"], a["state"]) for a in agents] == [
        ("10.0.0.3:7420", True, "live"),
        ("10.0.0.4:7420", False, "live"),
        ("10.0.0.5:7420", False, "stale"),
    ]
    assert agents[2]["last_report"] is None and agents[2]["error"] == "connection refused"
    assert ISO.fullmatch(agents[0]["last_report"]) and agents[0]["node"] == "node-a"


def test_diagnose_now(running: Running) -> None:
    hung = ask(running, "/api/diagnose", "POST", body=json.dumps({"job": "10.0.0.7:29500"}).encode())
    assert hung.status == 201
    value = hung.json()
    assert value["verdict"] == "straggler" and value["job"] == "10.0.0.7:29500" and value["culprit_ranks"] == [2]
    assert hung.headers["Location"] == f"/api/incidents/{value['id']}"
    # the same bug as #2 and #4: linked to them
    assert [e["id"] for e in value["seen_before"]] == [running.incidents[3].id, running.incidents[1].id]
    assert ask(running, hung.headers["Location"]).json()["id"] == value["id"]
    assert ask(running, "/api/incidents?limit=1").json()["incidents"][0]["id"] == value["id"]

    calm = ask(running, "/api/diagnose", "POST", body=b'{"job": "10.0.0.8:29500"}')
    assert calm.status == 200
    assert calm.json()["incident"] is None and calm.json()["verdict"] == "not_hung"
    assert calm.json()["report"]["verdict"] == "not_hung" and calm.json()["report"]["spec"] == "127.0.0.1:36999"

    bad = ask(running, "/api/diagnose", "POST", body=b'{"job": "bad spec"}')
    assert "cannot read the job spec" in error_line(bad, 400) and bad.json()["help"] == "Give HOST:PORT or pid:PID."
    assert "no rank process" in error_line(ask(running, "/api/diagnose", "POST", body=b'{"job": "1.2.3.4:5"}'), 404)


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"\xff\xfe",
        b"[1]",
        b"{}",
        b'{"job": 3}',
        b'{"job": ""}',
        ('{"job": "%s"}' % ("x" * 5000)).encode(),
    ],
)
def test_diagnose_refuses_a_bad_body(running: Running, body: bytes) -> None:
    assert error_line(ask(running, "/api/diagnose", "POST", body=body), 400)


def test_an_agent_report(running: Running) -> None:
    answer = ask(running, "/api/agents/report", "POST", body=b'{"node": "node-a", "jobs": []}')
    assert answer.status == 200 and answer.json() == {"accepted": True, "node": "node-a"}
    assert running.service.reports == [("127.0.0.1", b'{"node": "node-a", "jobs": []}')]
    assert "not JSON" in error_line(ask(running, "/api/agents/report", "POST", body=b"garbage"), 400)


def test_metrics(running: Running) -> None:
    running.service.metrics.incident("collective_mismatch")
    running.service.metrics.diagnosed("incident", 3.5)
    running.service.metrics.notified("failed")
    running.service.metrics.agent_reported()
    answer = ask(running, "/metrics")
    assert answer.status == 200 and answer.headers["Content-Type"].startswith("text/plain")
    text = answer.text
    for line in (
        'hangdoc_server_incidents_total{verdict="collective_mismatch"} 1.0',
        'hangdoc_server_incidents_total{verdict="straggler"} 0.0',
        'hangdoc_server_diagnoses_total{outcome="incident"} 1.0',
        'hangdoc_server_diagnoses_total{outcome="not_hung"} 0.0',
        'hangdoc_server_diagnoses_total{outcome="failed"} 0.0',
        'hangdoc_server_notifications_total{outcome="failed"} 1.0',
        'hangdoc_server_notifications_total{outcome="sent"} 0.0',
        "hangdoc_server_agent_reports_total 1.0",
        'hangdoc_server_diagnosis_seconds_bucket{le="5.0"} 1.0',
        'hangdoc_server_diagnosis_seconds_bucket{le="2.0"} 0.0',
        'hangdoc_server_diagnosis_seconds_bucket{le="300.0"} 1.0',
        "hangdoc_server_open_incidents 3.0",
        'hangdoc_server_jobs{state="hung"} 1.0',
        'hangdoc_server_jobs{state="running"} 1.0',
        'hangdoc_server_jobs{state="suspected"} 0.0',
        'hangdoc_server_jobs{state="dismissed"} 0.0',
        'hangdoc_server_agents{state="live"} 2.0',
        'hangdoc_server_agents{state="stale"} 1.0',
    ):
        assert line in text.splitlines(), line
    assert re.search(r'^hangdoc_server_info\{version="[^"]+"\} 1\.0$', text, re.M)
    assert "process_cpu_seconds_total" not in text  # its own registry, not the global one


def test_healthz_needs_no_token(running: Running) -> None:
    ok = ask(running, "/healthz", auth=False)
    assert ok.status == 200 and ok.body == b"ok\n"
    running.service.is_healthy = False
    assert "not healthy" in error_line(ask(running, "/healthz", auth=False), 503)
    assert error_line(ask(running, "/healthz", "POST", body=b""), 405)


# ------------------------------------------------------------------ the token

ROUTES = [
    ("GET", "/", "html"),
    ("GET", "/incidents/1", "html"),
    ("GET", "/incidents/1/snapshot.json.gz", "html"),
    ("GET", "/incidents/1/report.json", "html"),
    ("GET", "/api/incidents", "json"),
    ("GET", "/api/incidents/1", "json"),
    ("GET", "/api/jobs", "json"),
    ("GET", "/api/agents", "json"),
    ("POST", "/api/diagnose", "json"),
    ("POST", "/api/agents/report", "json"),
    ("GET", "/metrics", "json"),
]
WRONG = [
    {},
    {"Authorization": "Bearer wrong-token"},
    {"Authorization": f"Basic {TOKEN}"},
    {"Authorization": f"Bearer {TOKEN}x"},
    {"Cookie": "hangdoc_token=nope"},
    {"Cookie": f"other={TOKEN}"},
]


@pytest.mark.parametrize(("method", "path", "kind"), ROUTES)
def test_every_route_needs_the_token(running: Running, method: str, path: str, kind: str) -> None:
    body = b'{"job": "10.0.0.7:29500"}' if method == "POST" else None
    for headers in WRONG:
        answer = ask(running, path, method, headers=headers, body=body, auth=False)
        assert answer.status == 401, (headers, answer.status)
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
        if kind == "json":
            assert "token" in error_line(answer, 401)
        else:
            assert answer.headers["Content-Type"] == "text/html; charset=utf-8"
            assert "/?token=TOKEN" in answer.text and "Authorization: Bearer TOKEN" in answer.text
    assert running.service.reports == []
    assert len(ask(running, "/api/incidents").json()["incidents"]) == 4  # nothing was diagnosed


@pytest.mark.parametrize(("method", "path", "kind"), ROUTES)
def test_the_bearer_and_the_cookie_both_open_every_route(running: Running, method: str, path: str, kind: str) -> None:
    body = b'{"job": "10.0.0.8:29500"}' if method == "POST" else None
    for headers in (AUTH, {"Cookie": f"hangdoc_token={TOKEN}"}, {"Cookie": f"a=b; hangdoc_token={TOKEN}; c=d"}):
        answer = ask(running, path, method, headers=headers, body=body, auth=False)
        assert answer.status in (200, 201), (headers, answer.status, answer.body[:200])


def test_the_token_in_the_address_becomes_a_cookie(running: Running, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hangdoc.service.api")
    given = ask(running, f"/?token={TOKEN}", auth=False)
    assert given.status == 303 and given.headers["Location"] == "/"
    cookie = given.headers["Set-Cookie"]
    assert cookie == f"hangdoc_token={TOKEN}; HttpOnly; SameSite=Strict; Path=/; Max-Age=43200"  # no Secure: http
    page = ask(running, given.headers["Location"], headers={"Cookie": cookie.split(";")[0]}, auth=False)
    assert page.status == 200 and "Incidents" in page.text
    # other parameters stay; the report pages take the token too
    assert ask(running, f"/?x=1&token={TOKEN}", auth=False).headers["Location"] == "/?x=1"
    assert ask(running, f"/incidents/1?token={TOKEN}", auth=False).headers["Location"] == "/incidents/1"
    wrong = ask(running, "/?token=guess", auth=False)
    assert wrong.status == 401 and "Set-Cookie" not in wrong.headers and "token needed" in wrong.text
    # the token is never logged; the path is, without its query (each line is written once
    # the answer is sent: the last one may come a moment after the client has read it)
    deadline = time.monotonic() + 10
    while not any(r.getMessage().startswith("GET / 401 ") for r in caplog.records):
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
        time.sleep(0.01)
    assert any(r.getMessage().startswith("GET / 303 ") for r in caplog.records)
    assert all(TOKEN not in r.getMessage() and "guess" not in r.getMessage() for r in caplog.records)


def test_without_a_token_everything_is_open(store: Store, corpus: dict[str, Recorded]) -> None:
    fill(store, corpus)
    service = RecordedService(store, ServiceMetrics(90.0), {})
    with serving(service, token=None) as server:
        running = Running(f"http://127.0.0.1:{server.server_address[1]}", service, [], server)
        assert ask(running, "/api/incidents", auth=False).status == 200
        assert ask(running, "/", auth=False).status == 200


# ------------------------------------------------------------------ errors and headers


@pytest.mark.parametrize(
    "path",
    ["/nope", "/api", "/api/incidents/", "/api/incidents/999", "/api/incidents/abc", "/incidents/999",
     "/incidents/99999999999999999999999", "/incidents/999/snapshot.json.gz", "/incidents/999/report.json",
     "/api/incidents/0", "/favicon.ico"],
)  # fmt: skip
def test_unknown_is_a_404(running: Running, path: str) -> None:
    assert error_line(ask(running, path), 404)


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/api/incidents", "GET, HEAD"),
        ("POST", "/api/incidents/1", "GET, HEAD"),
        ("PUT", "/", "GET, HEAD"),
        ("GET", "/api/diagnose", "POST"),
        ("GET", "/api/agents/report", "POST"),
        ("POST", "/metrics", "GET, HEAD"),
    ],
)
def test_a_wrong_method_is_a_405(running: Running, method: str, path: str, allow: str) -> None:
    answer = ask(running, path, method, body=b"{}" if method in ("POST", "PUT") else None)
    assert error_line(answer, 405) and answer.headers["Allow"] == allow


def test_head_answers_without_a_body(running: Running) -> None:
    answer = ask(running, "/api/jobs", "HEAD")
    assert answer.status == 200 and answer.body == b"" and int(answer.headers["Content-Length"]) > 0


def test_a_body_over_a_mib_is_a_413(running: Running) -> None:
    big = json.dumps({"job": "x" * (api.MAX_BODY + 10)}).encode()
    assert "at most 1048576" in error_line(ask(running, "/api/diagnose", "POST", body=big), 413)
    assert error_line(ask(running, "/api/agents/report", "POST", body=big), 413)
    assert running.service.reports == []


def raw_request(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_malformed_requests_are_one_line_errors(running: Running) -> None:
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    chunked = raw_request(
        running.port,
        b"POST /api/diagnose HTTP/1.1\r\nHost: x\r\n" + auth + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    )
    assert chunked.startswith(b"HTTP/1.0 411 ") and b'{"error": "send the body with a Content-Length' in chunked
    no_length = raw_request(running.port, b"POST /api/diagnose HTTP/1.0\r\n" + auth + b"\r\n")
    assert no_length.startswith(b"HTTP/1.0 411 ")
    bad_length = raw_request(running.port, b"POST /api/diagnose HTTP/1.0\r\n" + auth + b"Content-Length: -1\r\n\r\n")
    assert bad_length.startswith(b"HTTP/1.0 400 ")
    crowded = raw_request(running.port, b"GET / HTTP/1.0\r\n" + b"X: y\r\n" * 200 + b"\r\n")
    assert crowded.startswith(b"HTTP/1.0 431 ") and crowded.endswith(b'{"error": "Too many headers"}\n')
    garbage = raw_request(running.port, b"\x16\x03\x01 nonsense\r\n\r\n")  # TLS to the HTTP port
    assert garbage.startswith(b'{"error": "Bad HTTP/0.9 request type') and garbage.count(b"\n") == 1
    unknown = raw_request(running.port, b"BREW /api/jobs HTTP/1.0\r\n" + auth + b"\r\n")
    assert unknown.startswith(b"HTTP/1.0 501 ") and b'{"error": ' in unknown


def test_the_headers_of_every_answer(running: Running) -> None:
    page = ask(running, "/")
    csp = page.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp and "img-src data:" in csp
    for answer in (page, ask(running, "/api/incidents"), ask(running, "/nope"), ask(running, "/", auth=False)):
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
        assert answer.headers["Referrer-Policy"] == "no-referrer"
        assert answer.headers["Cache-Control"] == "no-store"
        assert answer.headers["Server"] == "hangdoc"


def test_a_client_that_says_nothing_is_dropped(running: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api._Handler, "timeout", 0.3)
    with socket.create_connection(("127.0.0.1", running.port), timeout=10) as idle:
        idle.sendall(b"GET /api/jobs HTTP/1.1\r\n")  # ... and never the rest
        assert ask(running, "/api/jobs").status == 200  # meanwhile others are answered
        started = time.monotonic()
        assert idle.recv(100) == b""  # closed by the server
        assert time.monotonic() - started < 5


# ------------------------------------------------------------------ the page


def test_the_page(running: Running) -> None:
    page = ask(running, "/")
    assert page.status == 200 and page.headers["Content-Type"] == "text/html; charset=utf-8"
    text = page.text
    assert "<script" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;:29500" in text  # the hostile job
    assert 'id="open-count"><b>3</b>open incidents' in text
    assert 'id="job-count"><b>2</b>jobs watched' in text and 'id="agent-count"><b>2</b>of 3 agents live' in text
    rows = re.findall(r'<tr id="incident-(\d+)">', text)
    assert [int(r) for r in rows] == [i.id for i in reversed(running.incidents)]
    first, _, third, _ = running.incidents
    assert f'<a href="/incidents/{first.id}" title="the earliest with this fingerprint">seen before ×1</a>' in text
    assert f'href="/incidents/{third.id}">report</a>' in text
    assert f'href="/incidents/{third.id}/snapshot.json.gz">snapshot</a>' in text
    assert 'class="badge hung">hung<' in text and 'class="badge ended">ended<' in text
    assert "connection refused" in text and "node-b" in text and "0-3" in text


def test_the_page_escapes_everything_a_job_names() -> None:
    evil = '<img src=x onerror="alert(1)">'
    incident = Incident(1, evil, (evil,), evil, (1, 2, 3), "low", evil, "f", T0, T0, IncidentState.HUNG)
    job = JobView(evil, JobState.HUNG, 4, (NodeJob(evil, evil, (1,), (2,), 3.0, T0),), incident=1)
    agent = AgentView(evil, evil, True, T0, error=evil)
    text = render_index([incident], {1: [1]}, [job], [agent], T0 + 60)
    assert "<img" not in text and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in text
    assert "1-3" in text and "1 min" not in text and "60 s ago" in text


def test_the_empty_page_says_what_it_means() -> None:
    text = render_index([], {}, [], [], T0)
    assert "no incident yet: the server watches 0 jobs on 0 agents" in text
    assert "no job seen: no agent is known yet" in text and "no agent known yet" in text
    jobs, agents = views()
    text = render_index([], {}, jobs, agents, time.time())
    assert "no incident yet: the server watches 2 jobs on 3 agents" in text


# ------------------------------------------------------------------ HTTPS and start-up


def test_https_with_a_throwaway_ca(store: Store, corpus: dict[str, Recorded], tmp_path: Path) -> None:
    fill(store, corpus)
    tls = make_tls(tmp_path / "tls", ["127.0.0.1"])
    service = RecordedService(store, ServiceMetrics(90.0), {})
    with serving(service, tls=(str(tls.server_cert), str(tls.server_key))) as server:
        port = server.server_address[1]
        context = ssl.create_default_context(cafile=str(tls.ca))
        # a client that connects and never shakes hands holds no one else up
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            request = urllib.request.Request(f"https://127.0.0.1:{port}/api/incidents?limit=2", headers=AUTH)
            with urllib.request.urlopen(request, context=context, timeout=30) as answer:
                assert answer.status == 200
                assert len(json.loads(answer.read())["incidents"]) == 2
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
        try:
            conn.request("GET", f"/?token={TOKEN}")
            response = conn.getresponse()
            response.read()
            assert response.status == 303 and response.headers["Set-Cookie"].endswith("; Secure")
        finally:
            conn.close()
        # plain HTTP on the TLS port: refused, and the server goes on
        with pytest.raises((http.client.HTTPException, OSError)):
            plain = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                plain.request("GET", "/healthz")
                plain.getresponse().read()
            finally:
                plain.close()
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=context, timeout=30) as answer:
            assert answer.read() == b"ok\n"


def test_what_cannot_be_served_is_a_usage_error(store: Store, tmp_path: Path) -> None:
    service = RecordedService(store, ServiceMetrics(90.0), {})
    for address in ("8080", "127.0.0.1:port", "127.0.0.1:70000", ":8080"):
        with pytest.raises(UsageError, match="give HOST:PORT"):
            make_http_server(address, service, TOKEN, None)
    with serving(service) as server:
        with pytest.raises(UsageError, match="cannot serve on") as err:
            make_http_server(f"127.0.0.1:{server.server_address[1]}", service, TOKEN, None)
        assert "free port" in err.value.help
    with pytest.raises(UsageError, match="TLS certificate"):
        make_http_server("127.0.0.1:0", service, TOKEN, (str(tmp_path / "no.pem"), str(tmp_path / "no.key")))
    with pytest.raises(UsageError, match="token is empty"):
        make_http_server("127.0.0.1:0", service, "", None)


def test_many_clients_at_once(running: Running) -> None:
    paths = ["/", "/api/incidents", "/api/incidents/3", "/incidents/1/snapshot.json.gz", "/metrics"] * 8
    statuses: list[int] = []

    def one(path: str) -> None:
        statuses.append(ask(running, path).status)

    threads = [threading.Thread(target=one, args=(p,)) for p in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert statuses == [200] * len(paths)
