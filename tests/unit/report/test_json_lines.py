"""The JSON report's one-line entries: written by one C encoder made once, byte for byte as
``json.JSONEncoder.encode`` writes them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hangdoc.report import json_report
from hangdoc.report.json_report import _LINE, _line, dumps

VALUES: list[Any] = [
    0,
    -3,
    2.5,
    1e300,
    None,
    True,
    "",
    'é "quoted" \\ back',
    [],
    {},
    [1, "two", None, 3.0],
    {"rank": 7, "stack": ["a", "b"], "nested": {"x": [{"y": False}]}},
]


@pytest.mark.parametrize("value", VALUES)
def test_a_line_is_what_the_json_encoder_writes(value: Any) -> None:
    assert _line(value) == _LINE.encode(value)


def test_the_encoder_is_made_once_not_per_line(monkeypatch: pytest.MonkeyPatch) -> None:
    assert json_report._ONE_LINE is not None  # CPython has json's C encoder

    def refuse(*_: Any, **__: Any) -> str:
        raise AssertionError("a JSONEncoder per line: the 100k-rank report's slow path")

    monkeypatch.setattr(json.JSONEncoder, "encode", refuse)
    text = dumps({"ranks": [{"rank": r, "state": "waiting"} for r in range(3)]})
    assert text.splitlines()[2] == '    {"rank": 0, "state": "waiting"},'


def test_a_non_finite_float_still_becomes_null() -> None:
    assert json.loads(dumps({"ranks": [{"seconds": float("nan")}]})) == {"ranks": [{"seconds": None}]}
