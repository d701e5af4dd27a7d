"""Source lines around the job's frames, read on the node at capture time.

Capture keeps, for every Python frame of the job's own code and of its libraries (not the
standard library's or torch's: ``keeps_source``), the lines of its function up to the
current line (``collect_sources``), read as the traced process could read them
(``sourcefs``). Analysis asks its questions of those lines offline
(``hangdoc.analysis.source_lines``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ...model import MAX_LINES_BEFORE, Frame, Origin, SourceFile, frame_origin
from .sourcefs import SourceReader

# torch's and the standard library's own code is recognised by module path and function
# name; the job's and its libraries' code is read (a library's ``finally:`` is cleanup too)
_READ = (Origin.USER, Origin.LIBRARY)
_DEF = re.compile(r"^\s*(async\s+def|def|class)\s")


def keeps_source(filename: str) -> bool:
    """A file worth keeping source for: the job's own or an installed library's, not
    torch's or the standard library's."""
    return frame_origin(filename).kind in _READ


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
        if frame.native or not frame.line or not keeps_source(frame.filename):
            continue
        lines = per_file.setdefault(frame.filename, {})
        if frame.line in lines:
            continue
        lines.update(read_function_lines(reader, frame.filename, frame.line))
    return tuple(SourceFile(name, tuple(sorted(lines.items()))) for name, lines in sorted(per_file.items()) if lines)


def merge_sources(parts: Iterable[Iterable[SourceFile]]) -> tuple[SourceFile, ...]:
    """SourceFiles of several reads merged per file name, sorted."""
    per_file: dict[str, dict[int, str]] = {}
    for part in parts:
        for src in part:
            per_file.setdefault(src.filename, {}).update(src.lines)
    return tuple(SourceFile(name, tuple(sorted(lines.items()))) for name, lines in sorted(per_file.items()))
