"""Names a job chooses never reach rich as markup (issue 23, item 5): a function named
``[/]x`` or a thread ``reader[/dev/sda]`` prints as it is, and nothing raises.

Two guarantees, each checked here: the reporters hand rich only ``Text`` (the terminal
report renders the same through a console that reads markup), and every console hangdoc
makes is a ``PlainConsole``, which reads no markup in a ``str`` either (a scan of the
sources: no other ``Console`` made or subclassed, no markup parsed on purpose).
"""

from __future__ import annotations

import ast
from io import StringIO

import pytest
from rich.console import Console
from support.hostile import EMOJI, FUNCTION, LINK, NAMES, STYLE, THREAD, hostile
from support.paths import REPO

from hangdoc.analysis.analyse import analyse
from hangdoc.model import Diagnosis, JobSnapshot
from hangdoc.report.console import PlainConsole
from hangdoc.report.terminal import render

PACKAGE = REPO / "hangdoc"


def _rendered(console: Console, diagnosis: Diagnosis, snapshot: JobSnapshot) -> str:
    render(diagnosis, snapshot, console)
    assert isinstance(console.file, StringIO)
    return console.file.getvalue()


@pytest.mark.parametrize(
    "console",
    [
        lambda: PlainConsole(StringIO(), width=200, no_color=True),
        lambda: Console(file=StringIO(), width=200, color_system=None),  # one that reads markup in a str
    ],
    ids=["plain", "markup"],
)
def test_job_names_print_as_they_are(console) -> None:
    diagnosis, snap = hostile()
    out = _rendered(console(), diagnosis, snap)
    for name in NAMES:
        assert name in out, name
    assert f"{FUNCTION} ({THREAD}.py:5)" in out  # the tree, as the frame is
    assert f"{STYLE}:7420: refused {FUNCTION}" in out  # unreachable agent
    assert "👍" not in out


def test_the_analysis_of_such_a_job_prints_too() -> None:
    """The analysis' own sentences of the job: a culprit blocked in ``[/]x`` while its thread
    ``reader[/dev/sda]`` waits."""
    _, snap = hostile()
    out = _rendered(Console(file=StringIO(), width=200, color_system=None), analyse(snap), snap)
    assert FUNCTION in out and f"'{THREAD}'" in out


def test_a_plain_console_prints_a_str_as_it_is() -> None:
    console = PlainConsole(StringIO(), width=200)
    console.print(f"{FUNCTION} {THREAD} {STYLE}x[/] {LINK}y[/link] {EMOJI}")
    assert console.file.getvalue() == f"{FUNCTION} {THREAD} {STYLE}x[/] {LINK}y[/link] {EMOJI}\n"


def test_a_plain_console_leaves_a_closed_pipe_to_the_caller_when_asked() -> None:
    with pytest.raises(BrokenPipeError):
        PlainConsole(StringIO(), pipe_errors=True).on_broken_pipe()


# ------------------------------------------------------------------ the source scan


def _sources() -> list[tuple[str, ast.Module]]:
    return [
        (str(p.relative_to(REPO)), ast.parse(p.read_text(), str(p)))
        for p in sorted(PACKAGE.rglob("*.py"))
        if "fleet/v1" not in str(p)
    ]  # generated gRPC code


def _name(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def test_hangdoc_makes_no_console_but_a_plain_one() -> None:
    found = []
    for path, tree in _sources():
        if path == "hangdoc/report/console.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node.func) == "Console":
                found.append(f"{path}:{node.lineno}: Console(...): make a PlainConsole")
            if isinstance(node, ast.ClassDef) and any(_name(b) == "Console" for b in node.bases):
                found.append(f"{path}:{node.lineno}: a Console subclass: subclass PlainConsole")
            if isinstance(node, ast.Attribute) and node.attr in ("from_markup", "render_markup"):
                found.append(f"{path}:{node.lineno}: {node.attr}: build Text instead")
            if (
                isinstance(node, ast.keyword)
                and node.arg in ("markup", "emoji")
                and not (isinstance(node.value, ast.Constant) and node.value.value is False)
            ):
                found.append(f"{path}:{node.lineno}: {node.arg}= turned on")
            if (
                isinstance(node, ast.ImportFrom)
                and node.module in ("rich", "rich.markup")
                and any(a.name in ("print", "render") for a in node.names)
            ):
                found.append(f"{path}:{node.lineno}: rich's markup-reading print/render")
    assert found == []
