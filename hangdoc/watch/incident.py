"""What ``hangdoc watch`` leaves behind when it fires: ``OUT/hang-<UTC>/``.

``report.json`` (written last, atomically) is the ``--json`` report (docs/json-schema.md) with one more key,
``watch``, saying why the watchdog fired; ``snapshot.json.gz`` replays with ``hangdoc
analyze``; ``report.txt`` is the terminal report, preceded by the watchdog's reason;
``report.html`` the shareable report with the merged tree to explore (``--html``).

A report is never lost: when ``OUT`` cannot take it (disk full, directory made read-only
or replaced after the start), ``report.json`` is printed on stderr and the files go to a
private ``hangdoc-hang-<UTC>-<pid>`` directory under ``$TMPDIR`` or ``/tmp``.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..bundle import snapshot_bytes
from ..errors import UsageError, described, printable
from ..model import Diagnosis, JobSnapshot
from ..outfiles import write_new_dir
from .config import Level, Say
from .stall import Trigger

REPORT = "report.json"
SNAPSHOT = "snapshot.json.gz"
HUMAN = "report.txt"
HTML = "report.html"


def _stderr(_level: Level, message: str) -> None:
    print(f"hangdoc watch: {message}", file=sys.stderr, flush=True)


def trigger_dict(trigger: Trigger, reason: str, diagnosis_seconds: float | None = None) -> dict[str, Any]:
    d = dataclasses.asdict(trigger)
    d["signal"] = trigger.signal.value
    d["details"] = list(trigger.details)
    d["fired_because"] = f"{trigger.sentence()}; {reason}"
    d["diagnosis_seconds"] = None if diagnosis_seconds is None else round(diagnosis_seconds, 3)
    return d


def check_out(out: Path) -> None:
    """Refuse an ``--out`` that cannot take a report, before anything is started: create
    the directory and a trial file in it (removed again)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, trial = tempfile.mkstemp(prefix=".hangdoc-trial-", dir=out)
        os.close(fd)
        os.unlink(trial)
    except OSError as err:
        raise UsageError(
            f"--out {out}: cannot write reports there: {_reason(err)}",
            help="Give --out a directory this user can create and write.",
        ) from None


def new_dir(out: Path, when: datetime.datetime, files: Mapping[str, bytes]) -> Path:
    """A fresh ``hang-YYYYmmddTHHMMSSZ`` directory under ``out`` (suffixed if taken), private
    (0700: the files hold source lines), with ``files`` (0600) written in it in their order,
    through its descriptor and never through a link (``hangdoc.outfiles``)."""
    stamp = when.astimezone(datetime.UTC).strftime("hang-%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    return write_new_dir(out, stamp, files)


def write_incident(
    out: Path,
    snapshot: JobSnapshot,
    diagnosis: Diagnosis,
    trigger: Trigger,
    reason: str,
    diagnosis_seconds: float | None = None,
    warn: Say = _stderr,
) -> Path | None:
    """Write the four files; returns the directory (``OUT``'s or the fallback), or None
    when no directory could take them (the report is then only on stderr). A file that
    fails to be made (a bug in its reporter) is left out, said in one line through
    ``warn``; the others, ``report.json`` last, are written all the same."""
    from ..report.html import render_html
    from ..report.json_report import to_json_dict

    report = to_json_dict(diagnosis, snapshot)
    report["watch"] = trigger_dict(trigger, reason, diagnosis_seconds)
    makers: dict[str, Callable[[], bytes]] = {
        SNAPSHOT: lambda: snapshot_bytes(snapshot, compress=True),
        HUMAN: lambda: human_report(diagnosis, snapshot, trigger, report["watch"]["fired_because"]),
        HTML: lambda: render_html(diagnosis, snapshot).encode("utf-8", "backslashreplace"),
    }
    files = {}
    for name, make in makers.items():
        try:
            files[name] = make()
        except Exception as err:  # noqa: BLE001 - a bug in one reporter must not cost the report
            warn(Level.ERROR, f"internal error: {name} left out of the report: {described(err)}")
    return _store(out, files, report, warn)


def human_report(diagnosis: Diagnosis, snapshot: JobSnapshot, trigger: Trigger, fired_because: str) -> bytes:
    """``report.txt``: the watchdog's reason, then the terminal report, at 120 columns
    without colour. Every word from the job is printed as it is (``PlainConsole``)."""
    from rich.text import Text

    from ..report.console import PlainConsole
    from ..report.terminal import render

    text = io.StringIO()
    console = PlainConsole(text, width=120, no_color=True, force_terminal=False)
    console.print(Text(printable(f"hangdoc watch fired at {trigger.detected_at}: {fired_because}")))
    console.print()
    render(diagnosis, snapshot, console)
    return text.getvalue().encode()


def write_failed_incident(
    out: Path, spec: str, trigger: Trigger, error: str, help_text: str, warn: Say = _stderr
) -> Path | None:
    """The job went silent but could not be diagnosed: the reason and the error, as a
    report with verdict ``unknown`` so scripts reading ``report.json`` still work."""
    from ..report.json_report import undiagnosed_to_json_dict

    report = undiagnosed_to_json_dict(
        spec, error, help_text, noticed=trigger.sentence(), captured_at=trigger.detected_at
    )
    report["watch"] = trigger_dict(trigger, f"diagnosis failed: {error}")
    text = (
        f"hangdoc watch fired at {trigger.detected_at}: {report['watch']['fired_because']}\n"
        f"{report['summary']}\n" + (f"help: {help_text}\n" if help_text else "")
    )
    return _store(out, {HUMAN: text.encode()}, report, warn)


def _store(out: Path, files: dict[str, bytes], report: dict[str, Any], warn: Say) -> Path | None:
    """``files`` then ``report.json`` into a new directory under ``out``; when that fails,
    the report on stderr and everything in a private fallback directory."""
    when = datetime.datetime.now(datetime.UTC)
    from ..report.json_report import dumps

    body = (dumps(report) + "\n").encode()
    try:
        # report.json appears whole and last: whoever waits for it finds the rest in place
        return new_dir(out, when, {**files, REPORT: body})
    except OSError as err:
        warn(Level.ERROR, f"could not write report to {out}: {_reason(err)}; report follows on stderr")
    try:
        sys.stderr.write(body.decode())
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # no stderr either: the fallback directory is all there is
    try:
        return _write_private(when, {**files, REPORT: body})
    except OSError as err:
        warn(Level.ERROR, f"could not write the report to {_fallback_base()} either: {_reason(err)}")
        return None


def _fallback_base() -> Path:
    return Path(os.environ.get("TMPDIR") or "/tmp")


def _write_private(when: datetime.datetime, files: dict[str, bytes]) -> Path:
    """``files`` in a new ``hangdoc-hang-<UTC>-<pid>`` directory of mode 0700 under
    ``$TMPDIR`` or ``/tmp``. ``mkdir`` fails on any existing name, a planted symlink
    included, and every file is created exclusively without following links: in a
    world-writable directory nobody can redirect what is written (``hangdoc.outfiles``)."""
    stamp = f"hangdoc-hang-{when.astimezone(datetime.UTC):%Y%m%dT%H%M%SZ}-{os.getpid()}"
    return write_new_dir(_fallback_base(), stamp, files, tries=99)


def _reason(err: OSError) -> str:
    if isinstance(err, NotADirectoryError) or (isinstance(err, FileExistsError) and err.strerror):
        return "not a directory"  # a file where a directory should be, or on its path
    return err.strerror or str(err)
