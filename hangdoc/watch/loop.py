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

from ..model import counted
from .config import Level, Say, WatchConfig
from .hooks import Hooks
from .job import Job
from .metrics import MetricsBoard
from .pace import Pace
from .respond import Responder
from .stall import Alarm, Signal, Timeout, TimeoutNews
from .still import EarlyLook


class Loop:
    """Checks until the job ends (None) or the watch ends it (an exit code)."""

    def __init__(
        self,
        config: WatchConfig,
        say: Say,
        board: MetricsBoard,
        pace: Pace,
        job: Job,
        hooks: Hooks,
        early: EarlyLook | None = None,
    ) -> None:
        self.say = say
        self.board = board
        self.pace = pace
        self.job = job
        self.hooks = hooks
        self.alarm = Alarm()
        self.early = early  # the first-step rule's samples of the ranks (``still``)
        self.news = TimeoutNews()
        self.found_said = False  # the first-step rule's samples found the ranks (said once)
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
            self._timeout_news(sig)
            if self.alarm.due(clock, now):
                code = self.responder.on_stall(sig, clock, now)
                if code is not None:
                    return code
            elif (early := self._early(sig, now)) is not None:
                code = self.responder.on_stall(sig, clock, now, early)
                if code is not None:
                    return code
            wake = self.alarm.next_check(clock, now, tick + self.pace.check_interval())
            time.sleep(max(0.0, wake - time.monotonic()))

    def _timeout_news(self, sig: Signal) -> None:
        timeout = self.news.check(sig, self.pace.clocks[sig])
        if timeout is not None:
            self.say(Level.INFO, f"stall timeout now {timeout.seconds:.1f} s on {sig.value} ({timeout.basis})")

    def _early(self, sig: Signal, now: float) -> Timeout | None:
        """The first-step rule: while the signal warms up, sample the ranks; the rule that
        applies when every rank has been still long enough, else None."""
        clock = self.pace.clocks[sig]
        if self.early is None or not (clock.warming_up and clock.policy.early) or self.alarm.raised is not None:
            if self.early is not None:
                self.early.stop()
            return None
        seen = self.early.ranks_seen
        self.early.poll(now)
        if self.early.ranks_seen and not seen and not self.found_said and self.job.supervisor is not None:
            self.found_said = True
            self.say(Level.INFO, f"found {counted(self.early.ranks_seen, 'rank process', 'rank processes')} of the job")
        still = self.early.stillness.still_for(now)
        if not self.alarm.due_early(clock, now, still):
            return None
        n = self.early.ranks_seen
        ranks = "its one rank" if n == 1 else f"all {n} ranks"
        return Timeout(
            clock.policy.first_step_timeout,
            f"first-step rule: {clock.events} of {clock.policy.warmup_steps} warm-up steps seen, "
            f"{ranks} still for {still:.0f} s",
        )

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
