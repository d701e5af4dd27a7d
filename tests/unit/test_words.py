"""No ``rank(s)``, ``process(es)``: a count is written with its noun in the right number
(``hangdoc.model.counted``: ``1 rank``, ``4 ranks``), in every string of the package (its
messages, errors, notes, report sentences, and the docstrings that quote them) and in the
docs. ``http(s)`` is a URL's two schemes, not a count."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from support.paths import REPO

from hangdoc.model import counted

HEDGED = re.compile(r"\w\((?:s|es)\)")
SCHEMES = re.compile(r"https?\(s\)", re.IGNORECASE)
MODULES = sorted((REPO / "hangdoc").rglob("*.py"))
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])


def hedged(text: str) -> list[str]:
    return HEDGED.findall(SCHEMES.sub("", text))


def strings(path: Path) -> list[tuple[int, str]]:
    """Each string literal of a module with its line, f-strings' literal parts included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_the_pattern_finds_what_it_should() -> None:
    assert hedged("3 rank(s) of 4") == ["k(s)"]
    assert hedged("1 process(es) left") == ["s(es)"]
    assert hedged("an http(s) URL, HTTP(S)://HOST:PORT, f(x), ranks (see below)") == []


def test_counted_says_one_and_many() -> None:
    assert counted(1, "rank") == "1 rank"
    assert counted(0, "rank") == "0 ranks"
    assert counted(1024, "process", "processes") == "1,024 processes"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_hedged_plural_in_the_package(path: Path) -> None:
    found = [(line, text) for line, text in strings(path) if hedged(text)]
    assert found == [], f"write the count with hangdoc.model.counted: {found}"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_hedged_plural_in_the_docs(path: Path) -> None:
    found = [
        (n, line.strip()) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if hedged(line)
    ]
    assert found == [], found
