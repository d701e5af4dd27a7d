"""``render_json`` makes each rank's entry as its line is written (a million ranks' entries
held at once took 1.4 GB): its text is ``dumps(to_json_dict(...))`` exactly."""

from __future__ import annotations

import dataclasses
import math
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


@pytest.mark.parametrize(
    "value",
    [
        {"a": 1.0, "ranks": [{"t": math.nan}, {"t": 2.5}], "b": [math.inf, {"c": -math.inf}]},
        {"nan": math.nan, "list": [1, 2, math.nan]},
    ],
)
def test_a_nan_or_an_infinity_is_null_line_by_line_as_dumps_writes_it(value: Any) -> None:
    """The C encoder refuses them; each line that holds one is written again with null,
    so text already given to the output stays right."""
    parts: list[str] = []
    json_report._layout_into(parts, value, "  ", 0)
    assert "".join(parts) == dumps(value)
    assert "NaN" not in dumps(value) and "Infinity" not in dumps(value)


@pytest.mark.parametrize("piece", [1, 3, 8_192])
def test_written_in_pieces_the_text_is_the_same(monkeypatch: pytest.MonkeyPatch, piece: int) -> None:
    """``write_json`` (what ``analyze --json`` prints) never holds the whole text."""
    snapshot = synthetic_snapshot(96, "straggler")
    diagnosis = analyse(snapshot)
    monkeypatch.setattr(json_report, "_PIECE", piece)
    pieces: list[str] = []
    json_report.write_json(diagnosis, snapshot, pieces.append)
    assert "".join(pieces) == render_json(diagnosis, snapshot)
    # a piece ends between two items: at most _PIECE parts each, so small ones are many
    assert len(pieces) > (96 // piece if piece < 96 else 0)


def test_no_ranks_is_an_empty_list() -> None:
    snapshot = synthetic_snapshot(24)
    diagnosis = dataclasses.replace(analyse(snapshot), ranks=())
    text = render_json(diagnosis, snapshot)
    assert text == dumps(to_json_dict(diagnosis, snapshot)) and '"ranks": []' in text
