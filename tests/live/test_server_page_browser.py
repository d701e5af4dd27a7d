"""The server's page in a real headless Chromium (``support.browser``): the token given once
in the address becomes a cookie and leaves the address, the incidents table shows the
verdict and the job, the report link opens the stored HTML report (which draws itself),
no console error anywhere; without the token the page says how to give it.

CI installs chromium (``.ci/run``); elsewhere these tests are skipped when it is absent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.browser import Browser, find_chromium
from support.paths import REPO

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot, snapshot_bytes
from hangdoc.report.html import render_html
from hangdoc.report.json_report import render_json
from hangdoc.service.api import make_http_server
from hangdoc.service.fingerprint import fingerprint
from hangdoc.service.metrics import ServiceMetrics
from hangdoc.service.records import AgentView, Incident, JobState, JobView, NewIncident, NodeJob
from hangdoc.service.store import Store

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="needs Debian's chromium for the headless browser tests (apt-get install chromium; CI installs it)",
)

TOKEN = "browser-token-0123456789abcdef"
CORPUS = REPO / "tests" / "snapshots" / "mismatch_ddp_uneven_epoch_end.json.gz"
JOB = "10.0.0.1:29500"


@dataclass
class Recorded:
    """The service loop's part, as the page reads it: one hung job on two agents."""

    store: Store
    metrics: ServiceMetrics = field(default_factory=lambda: ServiceMetrics(90.0))

    def jobs(self) -> list[JobView]:
        now = time.time()
        return [
            JobView(JOB, JobState.HUNG, 4, (NodeJob("vm", "10.0.0.1:7420", (0, 1, 2, 3), (1, 2, 3, 4), 300.0, now),))
        ]

    def agents(self) -> list[AgentView]:
        return [AgentView("10.0.0.1:7420", "vm", True, time.time())]

    def diagnose_now(self, job: str) -> tuple[Incident | None, str]:
        raise AssertionError("the page never diagnoses")

    def agent_report(self, peer_host: str, body: bytes) -> dict[str, object]:
        raise AssertionError("no agent here")

    def healthy(self) -> bool:
        return True


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with Browser(timeout=60) as b:
        yield b


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    snapshot = load_snapshot(CORPUS)
    diagnosis = analyse(snapshot)
    store = Store.open(str(tmp_path / "incidents.db"))
    store.add(
        NewIncident(
            job=JOB,
            nodes=("vm",),
            verdict=diagnosis.verdict.value,
            culprits=diagnosis.culprit_ranks,
            confidence=diagnosis.confidence.value,
            summary=diagnosis.summary,
            fingerprint=fingerprint(diagnosis).key,
            detected_at=time.time() - 120,
            diagnosed_at=time.time() - 110,
            report_json=render_json(diagnosis, snapshot),
            report_html=render_html(diagnosis, snapshot),
            bundle=snapshot_bytes(snapshot, compress=True),
        )
    )
    http = make_http_server("127.0.0.1:0", Recorded(store), TOKEN, None)
    thread = threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{http.server_address[1]}"
    finally:
        http.shutdown()
        http.server_close()
        thread.join(10)
        store.close()


def _wait(browser: Browser, expression: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not browser.evaluate(expression):
        if time.monotonic() > deadline:
            raise AssertionError(f"never true in the page: {expression}")
        time.sleep(0.02)


def test_the_page_with_the_token_then_a_report(browser: Browser, server: str) -> None:
    browser.call("Network.enable")
    browser.call("Network.clearBrowserCookies")
    browser.open(f"{server}/?token={TOKEN}", ready="document.readyState === 'complete'")
    # redirected to the address without the token, which the page's script cannot read
    assert browser.evaluate("location.href") == f"{server}/"
    assert browser.evaluate("document.cookie") == ""  # HttpOnly
    row = browser.evaluate("document.querySelector('#incidents tbody tr').innerText")
    assert "collective_mismatch" in row and JOB in row and "hung" in row
    assert browser.evaluate("document.getElementById('open-count').innerText").startswith("1")
    # at 1280 pixels the tables fit: the links of the last column are not cut off
    assert browser.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert browser.errors == []

    browser.events.clear()
    browser.evaluate("document.querySelector('#incidents a.report').click()")
    browser.wait_event("Page.loadEventFired")
    _wait(browser, "location.pathname === '/incidents/1' && document.body && document.body.dataset.ready")
    assert browser.evaluate("document.getElementById('verdict').innerText") == "collective_mismatch"
    assert browser.errors == []


def test_without_the_token_the_page_says_how_to_give_it(browser: Browser, server: str) -> None:
    browser.call("Network.enable")
    browser.call("Network.clearBrowserCookies")
    browser.open(f"{server}/", ready="document.readyState === 'complete'")
    text = browser.evaluate("document.body.innerText")
    assert "token needed" in text and "/?token=TOKEN" in text
    assert browser.evaluate("document.getElementById('incidents')") is None
    # a 401 is logged by Chromium as a failed load of the page itself: nothing else went wrong
    assert [e for e in browser.errors if "401" not in e] == []
