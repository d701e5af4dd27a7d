"""The HTTP side of ``hangdoc server``: the page, the reports, the JSON API, the metrics.

The standard library's ``ThreadingHTTPServer`` serves it, one daemon thread a connection,
each connection closed after its answer (HTTP/1.0), every socket read and write bounded by
``SOCKET_TIMEOUT`` (a TLS handshake too: it runs in the connection's thread, never in the
accepting one), a request body by ``MAX_BODY``. With a token, every route but ``/healthz``
needs it: ``Authorization: Bearer TOKEN``, or the ``hangdoc_token`` cookie a browser gets
by opening ``/?token=TOKEN`` once (it is sent back to the address without the token).
Every error is one line of JSON (``{"error": ...}``, with ``help`` where hangdoc has it),
never a traceback; a browser without the token gets a page saying how to give it. Each
request is logged as one line (method, path without its query, status, milliseconds):
the token is never logged. Times in JSON are ISO 8601 UTC (``2026-11-28T12:00:00Z``).
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import re
import socket
import ssl
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol, cast
from urllib.parse import parse_qsl, urlencode, urlsplit

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..digits import bounded_int
from ..errors import HangdocError, JobNotFound, PermissionDenied, UsageError, one_line, printable
from ..fleet.client import AgentError
from ..model import Verdict
from .metrics import ServiceMetrics
from .page import render_index, render_unauthorized
from .records import AgentView, Incident, JobView
from .shapes import agent_entry, incident_entry, incident_object, job_entry
from .store import Store

logger = logging.getLogger(__name__)

MAX_BODY = 1 << 20  # bytes of a request body
SOCKET_TIMEOUT = 30.0  # seconds a client may take to send a request or read an answer
DRAIN_MAX = 16 << 20  # bytes of a refused body read and dropped, so the client sees the answer
DRAIN_SECONDS = 2.0
COOKIE = "hangdoc_token"
COOKIE_SECONDS = 12 * 3600
LIST_DEFAULT, LIST_MAX = 100, 1000  # incidents /api/incidents lists
PAGE_INCIDENTS = 100  # incidents the page shows
PAGE_SEEN = 1000  # earlier incidents the page counts for each
MAX_SPEC = 4096  # characters of a job spec given to /api/diagnose
ID = "([0-9]{1,18})"  # an incident id in a path: more digits are no id (404)

PAGE_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# the stored HTML report draws itself with its own inline script (hangdoc/report/html.py)
REPORT_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
ROUTINE = frozenset({"/api/agents/report", "/healthz", "/metrics"})
JSON_TYPE = "application/json; charset=utf-8"
HTML_TYPE = "text/html; charset=utf-8"
QUERY = ("job", "verdict", "since", "limit")
VERDICTS = tuple(v.value for v in Verdict)


class ServiceView(Protocol):
    """What the HTTP side reads and asks of the service (the service loop is one)."""

    store: Store
    metrics: ServiceMetrics

    def jobs(self) -> list[JobView]: ...

    def agents(self) -> list[AgentView]: ...

    def diagnose_now(self, job: str) -> tuple[Incident | None, str]:
        """Diagnose ``job`` now: the stored incident (None when the job is not hung) and the
        JSON report. Raises ``HangdocError`` (``UsageError`` for a bad spec)."""
        ...

    def agent_report(self, peer_host: str, body: bytes) -> dict[str, object]:
        """An agent's push from ``peer_host``; the answer to send back. Raises
        ``UsageError`` for a body it cannot read."""
        ...

    def healthy(self) -> bool: ...


def make_http_server(
    address: str, view: ServiceView, token: str | None, tls: tuple[str, str] | None
) -> ThreadingHTTPServer:
    """A server bound to ``address`` (``HOST:PORT``; port 0 picks one: see
    ``server_address``), not yet serving: run its ``serve_forever`` in a thread, then
    ``shutdown`` and ``server_close`` it. ``tls``: (certificate, key) files, for HTTPS.
    Raises ``UsageError`` for an address it cannot bind or TLS files it cannot load."""
    if token == "":
        raise UsageError("the server's token is empty", help="Give a token of at least 16 random characters.")
    host, port = _host_port(address)
    context = _tls_context(tls) if tls is not None else None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        server = _Server((host, port), family, view, token, secure=context is not None)
    except (OSError, OverflowError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise UsageError(
            f"cannot serve on {address}: {reason}",
            help="Pick a free port (0 picks one) on an address of this machine.",
        ) from None
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    return server


def _host_port(address: str) -> tuple[str, int]:
    host, sep, text = address.rpartition(":")
    port = bounded_int(text, 0, 65535)
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or port is None:
        raise UsageError(
            f"cannot serve on {printable(address)}: give HOST:PORT",
            help="For example 0.0.0.0:8080, 127.0.0.1:0 (any free port) or [::]:8080.",
        )
    return host, port


def _tls_context(tls: tuple[str, str]) -> ssl.SSLContext:
    cert, key = tls
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        raise UsageError(
            f"cannot load the TLS certificate {cert} and key {key}: {err.strerror or err}",
            help="Give a PEM certificate (its chain after it) and its PEM private key, readable by the server.",
        ) from None
    return context


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        family: socket.AddressFamily,
        view: ServiceView,
        token: str | None,
        secure: bool,
    ) -> None:
        self.address_family = family
        self.view, self.token, self.secure = view, token, secure
        super().__init__(address, _Handler)

    def handle_error(self, request: object, client_address: Any) -> None:
        """A connection that failed outside a request (a TLS handshake, a reset): one line
        in the log, no traceback on stderr."""
        err = sys.exc_info()[1]
        logger.debug("connection from %s failed: %s", client_address[0], one_line(str(err), 200))


# ------------------------------------------------------------------ answers


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


class HttpError(Exception):
    """An answer that is an error: its status and one line."""

    def __init__(
        self, status: int, message: str, help: str | None = None, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(message)
        self.status, self.help, self.headers = status, help, headers

    def reply(self) -> Reply:
        body: dict[str, object] = {"error": one_line(str(self), 500)}
        if self.help:
            body["help"] = self.help
        return _json(self.status, body, self.headers)


def _json(status: int, value: object, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(status, (json.dumps(value, ensure_ascii=False) + "\n").encode(), JSON_TYPE, headers)


def _html(status: int, text: str, csp: str = PAGE_CSP, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(status, text.encode(), HTML_TYPE, (("Content-Security-Policy", csp), *headers))


def parse_since(text: str) -> float:
    """Epoch seconds from ``text``: a number of seconds, or ISO 8601 (UTC when it names no
    zone). Raises ``HttpError`` (400)."""
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(number):
            return number
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise HttpError(
            400, f"since={text}: not a time", help="Give ISO 8601 (2026-11-28T12:00:00Z) or epoch seconds."
        ) from None
    return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()


def _error_status(err: HangdocError) -> int:
    if isinstance(err, UsageError):
        return 400
    if isinstance(err, PermissionDenied):
        return 403
    if isinstance(err, JobNotFound):
        return 404
    if isinstance(err, AgentError):
        return 502  # the agents did not answer: the request was fine
    return 422  # understood, but it could not be diagnosed


# ------------------------------------------------------------------ requests

Route = Callable[["_Handler", re.Match[str], str], Reply]
ROUTES: list[tuple[str, re.Pattern[str], str]] = []  # (method, path, handler's name)


def _route(method: str, pattern: str) -> Callable[[Route], Route]:
    def register(fn: Route) -> Route:
        ROUTES.append((method, re.compile(pattern), fn.__name__))
        return fn

    return register


class _Handler(BaseHTTPRequestHandler):
    timeout = SOCKET_TIMEOUT  # StreamRequestHandler sets it on the socket
    server_version = "hangdoc"
    _started = 0.0
    _status = 0
    _body_read = False

    @property
    def service(self) -> _Server:
        return cast(_Server, self.server)

    @property
    def view(self) -> ServiceView:
        return self.service.view

    def version_string(self) -> str:
        return self.server_version

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):  # here, in this connection's thread
            self.request.settimeout(self.timeout)
            self.request.do_handshake()
        super().setup()

    def handle_one_request(self) -> None:
        self._started = time.monotonic()
        super().handle_one_request()

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_POST

    # -------------------------------------------------------------- one request

    def _serve(self) -> None:
        path = urlsplit(self.path).path
        try:
            reply = self._answer(path, urlsplit(self.path).query)
        except HttpError as err:
            reply = err.reply()
        except HangdocError as err:
            reply = HttpError(_error_status(err), str(err), help=err.help or None).reply()
        except Exception as err:  # a bug, or the store failing: one line out, the traceback in the log
            logger.exception("%s %s failed", self.command, _shown(path))
            reply = HttpError(500, f"internal error ({type(err).__name__}); the server's log has the details").reply()
        self._send(reply)
        self._drain()
        self._log(path)

    def _answer(self, path: str, query: str) -> Reply:
        if path == "/healthz":
            self._allow(path, ("GET", "HEAD"))
            if self.view.healthy():
                return Reply(200, b"ok\n", "text/plain; charset=utf-8")
            return HttpError(503, "the server is not healthy: its store or its watch loop failed").reply()
        matches = [(method, m, name) for method, pattern, name in ROUTES if (m := pattern.fullmatch(path))]
        browser = not (path == "/api" or path.startswith(("/api/", "/metrics")))
        if self.service.token is not None:
            if browser and matches and self.command == "GET" and _has_token(query):
                return self._take_token(path, query)
            if not self._authorized():
                return self._unauthorized(browser)
        if not matches:
            raise HttpError(404, f"no such page: {_shown(path)}", help="GET / is the page; GET /api/incidents lists.")
        method = "GET" if self.command == "HEAD" else self.command
        for route_method, match, name in matches:
            if route_method == method:
                route = cast(Callable[[re.Match[str], str], Reply], getattr(self, name))
                return route(match, query)
        allowed = [m for m, _, _ in matches]
        self._allow(path, (*allowed, "HEAD") if "GET" in allowed else tuple(allowed))
        raise AssertionError("unreachable: _allow refuses the method")

    def _allow(self, path: str, methods: tuple[str, ...]) -> None:
        if self.command not in methods:
            raise HttpError(
                405, f"{self.command} is not allowed on {_shown(path)}", headers=(("Allow", ", ".join(methods)),)
            )

    # -------------------------------------------------------------- the token

    def _authorized(self) -> bool:
        token = self.service.token
        if token is None:
            return True
        given: list[str] = []
        scheme, _, value = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer":
            given.append(value.strip())
        try:
            cookie = SimpleCookie(self.headers.get("Cookie") or "").get(COOKIE)
        except CookieError:
            cookie = None
        if cookie is not None:
            given.append(cookie.value)
        return any(_same(g, token) for g in given)

    def _take_token(self, path: str, query: str) -> Reply:
        """``GET /?token=T``: with the right token, the cookie and a redirect to the
        address without it; else 401."""
        pairs = parse_qsl(query, keep_blank_values=True)
        if not any(k == "token" and _same(v, self.service.token or "") for k, v in pairs):
            return self._unauthorized(browser=True)
        rest = [(k, v) for k, v in pairs if k != "token"]
        cookie = f"{COOKIE}={self.service.token}; HttpOnly; SameSite=Strict; Path=/; Max-Age={COOKIE_SECONDS}"
        if self.service.secure:
            cookie += "; Secure"
        location = path + (f"?{urlencode(rest)}" if rest else "")
        return Reply(303, b"", "text/plain", (("Location", location), ("Set-Cookie", cookie)))

    def _unauthorized(self, browser: bool) -> Reply:
        challenge = (("WWW-Authenticate", 'Bearer realm="hangdoc"'),)
        if browser:
            return _html(401, render_unauthorized(), headers=challenge)
        return HttpError(
            401,
            "this server needs its token",
            help="Send the header `Authorization: Bearer TOKEN` with the server's token.",
            headers=challenge,
        ).reply()

    # -------------------------------------------------------------- the body

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise HttpError(411, "send the body with a Content-Length, not in chunks")
        text = self.headers.get("Content-Length")
        if text is None:
            raise HttpError(411, "send the body with a Content-Length")
        length = bounded_int(text.strip(), 0, 1 << 62)
        if length is None:
            self.close_connection = True
            raise HttpError(400, "the Content-Length is not a number of bytes")
        if length > MAX_BODY:
            raise HttpError(413, f"the body is {length} bytes; at most {MAX_BODY} are read")
        self._body_read = True
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            self.close_connection = True
            raise HttpError(408, f"the body did not come within {self.timeout:g} s") from None
        if len(body) < length:
            raise HttpError(400, f"the body ended after {len(body)} of {length} bytes")
        return body

    def _json_body(self) -> dict[str, Any]:
        try:
            value = json.loads(self._body())
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise HttpError(400, f"the body is not JSON: {err}") from None
        if not isinstance(value, dict):
            raise HttpError(400, "the body must be a JSON object")
        return value

    def _drain(self) -> None:
        """Read and drop (within limits) a body left unread (refused, or of a request
        answered without it), so the client, maybe still sending it, reads the answer
        instead of a reset connection."""
        if self._body_read or self.headers.get("Transfer-Encoding"):
            return
        length = bounded_int((self.headers.get("Content-Length") or "").strip(), 0, 1 << 62)
        if not length:
            return
        left = min(length, DRAIN_MAX)
        deadline = time.monotonic() + DRAIN_SECONDS
        try:
            self.connection.settimeout(DRAIN_SECONDS)
            while left > 0 and time.monotonic() < deadline:
                chunk = self.rfile.read1(min(left, 1 << 16))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass
        self.close_connection = True

    # -------------------------------------------------------------- the browser's routes

    @_route("GET", "/")
    def page(self, match: re.Match[str], query: str) -> Reply:
        store = self.view.store
        incidents = store.list(limit=PAGE_INCIDENTS)
        seen = {i.id: [e.id for e in store.seen_before(i, limit=PAGE_SEEN)] for i in incidents}
        text = render_index(
            incidents,
            seen,
            self.view.jobs(),
            self.view.agents(),
            time.time(),
            stale_after=self.view.metrics.stale_after,
            open_count=len(store.open_incidents()),
        )
        return _html(200, text)

    @_route("GET", f"/incidents/{ID}")
    def report_page(self, match: re.Match[str], query: str) -> Reply:
        text = self.view.store.report_html(_id(match))
        if text is None:
            raise _no_incident(match)
        return _html(200, text, csp=REPORT_CSP)

    @_route("GET", rf"/incidents/{ID}/snapshot\.json\.gz")
    def snapshot(self, match: re.Match[str], query: str) -> Reply:
        data = self.view.store.bundle(_id(match))
        if data is None:
            raise _no_incident(match)
        name = f"hangdoc-incident-{_id(match)}.json.gz"
        return Reply(200, data, "application/gzip", (("Content-Disposition", f'attachment; filename="{name}"'),))

    @_route("GET", rf"/incidents/{ID}/report\.json")
    def report_json(self, match: re.Match[str], query: str) -> Reply:
        text = self.view.store.report_json(_id(match))
        if text is None:
            raise _no_incident(match)
        return Reply(200, text.encode(), JSON_TYPE)

    # -------------------------------------------------------------- the API

    @_route("GET", "/api/incidents")
    def incidents(self, match: re.Match[str], query: str) -> Reply:
        asked = _query(query)
        verdict = asked.get("verdict")
        if verdict is not None and verdict not in VERDICTS:
            raise HttpError(400, f"verdict={verdict}: no such verdict", help=f"One of {', '.join(VERDICTS)}.")
        limit = LIST_DEFAULT
        if "limit" in asked:
            given = bounded_int(asked["limit"], 1, LIST_MAX)
            if given is None:
                raise HttpError(400, f"limit={asked['limit']}: give a number from 1 to {LIST_MAX}")
            limit = given
        since = parse_since(asked["since"]) if "since" in asked else None
        store = self.view.store
        found = store.list(job=asked.get("job"), verdict=verdict, since=since, limit=limit)
        return _json(200, {"incidents": [incident_entry(i, store.seen_before(i)) for i in found]})

    @_route("GET", f"/api/incidents/{ID}")
    def incident(self, match: re.Match[str], query: str) -> Reply:
        store = self.view.store
        found = store.get(_id(match))
        text = store.report_json(_id(match))
        if found is None or text is None:
            raise _no_incident(match)
        return _json(200, incident_object(found, text, store.seen_before(found)))

    @_route("GET", "/api/jobs")
    def jobs(self, match: re.Match[str], query: str) -> Reply:
        return _json(200, {"jobs": [job_entry(j) for j in self.view.jobs()]})

    @_route("GET", "/api/agents")
    def agents(self, match: re.Match[str], query: str) -> Reply:
        now, stale_after = time.time(), self.view.metrics.stale_after
        return _json(200, {"agents": [agent_entry(a, now, stale_after) for a in self.view.agents()]})

    @_route("POST", "/api/diagnose")
    def diagnose(self, match: re.Match[str], query: str) -> Reply:
        job = self._json_body().get("job")
        if not isinstance(job, str) or not job.strip() or len(job) > MAX_SPEC:
            raise HttpError(
                400,
                'give the job to diagnose as {"job": SPEC}',
                help="SPEC as `hangdoc diagnose` takes it: HOST:PORT, slurm:JOB.STEP, pid:PID, ...",
            )
        found, text = self.view.diagnose_now(job)
        if found is None:
            report = json.loads(text)
            return _json(200, {"incident": None, "verdict": report.get("verdict"), "report": report})
        value = incident_object(found, text, self.view.store.seen_before(found))
        return _json(201, value, (("Location", f"/api/incidents/{found.id}"),))

    @_route("POST", "/api/agents/report")
    def agent_report(self, match: re.Match[str], query: str) -> Reply:
        return _json(200, self.view.agent_report(self.client_address[0], self._body()))

    @_route("GET", "/metrics")
    def metrics(self, match: re.Match[str], query: str) -> Reply:
        return Reply(200, self.view.metrics.render(self.view), CONTENT_TYPE_LATEST)

    # -------------------------------------------------------------- the answer

    def _send(self, reply: Reply) -> None:
        self._status = reply.status
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            self.send_header("Cache-Control", "no-store")
            for name, value in reply.headers:
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(reply.body)
            self.wfile.flush()
        except OSError as err:  # the client went away, or timed out reading
            logger.debug("answer to %s not sent: %s", self.client_address[0], err)
            self.close_connection = True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The request line or headers could not be read (or the method is unknown): one
        line of JSON, as every other error."""
        self.close_connection = True
        self._send(HttpError(code, message or HTTPStatus(code).phrase).reply())
        self._log(urlsplit(self.path).path if getattr(self, "path", None) else "-")

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # _log writes one line per request, without the query

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s: %s", self.client_address[0], one_line(format % args, 300))

    def _log(self, path: str) -> None:
        ms = (time.monotonic() - self._started) * 1000 if self._started else 0.0
        # what machines call every interval (agents' reports, probes, scrapes) would bury what
        # people do: logged only when it fails, or at debug level
        routine = path in ROUTINE and self._status < 400
        logger.log(
            logging.DEBUG if routine else logging.INFO,
            "%s %s %d %.1f ms",
            self.command or "-",
            _shown(path),
            self._status,
            ms,
        )


def _same(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode("utf-8", "surrogateescape"))


def _has_token(query: str) -> bool:
    return any(key == "token" for key, _ in parse_qsl(query, keep_blank_values=True))


def _shown(path: str) -> str:
    return one_line(path, 200)


def _id(match: re.Match[str]) -> int:
    return int(match.group(1))


def _no_incident(match: re.Match[str]) -> HttpError:
    return HttpError(404, f"no incident {_id(match)}", help="GET /api/incidents lists them.")


def _query(query: str) -> Mapping[str, str]:
    """The query of ``/api/incidents``: each parameter once, only those it reads, empty ones
    left out."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, max_num_fields=len(QUERY) * 2)
    except ValueError:
        raise HttpError(400, "too many query parameters") from None
    asked: dict[str, str] = {}
    for key, value in pairs:
        if key not in QUERY:
            raise HttpError(400, f"unknown query parameter {key}", help=f"It takes {', '.join(QUERY)}.")
        if key in asked:
            raise HttpError(400, f"{key} given twice")
        if value:
            asked[key] = value
    return asked
