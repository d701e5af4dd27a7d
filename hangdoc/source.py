"""Source lines around user frames: read on the node at capture, read back by analysis.

Capture keeps, for every Python frame outside the interpreter's and torch's own files,
the lines of its function up to the current line (``collect_sources``). Analysis then asks
offline questions of those lines: is this line inside a ``finally:``/``except`` block
(``enclosing_block``), which call issued the async work this ``.wait()`` waits for
(``issuing_call``). Indentation is enough for both, and works on fragments where ``ast``
would not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .model import Frame, SourceFile
from .sourcefs import SourceReader

MAX_LINES_BEFORE = 80
_LIBRARY_MARKERS = ("/torch/", "/lib/python3.", "/site-packages/numpy/")
_DEF = re.compile(r"^\s*(async\s+def|def|class)\s")
_BLOCK = re.compile(r"^\s*(finally|except\b[^:]*|else|try|with\b.*|for\b.*|while\b.*|if\b.*|elif\b.*)\s*:")


def is_user_file(filename: str) -> bool:
    """A file worth keeping source for: not torch's, not the standard library's."""
    return not filename.startswith("<") and not any(m in filename for m in _LIBRARY_MARKERS)


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())


def read_function_lines(reader: SourceReader, filename: str, lineno: int) -> tuple[tuple[int, str], ...]:
    """The lines from the enclosing ``def`` (or MAX_LINES_BEFORE back) through ``lineno``."""
    current = reader.line(filename, lineno)
    if not current:
        return ()
    out = [(lineno, current)]
    base = _indent(current)
    for n in range(lineno - 1, max(0, lineno - MAX_LINES_BEFORE), -1):
        text = reader.line(filename, n) or ""
        out.append((n, text))
        if text.strip() and _DEF.match(text) and _indent(text) < base:
            break
    return tuple(sorted(out))


def collect_sources(reader: SourceReader, frames: Iterable[Frame]) -> tuple[SourceFile, ...]:
    """SourceFile entries for the user frames among ``frames`` (merged per file), read as the
    process behind ``reader`` could read them."""
    per_file: dict[str, dict[int, str]] = {}
    for frame in frames:
        if frame.native or not frame.line or not is_user_file(frame.filename):
            continue
        lines = per_file.setdefault(frame.filename, {})
        if frame.line in lines:
            continue
        lines.update(read_function_lines(reader, frame.filename, frame.line))
    return tuple(
        SourceFile(name, tuple(sorted(lines.items()))) for name, lines in sorted(per_file.items()) if lines
    )


def merge_sources(parts: Iterable[Iterable[SourceFile]]) -> tuple[SourceFile, ...]:
    """SourceFiles of several reads merged per file name, sorted."""
    per_file: dict[str, dict[int, str]] = {}
    for part in parts:
        for src in part:
            per_file.setdefault(src.filename, {}).update(src.lines)
    return tuple(SourceFile(name, tuple(sorted(lines.items()))) for name, lines in sorted(per_file.items()))


def enclosing_block(src: SourceFile | None, lineno: int) -> str | None:
    """``"finally"`` or ``"except"`` when ``lineno`` sits in such a block of its function."""
    if src is None:
        return None
    lines = dict(src.lines)
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


def issuing_call(src: SourceFile | None, frame: Frame) -> tuple[str, int] | None:
    """(collective name, line) of the async call whose handle ``frame``'s line waits on.

    Looks backwards in the function for ``x = dist.all_reduce(..., async_op=True)``,
    ``x = dist.isend(...)``; prefers the assignment to the waited-on name.
    """
    if src is None or frame.line is None:
        return None
    lines = dict(src.lines)
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
