"""The job's pace: the activity it shows, as one ``StallClock`` per signal.

``Pace`` holds the activity sources of one watch (``activity``): the wrapped command's
output and ``--log`` through one queue, the heartbeat records, and the sampled stacks of
the ranks (``TrackedRanks.sampler``). Each check collects their new events and feeds each to the
clock of its signal. The loop reads the clock of the primary signal, the most exact one
the job gives; a stall's ``Trigger`` is made from it.
"""

from __future__ import annotations

import datetime

from .activity import Event, EventQueue, HeartbeatSource, LogTail, StepPattern
from .config import WatchConfig
from .stall import Signal, StallClock, Timeout, Trigger
from .tracked import TrackedRanks

SAMPLE_INTERVAL = 5.0  # default check interval when stacks have to be sampled


class Pace:
    """Activity by signal: a clock each, fed by the sources; the primary signal."""

    def __init__(self, config: WatchConfig, started: float, ranks: TrackedRanks | None) -> None:
        self.clocks = {s: StallClock(config.policy, started) for s in Signal}
        self.pattern = StepPattern(config.step_regex) if config.step_regex else None
        self.interval = config.check_interval
        self.wrapped = bool(config.command)  # the command's output is read
        self.queue = EventQueue()  # output events, from the reader threads
        self.log: LogTail | None = None
        self.heartbeats: HeartbeatSource | None = None
        self.ranks = ranks  # their stacks are sampled when ``ranks.sampler`` is set
        self.last_step: int | None = None

    def follow(self, path: str) -> None:
        """``--log FILE``: its growth from now on is output."""
        self.log = LogTail(path, self.pattern, self.queue)

    def close(self) -> None:
        """Close what the sources hold open (the ``--log`` file)."""
        if self.log is not None:
            self.log.close()

    def primary(self) -> Signal:
        """The most exact signal this job gives."""
        if self.clocks[Signal.HEARTBEAT].events:
            return Signal.HEARTBEAT
        if self.pattern is not None:
            return Signal.STEP_LINE
        if self.wrapped or self.log is not None:
            return Signal.OUTPUT
        return Signal.STACKS

    def check_interval(self) -> float:
        if self.interval is not None:
            return self.interval
        return SAMPLE_INTERVAL if self.primary() is Signal.STACKS else 1.0

    def collect(self) -> list[Event]:
        """The sources' new events, each fed to the clock of its signal. Stacks are sampled
        only while they are the primary signal."""
        if self.log is not None:
            self.log.poll()
        events = self.queue.drain()
        if self.heartbeats is not None:
            events += self.heartbeats.poll()
        sampler = self.ranks.sampler if self.ranks is not None else None
        if sampler is not None and self.primary() is Signal.STACKS:
            events += sampler.poll()
        for event in events:
            self.clocks[event.signal].activity(event.at, event.count)
            if event.step is not None:
                self.last_step = event.step
        return events

    def trigger(self, sig: Signal, now: float, details: tuple[str, ...], timeout: Timeout | None = None) -> Trigger:
        """Why a stall of ``sig`` is suspected at ``now``, for the report; ``timeout``: the rule
        that applied when it is not the clock's (the first-step rule)."""
        clock = self.clocks[sig]
        timeout = timeout or clock.timeout()
        return Trigger(
            signal=sig,
            silence_seconds=round(clock.silence(now), 3),
            timeout_seconds=round(timeout.seconds, 3),
            timeout_basis=timeout.basis,
            check_interval=self.check_interval(),
            steps_seen=clock.events,
            last_step=self.last_step,
            detected_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            details=details,
        )
