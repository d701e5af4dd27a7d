"""Status on stderr while hangdoc works: the one-line messages, and on a terminal a live
line of where the diagnosis stands.

- stderr is a terminal: the messages are printed as ``hangdoc: MESSAGE`` lines above a
  live line drawn with rich (a spinner, the step, rounds taken, ranks captured, the time
  left in the window, native frames, probes that answered). The live line is transient:
  it is erased before the report is printed, so the report reads the same as without it.
  A long step with nothing else to show (``hangdoc analyze`` of a large snapshot) gets a
  live line only once it has taken ``BUSY_AFTER`` seconds.
- stderr is not a terminal (a pipe, a file, CI), or ``--json``: the messages alone, one
  line each, as they always were; no live line.
- ``--quiet``: nothing.

The CLI makes one ``StatusDisplay`` per command (``StatusDisplay.on``) and hands its
``say`` and ``update`` to the pipeline (``hangdoc.pipeline``'s ``Message`` and ``Status``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Protocol, Self, TextIO

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from ..errors import one_line
from ..waitwords import counted
from .console import PlainConsole

BUSY_AFTER = 1.0  # seconds a step that tells nothing of its own runs before it gets a live line
REFRESH_PER_SECOND = 8


class CaptureState(Protocol):
    """What the live line shows: ``hangdoc.pipeline.Sampling``, read through this protocol
    (the report floor imports nothing of the pipeline's)."""

    @property
    def step(self) -> str: ...  # what it is doing, in words
    @property
    def ranks(self) -> int: ...
    @property
    def captured(self) -> int: ...
    @property
    def rounds(self) -> int: ...
    @property
    def elapsed(self) -> float: ...
    @property
    def window(self) -> float: ...
    @property
    def native(self) -> int: ...
    @property
    def probes(self) -> int | None: ...


def describe(state: CaptureState, elapsed: float) -> str:
    """The live line's words for ``state``, ``elapsed`` seconds into the capture."""
    parts = [state.step]
    if state.rounds:
        parts.append(counted(state.rounds, "round"))
        parts.append(f"{state.captured:,} of {counted(state.ranks, 'rank')} captured")
    elif state.ranks:
        parts.append(counted(state.ranks, "rank"))
    if state.window and elapsed < state.window:
        parts.append(f"{state.window - elapsed:.1f} s left of the {state.window:g} s window")
    else:
        parts.append(f"{elapsed:.1f} s")
    if state.native:
        parts.append(f"native frames of {counted(state.native, 'rank')}")
    if state.probes:  # most jobs run without a probe: none answering is no news
        parts.append(f"{counted(state.probes, 'probe')} answered")
    return " · ".join(parts)


class _LiveLine:
    """The live line: one line, cut to the terminal's width, rebuilt at every refresh so
    that its clock runs between updates."""

    def __init__(self, text: Callable[[], str]) -> None:
        self.text = text
        self.spinner = Spinner("dots", style="cyan")

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        frame = self.spinner.render(console.get_time())  # a Text: the spinner has no text of its own
        line = Text.assemble(
            frame if isinstance(frame, Text) else "", " ", self.text(), no_wrap=True, overflow="ellipsis"
        )
        line.truncate(options.max_width, overflow="ellipsis")
        yield line


class StatusDisplay:
    """Status on one stream (stderr): ``say`` for the one-line messages, ``update`` for
    the live line, ``busy`` for a long step. Use it as a context manager around the work: the
    live line starts with it and is erased when it ends, however it ends."""

    def __init__(self, stream: TextIO, *, quiet: bool = False, live: bool = False, prefix: str = "hangdoc: ") -> None:
        self.stream = stream
        self.quiet = quiet
        self.prefix = prefix
        self.console = PlainConsole(stream) if live and not quiet else None
        self._live: Live | None = None
        self._lock = threading.Lock()
        self._state: CaptureState | None = None
        self._told_at = time.monotonic()
        self._busy: str | None = None
        self._busy_since = time.monotonic()

    @classmethod
    def on(cls, stream: TextIO, *, quiet: bool, json: bool) -> StatusDisplay:
        """The display the CLI wants on ``stream``: live only on a terminal, and neither with
        ``--json`` nor ``--quiet``."""
        live = not (quiet or json) and _is_terminal(stream)
        return cls(stream, quiet=quiet, live=live)

    @property
    def live(self) -> bool:
        """Whether this display draws a live line (stderr is a terminal, not quiet)."""
        return self.console is not None

    # ------------------------------------------------------------------ the context

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._stop()

    # ------------------------------------------------------------------ what the pipeline calls

    def say(self, message: str) -> None:
        """One message, one line: above the live line on a terminal."""
        if self.quiet:
            return
        line = f"{self.prefix}{one_line(message)}"
        with self._lock:
            if self._live is not None:
                self._live.console.print(Text(line), soft_wrap=True)
                return
        print(line, file=self.stream, flush=True)

    def update(self, state: CaptureState) -> None:
        """Where the diagnosis stands now (``hangdoc.pipeline.Status``)."""
        if not self.live:
            return
        with self._lock:
            self._state, self._told_at, self._busy = state, time.monotonic(), None
            if not self._start() and self._live is not None:
                self._live.refresh()  # each round and step shows at once, between the clock's ticks

    @contextmanager
    def busy(self, what: str, after: float = BUSY_AFTER) -> Iterator[Callable[[str], None]]:
        """A step that tells nothing of its own: a live line saying ``what`` once it has
        run ``after`` seconds. Yields a function that changes the words."""
        if not self.live:
            yield lambda _what: None
            return

        def retitle(text: str) -> None:
            with self._lock:
                if self._busy is not None:
                    self._busy = text

        timer = threading.Timer(after, self._show_busy)
        timer.daemon = True
        with self._lock:
            self._busy, self._busy_since = what, time.monotonic()
        timer.start()
        try:
            yield retitle
        finally:
            timer.cancel()
            with self._lock:
                self._busy = None
            self._stop()

    # ------------------------------------------------------------------ inside

    def _show_busy(self) -> None:
        with self._lock:
            if self._busy is not None:
                self._start()

    def _start(self) -> bool:  # under the lock; whether it started the live line now
        if self._live is not None or self.console is None:
            return False
        self._live = Live(
            _LiveLine(self._text),
            console=self.console,
            transient=True,
            refresh_per_second=REFRESH_PER_SECOND,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._live.start(refresh=True)
        return True

    def _stop(self) -> None:
        with self._lock:
            live, self._live = self._live, None
        if live is not None:
            live.stop()

    def _text(self) -> str:
        busy, state = self._busy, self._state
        now = time.monotonic()
        if busy is not None:
            return f"{busy} · {now - self._busy_since:.1f} s"
        if state is None:
            return "working"
        return describe(state, state.elapsed + (now - self._told_at))


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a real file
        return False
