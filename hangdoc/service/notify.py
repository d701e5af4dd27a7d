"""Tell a webhook about new incidents: a Slack-compatible message, posted from one thread.

``Notifier.send`` never waits: it queues the message (or drops it, said in the log, when
the queue is full) and one daemon thread posts each as JSON, retrying what may pass later
(no connection, a timeout, 429, 5xx) with exponential backoff. A webhook's URL may hold its
secret (Slack's path is one): only its scheme and host are ever logged.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from email.message import Message
from http.client import HTTPException
from typing import Any, Literal
from urllib.parse import urlsplit

from .. import __version__
from ..errors import UsageError, described
from ..model import counted
from ..rankranges import rank_phrase
from .records import Incident
from .shapes import iso

log = logging.getLogger("hangdoc.server")

Outcome = Literal["sent", "failed"]
MAX_DELAY = 60.0  # seconds: the longest wait between two tries, Retry-After included
SUMMARY_CHARS = 300  # of the diagnosis' summary in the one-line text
SEEN_SHOWN = 3  # earlier incidents named in the text; the structured field has them all
ANSWER_BYTES = 1 << 16  # of a receiver's answer read: its words are not used
LINE_CHARS = 1000  # of the whole text, before escaping (Slack takes 3000 in a section)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: following it would turn the POST into a GET, or take the
    message to another host."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class Notifier:
    """Posts queued messages to ``url`` from one daemon thread; ``sent`` and ``failed``
    count them, ``on_result`` hears each outcome."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        attempts: int = 5,
        first_delay: float = 1.0,
        max_queue: int = 100,
        on_result: Callable[[Outcome], None] | None = None,
    ) -> None:
        self.target = _checked(url)  # scheme://host[:port]: what logs may say of the URL
        self._url = url
        self._secrets = _secrets(url)
        self._timeout = timeout
        self._attempts = max(1, attempts)
        self._first_delay = first_delay
        self._max_queue = max_queue
        self._on_result = on_result
        self._opener = urllib.request.build_opener(_NoRedirect())
        self._pending: deque[bytes] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._abandon = threading.Event()  # close's time is up: no more tries, no more waits
        self._counts = {"sent": 0, "failed": 0}
        self._thread = threading.Thread(target=self._run, name="hangdoc-notify", daemon=True)
        self._thread.start()

    @property
    def sent(self) -> int:
        with self._cond:
            return self._counts["sent"]

    @property
    def failed(self) -> int:
        with self._cond:
            return self._counts["failed"]

    def send(self, payload: Mapping[str, Any]) -> bool:
        """Queue ``payload`` to be posted; False (and a warning) when the queue is full or the
        notifier closed. Never waits."""
        body = json.dumps(payload, ensure_ascii=False).encode()
        with self._cond:
            if self._closing:
                log.warning("notification to %s dropped: the notifier is closed", self.target)
                return False
            if len(self._pending) >= self._max_queue:
                log.warning("notification to %s dropped: %d are already waiting", self.target, len(self._pending))
                return False
            self._pending.append(body)
            self._cond.notify()
        return True

    def close(self, timeout: float) -> None:
        """Post what can be posted within ``timeout`` seconds, then stop; what is left is
        counted as failed."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._abandon.set()  # a post under way still ends by its own timeout
        with self._cond:
            left = len(self._pending)
            self._pending.clear()
        if left:
            log.warning("%s to %s not sent: the server is stopping", counted(left, "notification"), self.target)
            for _ in range(left):
                self._result("failed")

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending or self._abandon.is_set():
                    return
                body = self._pending.popleft()
            self._result("sent" if self._deliver(body) else "failed")

    def _result(self, outcome: Outcome) -> None:
        with self._cond:
            self._counts[outcome] += 1
        if self._on_result is not None:
            try:
                self._on_result(outcome)
            except Exception as err:  # a metrics callback must not end the thread
                log.warning("notification result callback failed: %s", described(err))

    def _deliver(self, body: bytes) -> bool:
        delay = self._first_delay
        reason = ""
        for attempt in range(1, self._attempts + 1):
            if self._abandon.is_set():
                reason = "the server is stopping"
                break
            retry_after: float | None = None
            try:
                self._post(body)
                return True
            except urllib.error.HTTPError as err:
                err.close()
                reason = f"HTTP {err.code}"
                if err.code != 429 and err.code < 500:
                    log.warning("notification to %s refused (%s): not retried", self.target, reason)
                    return False
                retry_after = _retry_after(err.headers)
            except (urllib.error.URLError, HTTPException, OSError) as err:
                reason = self._scrubbed(str(getattr(err, "reason", None) or err) or type(err).__name__)
            if attempt == self._attempts:
                break
            wait = min(retry_after if retry_after is not None else delay, MAX_DELAY)
            delay *= 2
            log.info("notification to %s failed (%s): try %d in %.1f s", self.target, reason, attempt + 1, wait)
            if self._abandon.wait(wait):
                reason = "the server is stopping"
                break
        log.warning("notification to %s given up after %d tries: %s", self.target, attempt, reason)
        return False

    def _post(self, body: bytes) -> None:
        request = urllib.request.Request(
            self._url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": f"hangdoc/{__version__}"},
        )
        with self._opener.open(request, timeout=self._timeout) as response:
            response.read(ANSWER_BYTES)

    def _scrubbed(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "…")
        return text


def _checked(url: str) -> str:
    """``scheme://host[:port]`` of an http(s) URL; UsageError for any other, which never
    quotes the URL (it may hold a secret)."""
    help = (
        "Give the webhook's full URL, https://hooks.slack.com/services/... for Slack; pass it "
        "in HANGDOC_NOTIFY_WEBHOOK to keep it out of the process list."
    )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise UsageError("the notification webhook is not a URL", help) from None
    if parts.scheme not in ("http", "https"):
        raise UsageError("the notification webhook must be an http:// or https:// URL", help)
    if not parts.hostname or any(c.isspace() or not c.isprintable() for c in url):
        raise UsageError("the notification webhook URL has no host, or spaces or control characters", help)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def _secrets(url: str) -> tuple[str, ...]:
    """The parts of ``url`` a log line must never show: its path and query, its user."""
    parts = urlsplit(url)
    tail = url[url.index(parts.netloc) + len(parts.netloc) :]
    return tuple(s for s in (tail, parts.path, parts.query, parts.username, parts.password) if s and s != "/")


def _retry_after(headers: Message | None) -> float | None:
    """Retry-After in seconds, when it gives seconds (an HTTP date is left to the backoff)."""
    value = headers.get("Retry-After") if headers is not None else None
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < float("inf") else None


# -- the message ---------------------------------------------------------------------------


def incident_message(incident: Incident, seen_before: Sequence[Incident], link: str | None) -> dict[str, Any]:
    """A new incident as a Slack-compatible incoming webhook takes it: ``text`` (one mrkdwn
    line), ``blocks`` (the same, and a button to the incident's page when ``link`` is
    given), and ``hangdoc``, the fields as values for any other receiver."""
    text = _line(incident, seen_before)
    section: dict[str, Any] = {"type": "section", "text": {"type": "mrkdwn", "text": text}}
    if link is not None:
        section["accessory"] = {
            "type": "button",
            "text": {"type": "plain_text", "text": f"Incident #{incident.id}"},
            "url": link,
        }
    return {
        "text": text,
        "blocks": [section],
        "hangdoc": {
            "id": incident.id,
            "job": incident.job,
            "verdict": incident.verdict,
            "culprits": list(incident.culprits),
            "confidence": incident.confidence,
            "summary": incident.summary,
            "state": incident.state.value,
            "detected_at": iso(incident.detected_at),
            "link": link,
            "fingerprint": incident.fingerprint,
            "seen_before": [
                {"id": e.id, "job": e.job, "detected_at": iso(e.detected_at), "state": e.state.value}
                for e in seen_before
            ],
        },
    }


def _line(incident: Incident, seen_before: Sequence[Incident]) -> str:
    culprits = rank_phrase(incident.culprits) if incident.culprits else "no culprit named"
    summary = " ".join(incident.summary.split())
    if len(summary) > SUMMARY_CHARS:
        summary = summary[: SUMMARY_CHARS - 1].rstrip() + "…"
    line = f"hangdoc: *{incident.verdict}* in {incident.job}: {culprits} ({incident.confidence} confidence). {summary}"
    if seen_before:
        earlier = [f"#{e.id} (job {e.job}, {(iso(e.detected_at) or '')[:10]}, {e.state.value})" for e in seen_before]
        more = len(earlier) - SEEN_SHOWN
        line += " — seen before: " + ", ".join(earlier[:SEEN_SHOWN]) + (f" and {more} more" if more > 0 else "")
    return _escaped(line[:LINE_CHARS])


def _escaped(text: str) -> str:
    """Slack's mrkdwn escapes: &, < and > are control characters there."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
