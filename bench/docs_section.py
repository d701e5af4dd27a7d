"""Write one benchmark's section of docs/benchmarks.md, leaving the other sections as they are."""

from __future__ import annotations

from pathlib import Path


def write_section(path: Path, heading: str, text: str) -> None:
    """Replace the section that starts with ``heading`` (or append it) in ``path``.

    ``text`` is the whole section, heading line included. Sections are the file's ``## ``
    headings; the ``# Benchmarks`` title is kept or created.
    """
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    head, found, tail = old.partition(heading)
    after = ""
    if found and "\n## " in tail:
        after = "\n## " + tail.split("\n## ", 1)[1]
    elif not found:
        head, after = old, ""
    path.write_text(head.rstrip("\n") + "\n\n" + text.strip("\n") + "\n" + after)
