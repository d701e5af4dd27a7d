"""``hangdoc watch --metrics-port``: the watchdog's state in the Prometheus text format.

Served from a daemon thread on loopback unless ``--metrics-host`` says otherwise; the
page holds numbers only (no stacks, no environment), so exposing it leaks nothing about
the job beyond its pace. The watch loop updates a ``WatchMetrics`` value under a lock
(``MetricsBoard``: the pace at each check, counters as stalls are looked at); each scrape
renders the current one.
"""

from __future__ import annotations

import http.server
import threading
import time
from dataclasses import dataclass, field, replace

from ..errors import UsageError
from .stall import Signal, StallClock

PREFIX = "hangdoc_watch"


@dataclass(frozen=True, slots=True)
class WatchMetrics:
    signal: str = "none"
    steps_seen: int = 0  # on the current signal
    last_step: int | None = None
    last_step_time: float | None = None  # unix seconds
    step_rate: float = 0.0  # steps per second over the last minute
    silence_seconds: float = 0.0
    stall_timeout_seconds: float = 0.0
    stalled: bool = False
    suspected_total: int = 0  # silences that were checked
    reports_total: int = 0  # hangs reported (hang directories written)
    dismissed_total: int = 0  # ... and found to be progress
    diagnoses: dict[str, int] = field(default_factory=dict)  # every diagnosis run, by verdict


def render(m: WatchMetrics) -> str:
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {PREFIX}_{name} {help_text}")
        lines.append(f"# TYPE {PREFIX}_{name} {kind}")
        for labels, value in samples:
            lines.append(f"{PREFIX}_{name}{labels} {_number(value)}")

    metric("info", "gauge", "The signal steps are read from.", [(f'{{signal="{m.signal}"}}', 1)])
    metric("steps_seen", "gauge", "Step events seen on the current signal.", [("", m.steps_seen)])
    if m.last_step is not None:
        metric("last_step", "gauge", "The last step number reported by the job.", [("", m.last_step)])
    if m.last_step_time is not None:
        metric("last_step_timestamp_seconds", "gauge", "Unix time of the last step event.",
               [("", round(m.last_step_time, 3))])
    metric("step_rate", "gauge", "Steps per second over the last minute.", [("", round(m.step_rate, 4))])
    metric("silence_seconds", "gauge", "Seconds since the last step event.", [("", round(m.silence_seconds, 3))])
    metric("stall_timeout_seconds", "gauge", "The current stall timeout.", [("", round(m.stall_timeout_seconds, 3))])
    metric("stalled", "gauge", "1 while a confirmed hang lasts.", [("", int(m.stalled))])
    metric("suspected_total", "counter", "Silences longer than the timeout that were checked.",
           [("", m.suspected_total)])
    metric("dismissed_total", "counter", "Checked silences that turned out to be progress.",
           [("", m.dismissed_total)])
    metric("reports_total", "counter", "Hangs reported (hang directories written).", [("", m.reports_total)])
    by_verdict = sorted(m.diagnoses.items()) or [("none", 0)]
    metric("diagnoses_total", "counter", "Diagnoses run on a suspected stall, by verdict (failed: could not run).",
           [(f'{{verdict="{v}"}}', n) for v, n in by_verdict])
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    """Integers as integers; other values to the millisecond, never in exponent form."""
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return f"{value:.3f}".rstrip("0").rstrip(".")


class MetricsBoard:
    """The current metrics, shared between the watch loop and the HTTP thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = WatchMetrics()

    def update(self, **changes: object) -> None:
        with self._lock:
            self._value = replace(self._value, **changes)  # type: ignore[arg-type]

    def count(self, name: str) -> None:
        """Add one to the counter field ``name``."""
        with self._lock:
            self._value = replace(self._value, **{name: getattr(self._value, name) + 1})

    def publish(self, signal: Signal, clock: StallClock, last_step: int | None, now: float) -> None:
        """The pace of ``signal``, the one in use, at ``now`` (monotonic seconds)."""
        self.update(
            signal=signal.value, steps_seen=clock.events, last_step=last_step,
            last_step_time=unix_time(clock.last) if clock.last is not None else None,
            step_rate=clock.rate(now), silence_seconds=clock.silence(now),
            stall_timeout_seconds=clock.timeout().seconds,
        )

    def count_diagnosis(self, verdict: str) -> None:
        with self._lock:
            counts = dict(self._value.diagnoses)
            counts[verdict] = counts.get(verdict, 0) + 1
            self._value = replace(self._value, diagnoses=counts)

    @property
    def value(self) -> WatchMetrics:
        with self._lock:
            return self._value


def serve(board: MetricsBoard, host: str, port: int) -> http.server.ThreadingHTTPServer:
    """Serve ``/metrics`` in a daemon thread; the server's ``server_address`` has the port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404, "only /metrics is served")
                return
            body = render(board.value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    try:
        server = http.server.ThreadingHTTPServer((host, port), Handler)
    except (OSError, OverflowError, ValueError) as err:  # OverflowError: a port outside 0-65535
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise UsageError(f"cannot serve metrics on {host}:{port}: {reason}",
                         help="Pick a free port with --metrics-port (0 picks one and prints it).") from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="hangdoc-metrics", daemon=True).start()
    return server


def unix_time(monotonic: float) -> float:
    """A ``time.monotonic()`` instant as unix seconds."""
    return time.time() - (time.monotonic() - monotonic)
