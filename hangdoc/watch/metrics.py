"""The watchdog's state for Prometheus: ``--metrics-port`` (HTTP) and ``--metrics-textfile``
(node_exporter's textfile collector).

The watch loop updates a ``WatchMetrics`` value under a lock (``MetricsBoard``: the pace at
each check, counters as stalls are looked at). ``prometheus_client`` renders it: the board's
``registry`` is a private ``CollectorRegistry`` (never the library's global one, which
would mix in the process's own metrics and clash with a second board) holding one
collector that reads the board's current value at each scrape. The page holds numbers
only (no stacks, no environment), so exposing it leaks nothing about the job beyond its
pace; it is served from a daemon thread on loopback unless ``--metrics-host`` says
otherwise (``serve``), and written atomically (temp file, then rename) by ``Textfile``.

Names follow Prometheus' conventions (``hangdoc_watch_*``, base units, ``_seconds``,
``_total`` counters, an ``_info`` metric). Every series carries the labels that say whose
job it is, named as NCCL Inspector names them in its Prometheus output (NVIDIA/nccl
``ext-profiler/inspector/inspector_prom.cc``): ``hostname``, ``slurm_job_id``,
``slurm_job``, ``unknown`` where there is none, so the two join on them. docs/watch.md
lists every name and label.
"""

from __future__ import annotations

import http.server
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import MetricsHandler, generate_latest, write_to_textfile

from .. import __version__
from ..capture.find.jobspec import JobKind, parse_job_spec
from ..errors import UsageError
from .config import Level, Say
from .stall import Signal, StallClock

PREFIX = "hangdoc_watch"
UNKNOWN = "unknown"  # a label with no value: NCCL Inspector's word for it
IDENTITY_LABELS = ("hostname", "slurm_job_id", "slurm_job")
TEXTFILE_INTERVAL = 1.0  # seconds: the textfile is rewritten at most this often
TEXTFILE_NAME = "hangdoc_watch_{pid}.prom"  # in a --metrics-textfile directory


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


def identity(job: str | None, env: Mapping[str, str], hostname: str | None = None) -> dict[str, str]:
    """The labels that say whose job the metrics are about: this host, and the Slurm job
    (the one a ``slurm:`` spec names, else the watch's own ``SLURM_JOB_ID``: a wrapped
    ``srun`` runs in it)."""
    slurm_job_id = env.get("SLURM_JOB_ID") or UNKNOWN
    if job:
        spec = parse_job_spec(job)
        if spec.kind is JobKind.SLURM and spec.slurm_job is not None:
            slurm_job_id = spec.slurm_job
    return {
        "hostname": hostname or socket.gethostname(),
        "slurm_job_id": slurm_job_id,
        "slurm_job": env.get("SLURM_JOB_NAME") or UNKNOWN,
    }


class MetricsBoard:
    """The current metrics, shared between the watch loop and the HTTP thread, and the
    private registry that renders them."""

    def __init__(self, labels: Mapping[str, str] | None = None) -> None:
        self._lock = threading.Lock()
        self._value = WatchMetrics()
        self.labels = dict(labels if labels is not None else dict.fromkeys(IDENTITY_LABELS, UNKNOWN))
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_Collector(self))
        self.textfile: Textfile | None = None

    def update(self, **changes: object) -> None:
        with self._lock:
            self._value = replace(self._value, **changes)  # type: ignore[arg-type]
        self._changed()

    def count(self, name: str) -> None:
        """Add one to the counter field ``name``."""
        with self._lock:
            self._value = replace(self._value, **{name: getattr(self._value, name) + 1})
        self._changed()

    def publish(self, signal: Signal, clock: StallClock, last_step: int | None, now: float) -> None:
        """The pace of ``signal``, the one in use, at ``now`` (monotonic seconds)."""
        self.update(
            signal=signal.value,
            steps_seen=clock.events,
            last_step=last_step,
            last_step_time=unix_time(clock.last) if clock.last is not None else None,
            step_rate=clock.rate(now),
            silence_seconds=clock.silence(now),
            stall_timeout_seconds=clock.timeout().seconds,
        )

    def count_diagnosis(self, verdict: str) -> None:
        with self._lock:
            counts = dict(self._value.diagnoses)
            counts[verdict] = counts.get(verdict, 0) + 1
            self._value = replace(self._value, diagnoses=counts)
        self._changed()

    @property
    def value(self) -> WatchMetrics:
        with self._lock:
            return self._value

    def _changed(self) -> None:
        if self.textfile is not None:
            self.textfile.write()


def render(board: MetricsBoard) -> str:
    """The page as Prometheus' text format (version 0.0.4) renders it."""
    return generate_latest(board.registry).decode()


