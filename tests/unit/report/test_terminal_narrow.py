"""The terminal report in a narrow terminal (80 columns, as ``COLUMNS=80``): the marks of the
culprit branch are never broken over two lines, and the rank table loses no text to "…".
Rendered from a real recording of the demo job (``make demo``)."""

from __future__ import annotations

from io import StringIO

import pytest
from rich.console import Console
from support.paths import TESTS

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot
from hangdoc.report.terminal import render

MARK = "◀ outlier, culprit"


def _rendered(width: int) -> list[str]:
    snapshot = load_snapshot(TESTS / "data" / "demo_mismatch.json.gz")
    console = Console(file=StringIO(), width=width, color_system=None)
    render(analyse(snapshot), snapshot, console)
    return [line.rstrip() for line in console.file.getvalue().splitlines()]


def _table(lines: list[str]) -> list[str]:
    start = next(i for i, line in enumerate(lines) if line.startswith("rank ┃"))
    end = lines.index("", start)
    return lines[start:end]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("width", [80, 100, 160])
def test_marks_stay_whole_and_the_table_loses_nothing(width: int) -> None:
    lines = _rendered(width)
    assert all(len(line) <= width for line in lines)
    marked = [line for line in lines if "◀" in line]
    assert len(marked) == 1 and marked[0].endswith(MARK), marked
    assert not any(line.strip() in ("culprit", "outlier,") for line in lines)
    table = _table(lines)
    assert not any("…" in line for line in table), table
    assert table[0].split("┃")[-1].strip() == "call site"  # the detail only repeated op and site
    assert [row.split("│")[-1].strip() for row in table[2:6]] == ["demo_train.py:30"] * 3 + ["demo_train.py:24"]


@pytest.mark.timeout(30)
def test_the_mark_ends_the_first_line_where_it_fits() -> None:
    wide = _rendered(160)
    first = next(line for line in wide if "── [3] " in line)
    assert first.endswith("main (demo_train.py:50)  losses = gather_metrics(loss)  " + MARK)
    narrow = _rendered(80)
    at = next(i for i, line in enumerate(narrow) if "── [3] " in line)
    assert narrow[at].endswith("[3] " + MARK)  # on a line of its own, above the frames
    assert narrow[at + 1].strip(" │") == "main (demo_train.py:50)  losses = gather_metrics(loss)"
