"""What one ``hangdoc watch`` is asked to do: ``WatchConfig`` (the CLI builds it; the watch
reads argparse nowhere) and ``OnHang``, the ``--on-hang`` action.

``check_config`` refuses, before anything is started, the combinations and the numbers
the watch cannot work with. ``Say`` is where the watch's messages go, each with its
``Level`` (the CLI prints them on stderr; ``--quiet`` chooses by level, never by the words).
"""

from __future__ import annotations

import enum
import math
import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UsageError
from ..fleet.node import Node
from ..pipeline import CaptureOptions, FleetSource, Message
from .stall import StallPolicy


class Level(enum.Enum):
    """What a watch message is about: whoever prints the messages chooses by it."""

    INFO = "info"
    """Status: what is watched, where reports and metrics go, a stall suspected, dismissed
    or postponed, activity again after a report, ``--on-hang`` at work, the job's end."""
    WARNING = "warning"
    """Something beside the watch went wrong and the watch goes on as before: the metrics
    textfile, an ``--on-hang exec`` command's exit status."""
    HANG = "hang"
    """A hang found: its verdict and culprits, and where its report is."""
    ERROR = "error"
    """What the watch could not do (diagnose, write the report, look for the job's ranks,
    end a process, run the ``--on-hang exec`` command), and internal errors."""
    STOP = "stop"
    """The watch leaves early (interrupted, or on an error) and ends the wrapped command."""


Say = Callable[[Level, str], None]


def messages(say: Say) -> Message:
    """``say`` for the diagnosis pipeline's one-line messages (a ``ray:`` job's workers and
    agents): status, ``Level.INFO``."""
    return lambda text: say(Level.INFO, text)


@dataclass(frozen=True, slots=True)
class OnHang:
    """``--on-hang``: report (keep watching), kill, or exec a command."""

    action: str = "report"
    command: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> OnHang:
        try:
            words = shlex.split(text)
        except ValueError as err:  # "No closing quotation", "No escaped character"
            raise UsageError(
                f"--on-hang {text!r}: cannot split it like a shell command line: {str(err).lower()}"
            ) from None
        if words in (["report"], ["kill"]):
            return cls(words[0])
        if words == ["exec"]:
            raise UsageError(f"--on-hang {text!r}: exec needs a command: 'exec CMD [ARGS]'")
        if len(words) >= 2 and words[0] == "exec":
            return cls("exec", tuple(words[1:]))
        raise UsageError(f"--on-hang {text!r}: expected report, kill or 'exec CMD [ARGS]'")


@dataclass(frozen=True, slots=True)
class WatchConfig:
    command: tuple[str, ...] = ()  # wrap this command; empty: attach to ``job``
    job: str | None = None  # the job spec (attach), or which job the wrapped command runs
    out: Path = Path("hangs")
    policy: StallPolicy = field(default_factory=StallPolicy)
    check_interval: float | None = None  # default 1 s, or pace.SAMPLE_INTERVAL when sampling stacks
    step_regex: str | None = None
    log: str | None = None
    on_hang: OnHang = OnHang()
    kill_grace: float = 10.0
    max_postpone: int = 3
    capture: CaptureOptions = field(default_factory=CaptureOptions)
    nodes: Sequence[Node] | None = None  # agents; None: this node
    source: FleetSource | None = None  # where the job's ranks come from instead (a ray: job)
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    metrics_textfile: Path | None = None  # a .prom file (or a directory) for node_exporter
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))


def check_config(config: WatchConfig) -> None:
    """Raise ``UsageError`` for a watch that cannot be run as asked."""
    if config.nodes is not None and config.on_hang.action == "kill" and not config.command:
        raise UsageError(
            "--on-hang kill cannot end ranks on other nodes through agents",
            help="Use --on-hang 'exec CMD' to call your scheduler (scancel, kubectl delete), "
            "or wrap the launcher: hangdoc watch --agents ... -- srun ...",
        )
    if config.source is not None and config.command:
        raise UsageError(
            "a ray: job is watched by attaching to it: hangdoc watch ray:JOB",
            help="Submit the job first (`ray job submit`), then watch its id.",
        )
    if config.source is not None and config.on_hang.action == "kill":
        raise UsageError(
            "--on-hang kill cannot end a ray: job's workers from here",
            help="Stop it through Ray: --on-hang 'exec ray job stop {job}'.",
        )
    if not config.command and not config.job:
        raise UsageError("watch needs a JOB to attach to or a command after `--`")
    if config.command and config.nodes is not None and not config.job:
        raise UsageError("with --agents, say which job the wrapped command runs: --job HOST:PORT")
    # numbers the loop sleeps and waits on: a NaN would crash ``time.sleep`` or never expire
    if config.check_interval is not None and not (math.isfinite(config.check_interval) and config.check_interval > 0):
        raise UsageError(f"--check-interval {config.check_interval!r}: need a finite number above 0")
    if not (math.isfinite(config.kill_grace) and config.kill_grace >= 0):
        raise UsageError(f"--kill-grace {config.kill_grace!r}: need a finite number, 0 or more")
