"""``PlainConsole``: the one kind of rich ``Console`` hangdoc prints on.

Function, file and thread names, command lines and the sentences that quote them come from
the job, and a job may name a function ``[/]x`` or a thread ``reader[/dev/sda]``. A plain
console prints a ``str`` as it is: never read as markup (``[bold]``, ``[link=...]``, which
would restyle the report, or raise ``MarkupError`` on a stray ``[/]``), nor as emoji codes
(``:thumbs_up:``), nor highlighted. The reporters build ``Text`` values besides; the
console is the guarantee for whatever ``str`` reaches rich all the same (a table caption,
a line a later change prints). ``tests/unit/report/test_markup.py`` checks that hangdoc
makes no other console.

Its lines end in no spaces (rich pads a table's or a tree's lines to their width), and a
console whose file is not a terminal (``| tee``, a CI log, a file) is not wrapped at a
width it guessed: its lines are as long as they are, unless a width is given (``--width``,
or ``COLUMNS`` in the environment). Colour is another matter (``no_color``,
``force_terminal``): ``--color always`` into a pipe is coloured and still unwrapped.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import IO

from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderHook, RenderResult
from rich.measure import Measurement
from rich.segment import Segment

UNBOUNDED = 10_000  # the width of a console that is not a terminal: no line is that long


class PlainConsole(Console):
    """A ``Console`` without markup, emoji codes, highlighting or trailing spaces; not
    wrapped where its file is not a terminal and no ``width`` is given. ``pipe_errors``: a
    closed pipe raises ``BrokenPipeError`` for the caller to handle (the CLI's ``main``),
    where rich's own handling would exit with status 1."""

    def __init__(
        self,
        file: IO[str] | None = None,
        *,
        width: int | None = None,
        no_color: bool | None = None,
        force_terminal: bool | None = None,
        pipe_errors: bool = False,
    ) -> None:
        if width is None and not _is_terminal(file if file is not None else sys.stdout):
            width = None if os.environ.get("COLUMNS", "").isdigit() else UNBOUNDED
        super().__init__(
            file=file,
            width=width,
            no_color=no_color,
            force_terminal=force_terminal,
            markup=False,
            emoji=False,
            highlight=False,
        )
        self.pipe_errors = pipe_errors
        self.push_render_hook(_TrimHook())

    def on_broken_pipe(self) -> None:
        if self.pipe_errors:
            raise BrokenPipeError
        super().on_broken_pipe()


def _is_terminal(file: IO[str]) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):  # not a real file, or closed
        return False


class _TrimHook(RenderHook):
    """Each renderable printed (the whole of it, never a cell inside: a table's columns
    stay aligned) without the spaces at the end of its lines."""

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [_Trimmed(r) for r in renderables]


class _Trimmed:
    def __init__(self, inner: ConsoleRenderable) -> None:
        self.inner = inner

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from trimmed(console.render(self.inner, options))

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.inner)


def trimmed(segments: Iterable[Segment]) -> Iterator[Segment]:
    """``segments`` without the spaces that end a line (a space with a background colour
    is kept: it shows)."""
    held: list[Segment] = []  # spaces that end a line if a newline comes next
    for segment in segments:
        text, style, control = segment
        if control:
            yield from held
            held.clear()
            yield segment
            continue
        for i, part in enumerate(text.split("\n")):
            if i:
                held.clear()
                yield Segment.line()
            shows = style is not None and style.bgcolor is not None
            body = part if shows else part.rstrip(" ")
            if body:
                yield from held
                held.clear()
                yield Segment(body, style)
            if len(body) < len(part):
                held.append(Segment(part[len(body) :], style))
    yield from held
