"""What ``hangdoc watch`` leaves behind when it fires: ``OUT/hang-<UTC>/``.

``report.json`` (written last, atomically) is the ``--json`` report (docs/json-schema.md) with one more key,
``watch``, saying why the watchdog fired; ``snapshot.json.gz`` replays with ``hangdoc
analyze``; ``report.txt`` is the terminal report, preceded by the watchdog's reason.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import json
from pathlib import Path
from typing import Any

from .bundle import save_snapshot
from .model import Diagnosis, JobSnapshot, Verdict
from .stall import Trigger

REPORT = "report.json"
SNAPSHOT = "snapshot.json.gz"
HUMAN = "report.txt"


def trigger_dict(trigger: Trigger, reason: str, diagnosis_seconds: float | None = None) -> dict[str, Any]:
    d = dataclasses.asdict(trigger)
    d["signal"] = trigger.signal.value
    d["details"] = list(trigger.details)
    d["fired_because"] = f"{trigger.sentence()}; {reason}"
    d["diagnosis_seconds"] = None if diagnosis_seconds is None else round(diagnosis_seconds, 3)
    return d


def new_dir(out: Path, when: datetime.datetime) -> Path:
    """A fresh ``hang-YYYYmmddTHHMMSSZ`` directory under ``out`` (suffixed if taken)."""
    stamp = when.astimezone(datetime.UTC).strftime("hang-%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = out / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"too many reports named {stamp} in {out}")


def write_incident(out: Path, snapshot: JobSnapshot, diagnosis: Diagnosis, trigger: Trigger, reason: str,
                   diagnosis_seconds: float | None = None) -> Path:
    """Write the three files; returns the directory."""
    from rich.console import Console

    from .report.json_report import to_json_dict
    from .report.terminal import render

    path = new_dir(out, datetime.datetime.now(datetime.UTC))
    report = to_json_dict(diagnosis, snapshot)
    report["watch"] = trigger_dict(trigger, reason, diagnosis_seconds)
    save_snapshot(snapshot, path / SNAPSHOT)
    text = io.StringIO()
    console = Console(file=text, width=120, no_color=True, highlight=False, force_terminal=False)
    console.print(f"hangdoc watch fired at {trigger.detected_at}: {report['watch']['fired_because']}")
    console.print()
    render(diagnosis, snapshot, console)
    (path / HUMAN).write_text(text.getvalue())
    _write_last(path / REPORT, report)
    return path


def _write_last(target: Path, report: dict[str, Any]) -> None:
    """report.json appears whole and last: whoever waits for it finds the rest in place."""
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    tmp.rename(target)


def write_failed_incident(out: Path, spec: str, trigger: Trigger, error: str, help_text: str) -> Path:
    """The job went silent but could not be diagnosed: the reason and the error, as a
    report with verdict ``unknown`` so scripts reading ``report.json`` still work."""
    from .report.json_report import to_json_dict

    path = new_dir(out, datetime.datetime.now(datetime.UTC))
    nothing = Diagnosis(Verdict.UNKNOWN, (), f"the job stopped making progress but could not be diagnosed: {error}",
                        (trigger.sentence(), error), (help_text,) if help_text else (), (), (), partial=True)
    empty = JobSnapshot(spec, (), captured_at=trigger.detected_at, notes=(f"diagnosis failed: {error}",))
    report = to_json_dict(nothing, empty)
    report["watch"] = trigger_dict(trigger, f"diagnosis failed: {error}")
    (path / HUMAN).write_text(f"hangdoc watch fired at {trigger.detected_at}: {report['watch']['fired_because']}\n"
                              f"{report['summary']}\n" + (f"help: {help_text}\n" if help_text else ""))
    _write_last(path / REPORT, report)
    return path
