"""``PlainConsole``: the one kind of rich ``Console`` hangdoc prints on.

Function, file and thread names, command lines and the sentences that quote them come from
the job, and a job may name a function ``[/]x`` or a thread ``reader[/dev/sda]``. A plain
console prints a ``str`` as it is: never read as markup (``[bold]``, ``[link=...]``, which
would restyle the report, or raise ``MarkupError`` on a stray ``[/]``), nor as emoji codes
(``:thumbs_up:``), nor highlighted. The reporters build ``Text`` values besides; the
console is the guarantee for whatever ``str`` reaches rich all the same (a table caption,
a line a later change prints). ``tests/unit/report/test_markup.py`` checks that hangdoc
makes no other console.
"""

from __future__ import annotations

from typing import IO

from rich.console import Console


class PlainConsole(Console):
    """A ``Console`` without markup, emoji codes or highlighting. ``pipe_errors``: a closed
    pipe raises ``BrokenPipeError`` for the caller to handle (the CLI's ``main``), where
    rich's own handling would exit with status 1."""

    def __init__(
        self,
        file: IO[str] | None = None,
        *,
        width: int | None = None,
        no_color: bool | None = None,
        force_terminal: bool | None = None,
        pipe_errors: bool = False,
    ) -> None:
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

    def on_broken_pipe(self) -> None:
        if self.pipe_errors:
            raise BrokenPipeError
        super().on_broken_pipe()