class _Collector:
    """Reads the board at each collection; what ``registry`` holds."""

    def __init__(self, board: MetricsBoard) -> None:
        self.board = board

    def collect(self) -> Iterator[Metric]:
        m = self.board.value
        names, values = list(self.board.labels), list(self.board.labels.values())

        def gauge(name: str, help_text: str, value: float | None) -> Iterator[Metric]:
            if value is not None:
                family = GaugeMetricFamily(f"{PREFIX}_{name}", help_text, labels=names)
                family.add_metric(values, value)
                yield family

        def counter(name: str, help_text: str, value: int) -> Metric:
            family = CounterMetricFamily(f"{PREFIX}_{name}", help_text, labels=names)
            family.add_metric(values, value)
            return family

        info = InfoMetricFamily(PREFIX, "The watch: the signal steps are read from, hangdoc's version.", labels=names)
        info.add_metric(values, {"signal": m.signal, "version": __version__})
        yield info
        yield from gauge("steps_seen", "Step events seen on the signal in use.", m.steps_seen)
        yield from gauge("last_step", "The last step number the job reported.", m.last_step)
        yield from gauge(
            "last_step_timestamp_seconds", "Unix time of the last activity on the signal in use.", m.last_step_time
        )
        yield from gauge("steps_per_second", "Steps per second over the last minute.", m.step_rate)
        yield from gauge("step_rate", "Deprecated: hangdoc_watch_steps_per_second under its old name.", m.step_rate)
        yield from gauge("silence_seconds", "Seconds since the last activity on the signal in use.", m.silence_seconds)
        yield from gauge("stall_timeout_seconds", "The current stall timeout.", m.stall_timeout_seconds)
        yield from gauge("stalled", "1 from a hang report until activity resumes.", int(m.stalled))
        yield counter("suspected", "Silences longer than the timeout, each checked by a diagnosis.", m.suspected_total)
        yield counter("dismissed", "Checked silences that turned out to be progress.", m.dismissed_total)
        yield counter("reports", "Hangs reported (hang directories written).", m.reports_total)
        diagnoses = CounterMetricFamily(
            f"{PREFIX}_diagnoses",
            "Diagnoses run on a suspected stall, by verdict (failed: could not run).",
            labels=[*names, "verdict"],
        )
        for verdict, n in sorted(m.diagnoses.items()) or [("none", 0)]:
            diagnoses.add_metric([*values, verdict], n)
        yield diagnoses


def serve(board: MetricsBoard, host: str, port: int) -> http.server.ThreadingHTTPServer:
    """Serve ``/metrics`` in a daemon thread; the server's ``server_address`` has the port.
    ``prometheus_client``'s handler answers (the text format, or OpenMetrics when the
    scraper asks for it); any other path is a 404."""

    class Handler(MetricsHandler):
        registry = board.registry

        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404, "only /metrics is served")
                return
            super().do_GET()

    try:
        server = http.server.ThreadingHTTPServer((host, port), Handler)
    except (OSError, OverflowError, ValueError) as err:  # OverflowError: a port outside 0-65535
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise UsageError(
            f"cannot serve metrics on {host}:{port}: {reason}",
            help="Pick a free port with --metrics-port (0 picks one and prints it).",
        ) from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="hangdoc-metrics", daemon=True).start()
    return server


def textfile_path(given: Path) -> Path:
    """Where ``--metrics-textfile`` writes: ``given`` (a ``.prom`` file), or a file of this
    watch's own in ``given`` when it is a directory (node_exporter's textfile directory)."""
    if given.is_dir():
        return given / TEXTFILE_NAME.format(pid=os.getpid())
    if given.suffix != ".prom":
        raise UsageError(
            f"--metrics-textfile {given}: the name must end in .prom",
            help="node_exporter's textfile collector reads only *.prom files; or give its "
            "directory and the watch names its own file.",
        )
    return given


class Textfile:
    """The board, written for node_exporter's textfile collector: rewritten whole at most
    every ``TEXTFILE_INTERVAL`` seconds, atomically (``write_to_textfile``: a temp file
    beside it, then a rename, so the collector never reads half a file), removed by
    ``close`` when the watch ends, as the HTTP page goes away with it."""

    def __init__(self, board: MetricsBoard, path: Path, say: Say) -> None:
        self.board, self.path, self.say = board, path, say
        self._lock = threading.Lock()
        self._written = float("-inf")
        self._failing = False

    def open(self) -> None:
        """The first write, before the watch starts anything: raises ``UsageError`` when
        the file cannot be written."""
        try:
            write_to_textfile(str(self.path), self.board.registry)
        except OSError as err:
            raise UsageError(
                f"--metrics-textfile {self.path}: cannot write it: {err.strerror or err}",
                help="Give a .prom path (or a directory) this user can write, on the "
                "directory node_exporter's --collector.textfile.directory reads.",
            ) from None
        self._written = time.monotonic()
        self.board.textfile = self

    def write(self, force: bool = False) -> None:
        """Rewrite the file when ``TEXTFILE_INTERVAL`` has passed (or ``force``); a failure is
        said once, and the next write tries again."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._written < TEXTFILE_INTERVAL:
                return
            self._written = now
            try:
                write_to_textfile(str(self.path), self.board.registry)
            except OSError as err:
                if not self._failing:
                    self.say(
                        Level.WARNING,
                        f"cannot write the metrics textfile {self.path}: "
                        f"{err.strerror or err}; trying again at the next check",
                    )
                self._failing = True
                return
            if self._failing:
                self.say(Level.INFO, f"metrics textfile {self.path} written again")
            self._failing = False

    def close(self) -> None:
        """Stop writing, and remove the file: its numbers are of a watch that has ended."""
        with self._lock:
            self.board.textfile = None
            try:
                self.path.unlink()
            except OSError:
                pass


def unix_time(monotonic: float) -> float:
    """A ``time.monotonic()`` instant as unix seconds."""
    return time.time() - (time.monotonic() - monotonic)
