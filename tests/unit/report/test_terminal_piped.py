"""The terminal report where stdout is no terminal (``| tee``, a CI log, a file): not wrapped
at a width rich guessed, no line ending in spaces, the merged tree whole; with a width
(``--width``, ``COLUMNS``), no line wider. On a terminal, wrapped at its width as before.
Rendered from recordings of real jobs through ``PlainConsole``, the console the CLI prints on."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from rich.cells import cell_len
from support.paths import TESTS

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot
from hangdoc.cli import main
from hangdoc.model import Diagnosis, JobSnapshot, RankState, Verdict
from hangdoc.report.console import PlainConsole
from hangdoc.report.terminal import render

DEMO = TESTS / "data" / "demo_mismatch.json.gz"
RECORDED = [
    DEMO,
    TESTS / "data" / "bundles_v1" / "straggler_dead_prefetcher_metrics_thread.json.gz",
    TESTS / "snapshots" / "cleanup_finally_checkpoint.json.gz",
    TESTS / "snapshots" / "not_hung_uneven_slow_reader.json.gz",
]
MARK = "◀ outlier, culprit"
SGR = re.compile(r"\x1b\[[0-9;]*m")
# the demo's culprit branch, each frame on one line with its source line
DEMO_ROWS = [
    "main (demo_train.py:50)  losses = gather_metrics(loss)  " + MARK,
    "gather_metrics (demo_train.py:24)  dist.all_gather(gathered, loss.detach().reshape(1))",
    "torch.distributed.all_gather (torch/distributed/distributed_c10d.py:4287)",
]


class _Terminal(StringIO):
    def isatty(self) -> bool:
        return True


_analysed: dict[str, tuple[Diagnosis, JobSnapshot]] = {}


def _report(path: object, file: StringIO | None = None, width: int | None = None) -> list[str]:
    key = str(path)
    if key not in _analysed:
        snapshot = load_snapshot(key)
        _analysed[key] = analyse(snapshot), snapshot
    diagnosis, snapshot = _analysed[key]
    out = file if file is not None else StringIO()
    render(diagnosis, snapshot, PlainConsole(out, width=width, no_color=True))
    return out.getvalue().splitlines()


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name.split(".")[0])
def test_piped_the_report_is_not_wrapped_and_no_line_ends_in_a_space(path) -> None:
    lines = _report(path)
    assert [line for line in lines if line != line.rstrip()] == []
    wrapped = _report(path, width=80)
    assert len(lines) < len(wrapped)  # rich would have wrapped it at 80
    assert max(map(cell_len, lines)) > 80


def test_piped_the_tree_keeps_its_marks_and_source_lines_on_their_rows() -> None:
    lines = _report(DEMO)
    start = next(i for i, line in enumerate(lines) if "── [3] " in line)
    assert [line.split("── [3] ")[-1].lstrip(" │") for line in lines[start : start + 3]] == DEMO_ROWS
    assert not any(line.strip(" │") == MARK for line in lines)
    summary = "collective mismatch: rank 3 is in all_gather (demo_train.py:24) while ranks 0-2 are in all_reduce"
    assert lines[1].startswith(summary)  # the summary on one line


@pytest.mark.parametrize("width", [60, 100])
@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name.split(".")[0])
def test_piped_with_a_width_no_line_is_wider_nor_ends_in_a_space(path, width: int) -> None:
    lines = _report(path, width=width)
    assert [line for line in lines if cell_len(line) > width] == []
    assert [line for line in lines if line != line.rstrip()] == []
    marked = [line for line in lines if "◀" in line]
    assert all(line.rstrip().endswith(("◀ outlier, culprit", "◀ culprit", "◀ outlier")) for line in marked)


def test_piped_columns_in_the_environment_is_a_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "70")
    lines = _report(DEMO)
    assert max(map(cell_len, lines)) <= 70
    assert [line for line in lines if line != line.rstrip()] == []


def test_on_a_terminal_the_report_wraps_at_its_width_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    lines = [SGR.sub("", line) for line in _report(DEMO, _Terminal())]  # a terminal gets bold
    assert max(map(cell_len, lines)) <= 80
    assert lines == _report(DEMO, width=80)  # what a pipe shows with --width 80


def test_the_cli_report_into_a_pipe_is_not_wrapped(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(DEMO)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line != line.rstrip()] == []
    assert any(line.endswith(DEMO_ROWS[1]) for line in lines)
    assert main(["analyze", str(DEMO), "--width", "60"]) == 0
    assert max(map(cell_len, capsys.readouterr().out.splitlines())) <= 60


def test_a_job_that_is_not_hung_shows_no_rank_blocked() -> None:
    path = TESTS / "snapshots" / "not_hung_uneven_slow_reader.json.gz"
    lines = _report(path)
    diagnosis, _ = _analysed[str(path)]
    assert diagnosis.verdict is Verdict.NOT_HUNG
    assert any(ra.state is RankState.BLOCKED for ra in diagnosis.ranks)  # the fact stays
    table = lines[lines.index(next(line for line in lines if line.startswith("rank ┃"))) :]
    rows = [line.split("│")[3].strip() for line in table[2:] if "│" in line]
    assert rows == ["progressing", "progressing", "waiting"]
    assert "blocked" not in "\n".join(table)
