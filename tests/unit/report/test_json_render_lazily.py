"""``render_json`` makes each rank's entry as its line is written (a million ranks' entries
held at once took 1.4 GB): its text is ``dumps(to_json_dict(...))`` exactly."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest
from support.paths import REPO

from hangdoc.analysis.analyse import analyse
from hangdoc.report import json_report
from hangdoc.report.json_report import dumps, render_json, to_json_dict

sys.path.insert(0, str(REPO / "bench"))
from synthetic import SCENARIOS, synthetic_snapshot


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_text_is_the_dicts(scenario: str) -> None:
    snapshot = synthetic_snapshot(48, scenario)
    diagnosis = analyse(snapshot)
    assert render_json(diagnosis, snapshot) == dumps(to_json_dict(diagnosis, snapshot))


def test_terminal_hostile_text_is_escaped_as_before() -> None:
    snapshot = synthetic_snapshot(24)
    rank = snapshot.ranks[3]
    sample = rank.samples[-1]
    thread = dataclasses.replace(sample.threads[0], name="main\x1b[2J\u202e\x7f")
    sample = dataclasses.replace(sample, threads=(thread, *sample.threads[1:]))
    rank = dataclasses.replace(rank, samples=(*rank.samples[:-1], sample))
    snapshot = dataclasses.replace(snapshot, ranks=(*snapshot.ranks[:3], rank, *snapshot.ranks[4:]))
    diagnosis = analyse(snapshot)
    text = render_json(diagnosis, snapshot)
    assert text == dumps(to_json_dict(diagnosis, snapshot))
    assert "\x1b" not in text and "\\u001b[2J\\u202e\\u007f" in text


def test_a_value_the_line_encoder_refuses_falls_back_to_dumps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN or an infinity (the C encoder raises ValueError): the text ``dumps`` writes."""
    snapshot = synthetic_snapshot(24)
    diagnosis = analyse(snapshot)
    expected = dumps(to_json_dict(diagnosis, snapshot))

    def refuses(*args: Any) -> None:
        raise ValueError("Out of range float values are not JSON compliant")

    monkeypatch.setattr(json_report, "_layout_into", refuses)
    assert render_json(diagnosis, snapshot) == expected


def test_no_ranks_is_an_empty_list() -> None:
    snapshot = synthetic_snapshot(24)
    diagnosis = dataclasses.replace(analyse(snapshot), ranks=())
    text = render_json(diagnosis, snapshot)
    assert text == dumps(to_json_dict(diagnosis, snapshot)) and '"ranks": []' in text
