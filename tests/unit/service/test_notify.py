"""The webhook notifier against a real HTTP receiver on loopback: what it posts, what it
retries and how long it waits, that a caller never waits, and that a webhook's secret path
never reaches a log line."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hangdoc.errors import UsageError
from hangdoc.service import notify
from hangdoc.service.notify import Notifier, incident_message
from hangdoc.service.records import Incident, IncidentState

SECRET = "/services/T0SECRET/B0SECRET/xoxbSECRET"
HANG = "hang"  # an answer: read the request, then answer nothing until released (then 200)


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


class Receiver(ThreadingHTTPServer):
    """Answers each POST with the next of ``answers`` (a status, or (status, headers), or
    ``HANG``), then 200; records every request."""

    daemon_threads = False  # server_close waits for its handlers: no socket outlives a test

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answers: deque[int | tuple[int, dict[str, str]] | str] = deque()
        self.got: list[Received] = []
        self.lock = threading.Lock()
        self.released = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{SECRET}"

    def count(self) -> int:
        with self.lock:
            return len(self.got)


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.server.lock:
            self.server.got.append(Received(self.path, dict(self.headers.items()), body, time.monotonic()))
            answer = self.server.answers.popleft() if self.server.answers else 200
        if answer == HANG:
            self.server.released.wait(10)
            answer = 200
        status, headers = answer if isinstance(answer, tuple) else (answer, {})
        assert isinstance(status, int)
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
        except OSError:
            pass  # the client gave up waiting

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.released.set()
    server.shutdown()
    server.server_close()
    thread.join(5)


@dataclass
class Made:
    notifiers: list[Notifier] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)


@pytest.fixture
def made(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> Iterator[Made]:
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    kept = Made()
    yield kept
    receiver.released.set()  # a post still waiting for an answer gets it now
    for n in kept.notifiers:
        n.close(5)


@pytest.fixture
def make(receiver: Receiver, made: Made) -> Callable[..., Notifier]:
    def new(url: str | None = None, **options: float) -> Notifier:
        options.setdefault("first_delay", 0.01)
        n = Notifier(url or receiver.url, on_result=made.outcomes.append, **options)  # type: ignore[arg-type]
        made.notifiers.append(n)
        return n

    return new


def _until(ready: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.005)


def _sent_at_once(n: Notifier, payload: dict[str, object]) -> bool:
    t0 = time.monotonic()
    queued = n.send(payload)
    assert time.monotonic() - t0 < 0.05
    return queued


# -- delivery and retries -------------------------------------------------------------------


def test_the_message_arrives_as_json(receiver: Receiver, make: Callable[..., Notifier], made: Made) -> None:
    n = make()
    message = incident_message(_incident(), [], "https://hangdoc.example/incidents/7")
    assert _sent_at_once(n, message)
    _until(lambda: n.sent == 1)
    (got,) = receiver.got
    assert got.path == SECRET
    assert got.headers["Content-Type"] == "application/json"
    assert json.loads(got.body) == message
    assert (n.sent, n.failed, made.outcomes) == (1, 0, ["sent"])


def test_a_server_error_is_retried_with_growing_waits(receiver: Receiver, make: Callable[..., Notifier]) -> None:
    receiver.answers.extend([500, 503])
    n = make(first_delay=0.05)
    assert n.send({"text": "x"})
    _until(lambda: n.sent == 1)
    first, second, third = (r.at for r in receiver.got)
    assert second - first >= 0.045 and third - second >= 0.095  # first_delay, then twice that
    assert n.failed == 0


@pytest.mark.parametrize("answer", [400, 404, (302, {"Location": "http://127.0.0.1:9/elsewhere"})])
def test_a_client_error_or_a_redirect_is_not_retried(
    receiver: Receiver, make: Callable[..., Notifier], made: Made, answer: int | tuple[int, dict[str, str]]
) -> None:
    receiver.answers.append(answer)
    n = make()
    assert n.send({"text": "x"})
    _until(lambda: n.failed == 1)
    time.sleep(0.1)
    assert receiver.count() == 1 and made.outcomes == ["failed"]


def test_tries_end_after_attempts(receiver: Receiver, make: Callable[..., Notifier]) -> None:
    receiver.answers.extend([502] * 10)
    n = make(attempts=3)
    n.send({"text": "x"})
    _until(lambda: n.failed == 1)
    assert receiver.count() == 3 and n.sent == 0


def test_a_receiver_that_never_answers_does_not_hold_the_caller(
    receiver: Receiver, make: Callable[..., Notifier]
) -> None:
    receiver.answers.extend([HANG, HANG])
    n = make(timeout=0.3, attempts=2)
    t0 = time.monotonic()
    assert _sent_at_once(n, {"text": "x"})
    _until(lambda: n.failed == 1, timeout=3)
    assert 0.6 <= time.monotonic() - t0 < 2.0  # two tries of 0.3 s each, then given up
    assert receiver.count() == 2


def test_a_full_queue_drops_the_message_at_once(
    receiver: Receiver, make: Callable[..., Notifier], caplog: pytest.LogCaptureFixture
) -> None:
    receiver.answers.append(HANG)
    n = make(timeout=5, max_queue=2)
    assert n.send({"n": 0})
    _until(lambda: receiver.count() == 1)  # the thread is busy posting the first
    assert _sent_at_once(n, {"n": 1}) and _sent_at_once(n, {"n": 2})
    with caplog.at_level(logging.WARNING, logger="hangdoc.server"):
        assert not _sent_at_once(n, {"n": 3})
    assert any("dropped" in r.getMessage() for r in caplog.records)
    receiver.released.set()
    _until(lambda: n.sent == 3)
    assert [json.loads(r.body)["n"] for r in receiver.got] == [0, 1, 2]


def test_close_posts_what_is_queued_then_counts_the_rest_failed(
    receiver: Receiver, make: Callable[..., Notifier]
) -> None:
    n = make()
    for i in range(3):
        n.send({"n": i})
    n.close(5)
    assert (n.sent, n.failed, receiver.count()) == (3, 0, 3)
    assert not n.send({"n": 9})

    receiver.answers.append(HANG)
    stuck = make(timeout=5)
    stuck.send({"n": 0})
    stuck.send({"n": 1})
    _until(lambda: receiver.count() == 4)
    t0 = time.monotonic()
    stuck.close(0.2)
    assert time.monotonic() - t0 < 1 and stuck.failed == 1  # the queued one; the posted one is under way


def test_retry_after_is_honoured(receiver: Receiver, make: Callable[..., Notifier]) -> None:
    receiver.answers.append((429, {"Retry-After": "0.4"}))
    n = make()
    n.send({"text": "x"})
    _until(lambda: n.sent == 1)
    first, second = (r.at for r in receiver.got)
    assert 0.35 <= second - first < 2


def test_retry_after_is_bounded(
    receiver: Receiver, make: Callable[..., Notifier], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notify, "MAX_DELAY", 0.2)  # 60 s in earnest
    receiver.answers.append((503, {"Retry-After": "3600"}))
    n = make()
    n.send({"text": "x"})
    _until(lambda: n.sent == 1)
    first, second = (r.at for r in receiver.got)
    assert 0.15 <= second - first < 1.5


def test_a_failing_result_callback_does_not_stop_the_thread(receiver: Receiver, made: Made) -> None:
    def broken(outcome: str) -> None:
        raise RuntimeError("metrics gone")

    n = Notifier(receiver.url, on_result=broken)
    made.notifiers.append(n)
    n.send({"n": 0})
    n.send({"n": 1})
    _until(lambda: n.sent == 2)


# -- the URL and its secret -------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "ftp://hooks.example/services/T0SECRET",
        "file:///services/T0SECRET",
        "hooks.example/services/T0SECRET",
        "http:///services/T0SECRET",
        "https://hooks.example:port/services/T0SECRET",
        "https://hooks.example/services/T0SECRET\n",
    ],
)
def test_only_http_urls_are_taken_and_the_error_never_quotes_them(url: str) -> None:
    with pytest.raises(UsageError) as raised:
        Notifier(url)
    assert "T0SECRET" not in str(raised.value) and raised.value.help


def test_the_target_is_scheme_and_host_only() -> None:
    n = Notifier("https://user:pw@hooks.example:8443/services/T0SECRET?token=x")
    try:
        assert n.target == "https://hooks.example:8443"
    finally:
        n.close(1)


def test_no_log_line_holds_the_url_path(
    receiver: Receiver, make: Callable[..., Notifier], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="hangdoc.server")
    with socket.socket() as s:  # a port nobody listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{s.getsockname()[1]}{SECRET}"
    receiver.answers.extend([500, 400, HANG, HANG])
    posting = make(attempts=2, max_queue=1, timeout=0.2)
    posting.send({"n": 0})  # 500, then 400: refused, not retried
    _until(lambda: posting.failed == 1)
    posting.send({"n": 1})  # no answer: timed out, then given up
    _until(lambda: receiver.count() == 3)
    posting.send({"n": 2})
    posting.send({"n": 3})  # the queue is full
    lost = make(refused, attempts=2)
    lost.send({"n": 0})
    _until(lambda: lost.failed == 1 and posting.failed >= 2)
    posting.close(0.01)
    posting.send({"n": 4})  # closed
    said = [r.getMessage() for r in caplog.records]
    assert len(said) >= 6 and any("http://127.0.0.1:" in line for line in said)
    assert not [line for line in said if "SECRET" in line or "/services" in line]


# -- the message --------------------------------------------------------------------------------

DAY = 1_795_132_800.0  # 2026-11-20T00:00:00Z


def _incident(**changes: object) -> Incident:
    fields: dict[str, object] = {
        "id": 31,
        "job": "slurm:4711.0",
        "nodes": ("node1", "node2"),
        "verdict": "collective_mismatch",
        "culprits": (3,),
        "confidence": "high",
        "summary": "rank 3 waits in barrier (ckpt.py:40)\nwhile ranks 0-2 are in all_reduce (train.py:88)",
        "fingerprint": "0123456789abcdef",
        "detected_at": DAY + 8 * 86400 + 3600,
        "diagnosed_at": DAY + 8 * 86400 + 3630,
        "state": IncidentState.HUNG,
    }
    fields.update(changes)
    return Incident(**fields)  # type: ignore[arg-type]


def test_the_message_says_the_incident_in_one_line_and_as_values() -> None:
    earlier = _incident(id=12, job="slurm:4600.0", detected_at=DAY + 600, state=IncidentState.RESUMED)
    message = incident_message(_incident(), [earlier], "https://hangdoc.example/incidents/31")
    text = message["text"]
    assert "\n" not in text
    for said in ("collective_mismatch", "slurm:4711.0", "rank 3", "waits in barrier (ckpt.py:40) while ranks 0-2"):
        assert said in text
    assert text.endswith("seen before: #12 (job slurm:4600.0, 2026-11-20, resumed)")
    (section,) = message["blocks"]
    assert section["text"] == {"type": "mrkdwn", "text": text}
    assert section["accessory"]["url"] == "https://hangdoc.example/incidents/31"
    assert message["hangdoc"] == {
        "id": 31,
        "job": "slurm:4711.0",
        "verdict": "collective_mismatch",
        "culprits": [3],
        "confidence": "high",
        "summary": _incident().summary,
        "state": "hung",
        "detected_at": "2026-11-28T01:00:00Z",
        "link": "https://hangdoc.example/incidents/31",
        "fingerprint": "0123456789abcdef",
        "seen_before": [{"id": 12, "job": "slurm:4600.0", "detected_at": "2026-11-20T00:10:00Z", "state": "resumed"}],
    }
    json.dumps(message)


def test_the_message_without_a_link_or_culprits_or_history() -> None:
    message = incident_message(_incident(culprits=(), verdict="nccl_timeout"), [], None)
    assert "accessory" not in message["blocks"][0]
    assert "no culprit named" in message["text"] and "seen before" not in message["text"]
    assert message["hangdoc"]["link"] is None and message["hangdoc"]["seen_before"] == []


def test_mrkdwn_control_characters_are_escaped() -> None:
    message = incident_message(
        _incident(job="a&b<!channel>", summary="x <https://evil.example|click> & y"), [], "https://h.example/i/31"
    )
    text = message["text"]
    assert "<" not in text and ">" not in text and "&b" not in text
    assert "a&amp;b&lt;!channel&gt;" in text and "&lt;https://evil.example|click&gt; &amp; y" in text
    assert message["hangdoc"]["job"] == "a&b<!channel>"  # the values are the values


def test_a_long_summary_and_history_are_cut_in_the_text_only() -> None:
    earlier = [_incident(id=i, detected_at=DAY) for i in range(1, 8)]
    message = incident_message(_incident(summary="word " * 500), earlier, None)
    assert len(message["text"]) < 1000
    assert "#3 (" in message["text"] and "#4 (" not in message["text"] and "and 4 more" in message["text"]
    assert len(message["hangdoc"]["seen_before"]) == 7
