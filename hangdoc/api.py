"""The Python API: ``hangdoc.diagnose(spec)`` and ``hangdoc.analyze(path_or_text)``.

Each takes the path its command takes (``hangdoc diagnose``: ``pipeline.diagnose``;
``hangdoc analyze``: ``capture.dumps.dumpfile`` then ``analysis.analyse``) and returns a
``Report``: the snapshot and its diagnosis, the frozen values of ``hangdoc.model``, whose
``to_json()`` is the ``--json`` report the command prints. Options are keyword-only, with
the command's defaults and ranges. What goes wrong is raised as a
``hangdoc.errors.HangdocError`` subclass (a bad option or job spec: ``UsageError``), with
the one-line message and ``help`` the command would print; a bug is raised as it is.

Importing this module is cheap (the model and the errors): the pipeline, py-spy's runner,
gRPC and rich are imported when a function runs. docs/python-api.md documents it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import UsageError, shown
from .model import Diagnosis, JobSnapshot

if TYPE_CHECKING:
    from .fleet.client import RemoteNode
    from .pipeline import CaptureOptions, FleetSource

# the JSON Schema (draft 2020-12) of the ``--json`` report and of the error object
SCHEMA_PATH = Path(__file__).resolve().parent / "report" / "report.schema.json"
StrPath = str | os.PathLike[str]
_HELP = "See help(hangdoc.diagnose) or docs/python-api.md for the accepted values."
_TEXT_NAME = Path("<text>")  # how text given to ``analyze`` is named in the report and errors


@dataclass(frozen=True, slots=True)
class Report:
    """A diagnosis and the snapshot it was made from.

    ``diagnosis.verdict`` (a ``hangdoc.model.Verdict``), ``diagnosis.culprit_ranks``,
    ``diagnosis.confidence``, ``diagnosis.summary`` say what happened; ``snapshot`` holds
    what was captured (every rank's samples), which ``save`` writes for ``analyze``.
    """

    snapshot: JobSnapshot
    diagnosis: Diagnosis

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` report as a dict of JSON types (docs/json-schema.md)."""
        from .report.json_report import to_json_dict

        return to_json_dict(self.diagnosis, self.snapshot)

    def to_json(self, indent: int | None = 2) -> str:
        """The ``--json`` report's text, as the command prints it (without the last newline);
        ``indent=None``: on one line."""
        from .report.json_report import dumps

        return dumps(self.to_dict(), indent)

    def save(self, path: StrPath) -> None:
        """Write the snapshot as ``hangdoc diagnose --save`` does (gzip when ``path`` ends
        in ``.gz``): ``hangdoc analyze PATH`` and ``hangdoc.analyze(PATH)`` read it back.
        Raises ``BundleError`` when the file cannot be written."""
        from .bundle import check_save_path, save_snapshot

        target = Path(path)
        check_save_path(target)
        save_snapshot(self.snapshot, target)


def diagnose(
    spec: str,
    *,
    window: float = 2.0,
    interval: float = 0.5,
    max_window: float = 12.0,
    native: bool = False,
    timeout: float = 5.0,
    include: Sequence[str] = (),
    agents: str | Sequence[str] | None = None,
    hostfile: StrPath | None = None,
    token_file: StrPath | None = None,
    tls_cert: StrPath | None = None,
    tls_key: StrPath | None = None,
    tls_ca: StrPath | None = None,
    ray_address: str | None = None,
    workers: Sequence[str] = (),
    keep_agents: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Capture a running job and diagnose it: ``hangdoc diagnose SPEC`` as a function.

    ``spec`` names the job: ``HOST:PORT`` (the ranks' ``MASTER_ADDR:MASTER_PORT``),
    ``pid:PID`` (a launcher or a rank), ``slurm:JOBID[.STEP]`` or ``ray:JOB_ID``.

    Sampling: ``window`` seconds before a first verdict (0 to 3600), every ``interval``
    seconds (0.01 to 600), up to ``max_window`` (at least ``window``, at most 3600) while
    the evidence is ambiguous; ``native`` takes native frames in every sample; ``timeout``
    bounds each py-spy dump (0.1 to 600 s); ``include`` also samples the job's processes
    whose command line holds one of these words (at most 16).

    Several nodes: ``agents`` (``"host:7420,host2"`` or a list of ``HOST[:PORT]``) and/or
    ``hostfile`` (one address a line) name ``hangdoc agent``s to ask instead of reading
    this node; ``token_file``, ``tls_cert``, ``tls_key``, ``tls_ca`` authenticate to them.
    A ``ray:`` job: ``ray_address`` (default ``RAY_ADDRESS``, else ``auto``), ``workers``
    (shell patterns over actor class or name), ``keep_agents``.

    ``progress`` is called with each status line the command prints on stderr.

    Raises ``UsageError`` (a malformed spec or option), ``JobNotFound``, ``PySpyMissing``,
    ``PermissionDenied``, ``AgentError``, ``RayNotInstalled``, ``RayUnreachable``: each a
    ``hangdoc.errors.HangdocError`` with ``help`` and ``exit_code``.
    """
    from .capture.find.jobspec import parse_job_spec
    from .pipeline import diagnose as run

    if not isinstance(spec, str):
        raise UsageError(f"spec={shown(spec)} is not a job spec: give a string such as 'pid:4100'", help=_HELP)
    parse_job_spec(spec)  # malformed: one line naming the accepted forms, before anything starts
    options = capture_options(window, interval, max_window, native, timeout, include)
    nodes = remote_nodes(agents, hostfile, token_file, tls_cert, tls_key, tls_ca)
    source = ray_source(spec, nodes is not None, ray_address, workers, keep_agents)
    snapshot, diagnosis = run(spec, options, progress, nodes, source)
    return Report(snapshot, diagnosis)


def analyze(source: StrPath) -> Report:
    """Diagnose evidence already at hand: ``hangdoc analyze FILE`` as a function.

    ``source`` is a path (a ``str`` or ``os.PathLike``) to what ``hangdoc analyze`` reads:
    a snapshot saved by ``Report.save`` or ``hangdoc diagnose --save`` (gzip too), the
    text of ``py-spy dump`` (one or many processes, ``--native``/``--locals`` too),
    ``py-spy dump --json`` output, ``ray stack`` output, stacks as pasted in an issue, or
    a directory of flight recorder dumps. A ``str`` that holds a line break, or starts
    with ``{`` or ``[``, is that content itself rather than a path.

    Raises ``BundleError`` (``DumpFileError`` for dumps) when it cannot be read.
    """
    from .analysis.analyse import analyse
    from .capture.dumps.dumpfile import evidence_from_bytes, load_evidence

    if isinstance(source, str) and is_text(source):
        snapshot = evidence_from_bytes(source.encode("utf-8", "replace"), _TEXT_NAME)
    elif isinstance(source, str | os.PathLike):
        snapshot = load_evidence(os.fspath(source))
    else:
        raise UsageError(
            f"{shown(source)} is neither a path nor the text of a dump or snapshot",
            help="Pass a str or pathlib.Path; decode bytes first (gzip: pass the file's path).",
        )
    return Report(snapshot, analyse(snapshot))


def report_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the ``--json`` report and of the error object
    (``SCHEMA_PATH``)."""
    loaded: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return loaded


def is_text(source: str) -> bool:
    """Whether ``analyze`` reads ``source`` as content (a line break, or JSON's first
    character) rather than as a path."""
    return "\n" in source or source.lstrip("\ufeff \t\r").startswith(("{", "["))


# ----------------------------------------------------- options, checked as the CLI checks them


def capture_options(
    window: float, interval: float, max_window: float, native: bool, timeout: float, include: Sequence[str]
) -> CaptureOptions:
    """The sampling options, each checked against the range its ``hangdoc diagnose``
    option accepts (``hangdoc.cliargs``); ``UsageError`` naming the keyword."""
    import argparse

    from .cliargs import DUMP_TIMEOUT_SECONDS, INTERVAL_SECONDS, WINDOW_SECONDS, include_word
    from .model import MAX_INCLUDE
    from .pipeline import CaptureOptions

    window = _seconds("window", window, WINDOW_SECONDS)
    interval = _seconds("interval", interval, INTERVAL_SECONDS)
    max_window = _seconds("max_window", max_window, WINDOW_SECONDS)
    timeout = _seconds("timeout", timeout, DUMP_TIMEOUT_SECONDS)
    if max_window < window:
        raise UsageError(f"need max_window >= window (got {max_window:g} < {window:g})", help=_HELP)
    words = _strings("include", include)
    if len(words) > MAX_INCLUDE:
        raise UsageError(f"at most {MAX_INCLUDE} include words (got {len(words)})", help=_HELP)
    for word in words:
        try:
            include_word(word)
        except argparse.ArgumentTypeError as err:
            raise UsageError(f"include: {err}", help=_HELP) from None
    return CaptureOptions(window, interval, max_window, bool(native), timeout, words)


def _seconds(name: str, value: object, bounds: tuple[float, float]) -> float:
    lo, hi = bounds
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UsageError(f"{name}={shown(value)} is not a number of seconds from {lo:g} to {hi:g}", help=_HELP)
    if not lo <= value <= hi:
        raise UsageError(f"{name}={value:g} is not from {lo:g} to {hi:g} seconds", help=_HELP)
    return float(value)


def _strings(name: str, value: object) -> tuple[str, ...]:
    """A sequence of strings (a lone ``str`` is refused: it is not a list of words)."""
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{name}={shown(value)} is not a list of strings", help=_HELP)
    return tuple(value)


def _path(name: str, value: StrPath | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike):
        raise UsageError(f"{name}={shown(value)} is not a path", help=_HELP)
    return os.fspath(value)


def remote_nodes(
    agents: str | Sequence[str] | None,
    hostfile: StrPath | None,
    token_file: StrPath | None,
    tls_cert: StrPath | None,
    tls_key: StrPath | None,
    tls_ca: StrPath | None,
) -> list[RemoteNode] | None:
    """The agents to ask (``--agents``/``--hostfile``), with their authentication; None
    when none is named: this node is read."""
    if agents is None and hostfile is None:
        return None
    import argparse

    from .cliargs import agent_list
    from .fleet.client import named_agents

    listed = None
    if agents is not None:
        listed = agents if isinstance(agents, str) else ",".join(_strings("agents", agents))
        try:
            agent_list(listed)
        except argparse.ArgumentTypeError as err:
            raise UsageError(f"agents: {err}", help=_HELP) from None
    nodes = named_agents(
        listed,
        _path("hostfile", hostfile),
        _path("token_file", token_file),
        _path("tls_cert", tls_cert),
        _path("tls_key", tls_key),
        _path("tls_ca", tls_ca),
    )
    if not nodes:
        raise UsageError("agents/hostfile named no agent", help=_HELP)
    return nodes


def ray_source(
    spec: str, with_agents: bool, address: str | None, workers: Sequence[str], keep_agents: bool
) -> FleetSource | None:
    """For a ``ray:`` job, where its ranks come from: agents Ray places on the cluster's
    nodes. The Ray options are refused for any other job, and agents for a Ray job."""
    from .capture.find.jobspec import JobKind, parse_job_spec

    patterns = _strings("workers", workers)
    if parse_job_spec(spec).kind is not JobKind.RAY:
        if address or patterns or keep_agents:
            raise UsageError("ray_address/workers/keep_agents are for ray:JOB jobs", help=_HELP)
        return None
    if with_agents:
        raise UsageError("a ray: job places its own agents; leave out agents/hostfile", help=_HELP)
    from .capture.find.ray_workers import parse_patterns
    from .ray import RayOptions, fleet_source

    return fleet_source(RayOptions(address, parse_patterns(",".join(patterns)), keep_agents))
