"""The watch loop: one check every check interval, and one right when a silence would pass
the stall timeout.

Each check collects the activity of the job's signals into their stall clocks (``pace``),
publishes the pace of the primary signal (``metrics``), and asks the ``Alarm`` (``stall``)
whether its silence is due for a look; the ``Responder`` (``respond``) then diagnoses and
dismisses, postpones or fires. A reported hang is over once the signal shows activity
again. A second signal to a wrapping watchdog ends the job from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .config import Level, Say, WatchConfig
from .hooks import Hooks
from .job import Job
from .metrics import MetricsBoard
from .pace import Pace
from .respond import Responder
from .stall import Alarm


class Loop:
    """Checks until the job ends (None) or the watch ends it (an exit code)."""

    def __init__(self, config: WatchConfig, say: Say, board: MetricsBoard, pace: Pace, job: Job, hooks: Hooks) -> None:
        self.say = say
        self.board = board
        self.pace = pace
        self.job = job
        self.hooks = hooks
        self.alarm = Alarm()
        self.responder = Responder(config, say, board, pace, self.alarm, job, self.collect)

    def run(self, ended: Callable[[], bool]) -> int | None:
        """Watch until ``ended()`` (None) or the watch ends the job (an exit code)."""
        supervisor = self.job.supervisor
        while True:
            tick = time.monotonic()
            self.collect()
            if supervisor is not None and supervisor.signals.stop_requested:
                return self.job.stop()
            if ended():
                return None
            now = time.monotonic()
            sig = self.pace.primary()
            clock = self.pace.clocks[sig]
            self.board.publish(sig, clock, self.pace.last_step, now)
            if self.alarm.due(clock, now):
                code = self.responder.on_stall(sig, clock, now)
                if code is not None:
                    return code
            wake = self.alarm.next_check(clock, now, tick + self.pace.check_interval())
            time.sleep(max(0.0, wake - time.monotonic()))

    def collect(self) -> None:
        """The job's new activity. Activity on the primary signal restarts the count of
        postponements, and ends a reported hang; hook commands that exited are collected."""
        events = self.pace.collect()
        primary = self.pace.primary()
        if any(e.signal is primary for e in events):
            self.alarm.postponed = 0
        if self.alarm.raised is not None:
            last = self.pace.clocks[primary].last
            if last is not None and last > self.alarm.raised:
                self.say(
                    Level.INFO,
                    f"activity again ({primary.value}) {last - self.alarm.raised:.1f} s "
                    "after the report: watching for the next stall",
                )
                self.alarm.raised = None
                self.board.update(stalled=False)
        self.hooks.reap()
        if self.job.supervisor is not None:
            self.job.supervisor.reap(self.hooks.pids())
