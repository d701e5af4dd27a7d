"""The hang directory the watchdog writes, when the job's names look like rich markup
(issue 23, item 5) and when one of its reporters fails: what can be written is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.hostile import FUNCTION, NAMES, THREAD, hostile
from support.said import Said

from hangdoc.watch import incident
from hangdoc.watch.config import Level
from hangdoc.watch.incident import HTML, HUMAN, REPORT, SNAPSHOT, write_incident
from hangdoc.watch.stall import Signal, Trigger

TRIGGER = Trigger(Signal.OUTPUT, 5.0, 3.0, "--stall-after", 1.0, 3, None, "2025-01-01T00:00:00Z")


def test_the_summary_quotes_the_job_s_names_as_they_are(tmp_path: Path) -> None:
    diagnosis, snap = hostile()
    said = Said()
    where = write_incident(
        tmp_path, snap, diagnosis, TRIGGER, f"confirmed by diagnosis: {diagnosis.summary}", warn=said
    )
    assert where is not None and said == []
    text = (where / HUMAN).read_text()
    first = " ".join(text.split("\n\n")[0].split())  # the watchdog's reason, wrapped at 120 columns
    assert first.startswith("hangdoc watch fired at 2025-01-01T00:00:00Z: no output for 5.0 s")
    for name in NAMES:
        assert name in first, name
        assert name in text
    assert f"{FUNCTION} ({THREAD}.py:5)" in text
    report = json.loads((where / REPORT).read_text())
    assert report["summary"] == diagnosis.summary
    assert diagnosis.summary in report["watch"]["fired_because"]
    assert (where / HTML).stat().st_size > 0 and (where / SNAPSHOT).stat().st_size > 0


def test_a_reporter_that_fails_costs_its_file_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object) -> bytes:
        raise RuntimeError("a bug in the text report")

    monkeypatch.setattr(incident, "human_report", broken)
    diagnosis, snap = hostile()
    said = Said()
    where = write_incident(tmp_path, snap, diagnosis, TRIGGER, "confirmed", warn=said)
    assert where is not None
    assert sorted(p.name for p in where.iterdir()) == sorted([REPORT, SNAPSHOT, HTML])
    assert json.loads((where / REPORT).read_text())["verdict"] == "straggler"
    ((level, line),) = said
    assert level is Level.ERROR
    assert line.startswith(
        "internal error: report.txt left out of the report: RuntimeError: a bug in the text report (test_incident.py:"
    )
