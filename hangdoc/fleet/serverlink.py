"""An agent started with ``--server``: it reports its node's jobs to `hangdoc server` by
itself, every interval the server asks for, so the server finds it (and its jobs) without a
hostfile and keeps finding it across restarts of either side.

Each report is one look (``jobwatch``) sent as JSON (``jobreport``) to
``POST /api/agents/report`` with the agent's token; the answer says when to report next. A
server that cannot be reached is retried at the same pace, and said once in the log, not at
every try.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from ..errors import UsageError
from . import jobreport
from .jobwatch import JobWatch

log = logging.getLogger("hangdoc.agent")

DEFAULT_INTERVAL = 30.0  # until the server says otherwise
# a server that cannot be reached is tried again this often (at most the interval): after a
# restart of the server, its agents are back within seconds; the look sent is reused while
# it is younger than the interval, so retrying samples no rank
RETRY_S = 5.0
MIN_INTERVAL, MAX_INTERVAL = 1.0, 3600.0
POST_TIMEOUT = 20.0


def server_url(server: str, tls: bool) -> str:
    """``HOST:PORT`` or an ``http(s)://`` URL, as the base URL of the server."""
    text = server.strip().rstrip("/")
    if "://" not in text:
        text = f"{'https' if tls else 'http'}://{text}"
    scheme, _, rest = text.partition("://")
    if scheme not in ("http", "https") or not rest or "/" in rest:
        raise UsageError(
            f"--server {server!r} is not HOST:PORT or http(s)://HOST:PORT",
            help="Name the server as it listens: --server hangdoc-server:7430",
        )
    return text


class ServerLink:
    """Reports ``watch``'s looks to the server in a daemon thread until ``stop``."""

    def __init__(
        self,
        server: str,
        watch: JobWatch,
        port: int,
        *,
        token: str | None = None,
        ca: str | None = None,
        cert: tuple[str, str] | None = None,
        advertise: str | None = None,
    ) -> None:
        self.url = server_url(server, tls=ca is not None) + "/api/agents/report"
        self.watch, self.port, self.advertise = watch, port, advertise
        self.token = token
        self.context: ssl.SSLContext | None = None
        if self.url.startswith("https://"):
            self.context = ssl.create_default_context(cafile=ca)
            if cert is not None:
                self.context.load_cert_chain(*cert)
        self.interval = DEFAULT_INTERVAL
        self.reports = 0  # reports the server took
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hangdoc-server-link", daemon=True)
        self._failing: str | None = None
        self._last_look: tuple[float, bytes] | None = None

    def start(self) -> None:
        log.info("reporting this node's jobs to %s", self.url.rsplit("/api/", 1)[0])
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.interval = self.report_once()
                wait = self.interval
            except Exception as exc:  # noqa: BLE001 - the agent serves on whatever the link hits
                self._failed(f"{type(exc).__name__}: {exc}" if not isinstance(exc, UsageError) else str(exc))
                wait = min(self.interval, RETRY_S)
            self._stop.wait(wait)

    def _body(self) -> bytes:
        now = time.monotonic()
        if self._last_look is None or now - self._last_look[0] >= self.interval:
            self._last_look = (now, jobreport.to_json(self.watch.look(), self.port, self.advertise))
        return self._last_look[1]

    def report_once(self) -> float:
        """Look (unless the last look is recent), report, and return the interval the server asks for."""
        body = self._body()
        request = urllib.request.Request(self.url, data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=POST_TIMEOUT, context=self.context) as response:
                answer: Any = json.loads(response.read(65536) or b"{}")
        except urllib.error.HTTPError as err:
            raise UsageError(f"the server answered {err.code} {err.reason}") from None
        except urllib.error.URLError as err:
            raise UsageError(f"cannot reach the server: {err.reason}") from None
        if self._failing is not None:
            log.info("the server takes this node's reports again")
            self._failing = None
        self.reports += 1
        wanted = answer.get("interval") if isinstance(answer, dict) else None
        if isinstance(wanted, (int, float)) and not isinstance(wanted, bool) and wanted == wanted:
            return min(MAX_INTERVAL, max(MIN_INTERVAL, float(wanted)))
        return self.interval

    def _failed(self, why: str) -> None:
        if why != self._failing:
            log.warning("cannot report to %s: %s (retrying every %g s)", self.url, why, self.interval)
        self._failing = why
