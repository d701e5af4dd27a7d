"""Questions analysis asks of the source lines capture kept (``SourceFile``).

Is this line inside a ``finally:``/``except`` block of its function (``enclosing_block``)?
Which call issued the async work a ``.wait()`` waits for (``issuing_call``)? Indentation is
enough for both, and works on the fragments capture keeps, where ``ast`` would not. Both
read a file's lines as a ``{line number: text}`` mapping; a ``SourceIndex`` finds a file's
by name and builds that mapping once per analysis.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ..model import MAX_LINES_BEFORE, Frame, SourceFile

Lines = Mapping[int, str]  # a file's captured lines: line number -> text


class SourceIndex:
    """A snapshot's source files by file name, each one's lines as a ``Lines`` mapping built
    the first time it is asked for: one per analysis, so that a lookup costs a dict access
    whatever the number of files and ranks. Where two files share a name, the first counts
    (as ``JobSnapshot.source``)."""

    def __init__(self, sources: Iterable[SourceFile] = (), whole_stacks: bool = True) -> None:
        # False where the snapshot's stacks may have been cut by a person (pasted text):
        # what a stack's outermost frame says is then not read
        self.whole_stacks = whole_stacks
        self._files: dict[str, SourceFile] = {}
        for src in sources:
            self._files.setdefault(src.filename, src)
        self._lines: dict[str, Lines] = {}

    def lines(self, filename: str) -> Lines | None:
        """The captured lines of ``filename``, or None when capture kept none."""
        lines = self._lines.get(filename)
        if lines is None:
            src = self._files.get(filename)
            if src is None:
                return None
            lines = self._lines[filename] = dict(src.lines)
        return lines


_DEF = re.compile(r"^\s*(async\s+def|def|class)\s")


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())


def enclosing_block(lines: Lines | None, lineno: int) -> str | None:
    """``"finally"`` or ``"except"`` when ``lineno`` sits in such a block of its function."""
    if lines is None:
        return None
    current = lines.get(lineno)
    if current is None:
        return None
    level = _indent(current)
    for n in range(lineno - 1, lineno - MAX_LINES_BEFORE, -1):
        text = lines.get(n)
        if text is None:
            return None
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        ind = _indent(text)
        if ind >= level:
            continue
        level = ind
        if _DEF.match(text):
            return None
        head = text.strip()
        if head.startswith("finally") and head.rstrip().endswith(":"):
            return "finally"
        if head.startswith("except") and head.rstrip().endswith(":"):
            return "except"
    return None


_ASYNC_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(.*async_op\s*=\s*True")
_ASYNC_P2P = re.compile(r"\b(isend|irecv|batch_isend_irecv)\s*\(")
_ASSIGN = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*=")
_WAIT_ON = re.compile(r"([A-Za-z_][\w.\[\]]*)\s*\.\s*wait\s*\(")


def waited_name(code: str | None) -> str | None:
    """``work`` in ``work.wait()``; None when the line waits on nothing visible."""
    if not code:
        return None
    m = _WAIT_ON.search(code)
    return m.group(1) if m else None


def issuing_call(lines: Lines | None, frame: Frame) -> tuple[str, int] | None:
    """(collective name, line) of the async call whose handle ``frame``'s line waits on.

    Looks backwards in the function for ``x = dist.all_reduce(..., async_op=True)``,
    ``x = dist.isend(...)``; prefers the assignment to the waited-on name.
    """
    if lines is None or frame.line is None:
        return None
    waited = waited_name(lines.get(frame.line) or frame.code)
    fallback: tuple[str, int] | None = None
    for n in range(frame.line - 1, frame.line - MAX_LINES_BEFORE, -1):
        text = lines.get(n)
        if text is None:
            break
        m = _ASYNC_CALL.search(text) or _ASYNC_P2P.search(text)
        if not m:
            continue
        name = m.group(1).rsplit(".", 1)[-1]
        assigned = _ASSIGN.match(text)
        if waited and assigned and assigned.group(1) == waited.split("[")[0]:
            return name, n
        if fallback is None:
            fallback = (name, n)
    return fallback
