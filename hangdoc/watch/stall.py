"""When is a silence a stall? The watchdog's timing, as pure values, one small clock per
signal and the ``Alarm``; the judgement of a diagnosis taken during a silence.

A *signal* produces activity events: a heartbeat from the training loop, a line matching
``--step-regex``, any line of output, or a change in the ranks' sampled stacks. The
``StallClock`` of a signal remembers when the last event came and how long the gaps
between events have been, and answers two questions: how long has it been silent, and
how long a silence is too long.

The timeout is either fixed (``--stall-after``) or learned, like nvidia-resiliency-ext's
calculated timeouts: ``factor`` times the longest gap seen after the first
``warmup_steps`` events, never below ``min_timeout``. Until the warm-up is over the
timeout is ``warmup_timeout``: first steps include compilation, data loading and
rendezvous, and say nothing about the steady state. A gap is only measured once it has
ended, so a long pause that turns out to be progress (an evaluation, a checkpoint save)
raises the learned timeout for the next one.

``Alarm`` holds what the watchdog decided about the last silence it looked at, and from it
when the next look is due: never while a reported hang lasts, and never before a full
timeout has passed since the job was last seen moving (a dismissal, a postponement, or the
steps that resumed while a diagnosis ran: ``resumed_at``). ``judge`` turns a diagnosis
taken during a silence into a decision: fire, dismiss or postpone.
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass

from ..errors import UsageError
from ..model import Diagnosis, Verdict, counted

DEFAULT_WARMUP_TIMEOUT = 600.0
DEFAULT_FIRST_STEP_TIMEOUT = 120.0  # see ``still``: far above a hung rank's stillness, below the warm-up


class Signal(enum.Enum):
    """Where step activity was read from, most exact first."""

    HEARTBEAT = "heartbeat"  # hangdoc.heartbeat() / hangdoc.step() in the training loop
    STEP_LINE = "step_line"  # lines matching --step-regex
    OUTPUT = "output"  # any line of the job's output (wrapped command or --log)
    STACKS = "stacks"  # the ranks' sampled Python stacks changed


@dataclass(frozen=True, slots=True)
class StallPolicy:
    """How long a silence may last. ``stall_after`` fixed, or learned when None."""

    stall_after: float | None = None
    warmup_steps: int = 5
    warmup_timeout: float | None = None  # default: stall_after when fixed, else 600 s
    factor: float = 3.0
    min_timeout: float = 30.0
    # during warm-up, a stall when every rank is also still this long (``still``); 0: off
    first_step_timeout: float = DEFAULT_FIRST_STEP_TIMEOUT

    def __post_init__(self) -> None:
        # a NaN compares false with everything: a NaN timeout would never fire
        positive = {
            "--stall-after": self.stall_after,
            "--warmup-timeout": self.warmup_timeout,
            "--stall-factor": self.factor,
        }
        for option, value in positive.items():
            if value is not None and not (math.isfinite(value) and value > 0):
                raise UsageError(f"{option} {value!r}: need a finite number above 0")
        if not (math.isfinite(self.min_timeout) and self.min_timeout >= 0):
            raise UsageError(f"--min-stall {self.min_timeout!r}: need a finite number, 0 or more")
        if not (math.isfinite(self.first_step_timeout) and self.first_step_timeout >= 0):
            raise UsageError(f"--first-step-timeout {self.first_step_timeout!r}: need a finite number, 0 or more")
        if self.warmup_steps < 0:
            raise UsageError(f"--warmup-steps {self.warmup_steps!r}: need 0 or more")

    def warmup_seconds(self) -> float:
        if self.warmup_timeout is not None:
            return self.warmup_timeout
        return self.stall_after if self.stall_after is not None else DEFAULT_WARMUP_TIMEOUT

    @property
    def early(self) -> bool:
        """The first-step rule applies: it is on, and shorter than the warm-up timeout."""
        return 0 < self.first_step_timeout < self.warmup_seconds()

    def words(self, signal: Signal) -> str:
        """The stall rule in one phrase, for the line that starts a watch."""
        quiet = f"no {_SIGNAL_WORDS[signal]}"
        if self.stall_after is not None:
            rule = f"{quiet} for more than {self.stall_after:g} s (--stall-after)"
        else:
            rule = (
                f"{quiet} for more than {self.factor:g} x the longest gap between steps "
                f"(at least {self.min_timeout:g} s)"
            )
        if not self.warmup_steps:
            return rule
        warmup = self.warmup_seconds()
        before = []
        if warmup != self.stall_after:
            before.append(f"{warmup:g} s")
        if self.early:
            before.append(f"{self.first_step_timeout:g} s when every rank is also still")
        if before:
            verb = "is" if self.warmup_steps == 1 else "are"
            rule += f"; until {counted(self.warmup_steps, 'step')} {verb} seen: {', or '.join(before)}"
        return rule


@dataclass(frozen=True, slots=True)
class Timeout:
    """The current stall timeout and where it came from, for the report."""

    seconds: float
    basis: str


class StallClock:
    """Activity events of one signal; times are ``time.monotonic()`` seconds."""

    def __init__(self, policy: StallPolicy, started: float) -> None:
        self.policy = policy
        self.started = started
        self.events = 0
        self.last: float | None = None
        self.longest_gap = 0.0  # after warm-up
        self.steps: list[tuple[float, int]] = []  # recent (time, events so far), for the step rate

    def activity(self, at: float, count: int = 1) -> None:
        """``count`` steps, the last at ``at``. With several, each gap is at most the time
        since the previous event: that bound is what is learned (erring long, never short).
        ``count`` 0 is activity that is not a new step (more output of the same burst)."""
        if self.last is not None and at <= self.last:
            return
        if self.last is not None and self.events >= self.policy.warmup_steps:
            self.longest_gap = max(self.longest_gap, at - self.last)
        self.events += count
        self.last = at
        if count:
            self.steps.append((at, self.events))
        if len(self.steps) > 256:
            del self.steps[:128]

    @property
    def warming_up(self) -> bool:
        return self.events < self.policy.warmup_steps

    def silence(self, now: float) -> float:
        return max(0.0, now - (self.last if self.last is not None else self.started))

    def timeout(self) -> Timeout:
        p = self.policy
        if self.warming_up:
            return Timeout(p.warmup_seconds(), f"warm-up: {self.events} of {p.warmup_steps} steps seen")
        if p.stall_after is not None:
            return Timeout(p.stall_after, "--stall-after")
        learned = p.factor * self.longest_gap
        if learned <= p.min_timeout:
            return Timeout(
                p.min_timeout,
                f"learned: {p.factor:g} x longest step gap "
                f"{self.longest_gap:.2f} s is below the minimum {p.min_timeout:g} s",
            )
        return Timeout(
            learned, f"learned: {p.factor:g} x longest step gap {self.longest_gap:.2f} s over {self.events} steps"
        )

    def stalled(self, now: float) -> bool:
        return self.silence(now) > self.timeout().seconds

    def rate(self, now: float, horizon: float = 60.0) -> float:
        """Events per second over the last ``horizon`` seconds (0 before two events)."""
        recent = [(t, n) for t, n in self.steps if t >= now - horizon]
        if len(recent) < 2:
            return 0.0
        return (recent[-1][1] - recent[0][1]) / max(now - recent[0][0], 1e-9)


@dataclass(frozen=True, slots=True)
class Trigger:
    """Why the watchdog fired (or considered firing): written into the report."""

    signal: Signal
    silence_seconds: float  # at detection
    timeout_seconds: float
    timeout_basis: str
    check_interval: float
    steps_seen: int
    last_step: int | None  # a step number, when the signal carries one
    detected_at: str  # UTC, ISO 8601
    details: tuple[str, ...] = ()  # e.g. per-rank heartbeat ages

    def sentence(self) -> str:
        step = f" (last step {self.last_step})" if self.last_step is not None else ""
        return (
            f"no {_SIGNAL_WORDS[self.signal]} for {self.silence_seconds:.1f} s{step}; "
            f"stall timeout {self.timeout_seconds:.1f} s ({self.timeout_basis})"
        )


_SIGNAL_WORDS = {
    Signal.HEARTBEAT: "heartbeat",
    Signal.STEP_LINE: "step line",
    Signal.OUTPUT: "output",
    Signal.STACKS: "change in the ranks' stacks",
}


TIMEOUT_NEWS_FACTOR = 1.5


class TimeoutNews:
    """When a change of the stall timeout is worth a line: the signal in use changed, the
    warm-up began or ended, or the timeout is ``TIMEOUT_NEWS_FACTOR`` times longer (or
    shorter) than when it was last said. A learned timeout grows with each new longest gap:
    a factor, not any change, keeps a job with jittery steps from a line per step, and
    bounds the lines to a few per decade (30 s to an hour: 12 at most)."""

    def __init__(self) -> None:
        self.said: tuple[Signal, bool, float] | None = None

    def check(self, signal: Signal, clock: StallClock) -> Timeout | None:
        """The timeout, when it is news (never the first time: the start line said the rule)."""
        timeout = clock.timeout()
        now = (signal, clock.warming_up, timeout.seconds)
        said, self.said = self.said, now
        if said is None:
            return None
        f = TIMEOUT_NEWS_FACTOR
        if said[:2] != now[:2] or not said[2] / f < timeout.seconds < said[2] * f:
            return timeout
        self.said = said  # keep measuring from what was said, so slow growth adds up
        return None


class Alarm:
    """The state of the last look at a silence, and when the next one is due. Times are
    ``time.monotonic()`` seconds."""

    def __init__(self) -> None:
        self.raised: float | None = None  # when the current hang was reported
        self.moving_at = 0.0  # when a diagnosis last found the job progressing (or working)
        self.postponed = 0  # looks postponed in a row (reset by activity on the signal)

    def due(self, clock: StallClock, now: float) -> bool:
        """Look now: no hang reported, the silence is past the timeout, and so is the time
        since the job was last seen moving."""
        return self.raised is None and clock.stalled(now) and now - self.moving_at > clock.timeout().seconds

    def due_early(self, clock: StallClock, now: float, still_for: float) -> bool:
        """The first-step rule (``still``): during warm-up, no hang reported, and the silence,
        the stillness of every rank and the time since the job was last seen moving all past
        ``first_step_timeout``."""
        limit = clock.policy.first_step_timeout
        return (
            self.raised is None
            and clock.warming_up
            and clock.policy.early
            and early_stall(clock.silence(now), still_for, limit)
            and now - self.moving_at > limit
        )

    def next_check(self, clock: StallClock, now: float, wake: float) -> float:
        """``wake``, or earlier: right when the silence would pass the timeout."""
        if self.raised is None:
            last = clock.started if clock.last is None else clock.last
            due = max(last, self.moving_at) + clock.timeout().seconds + 0.02
            if due > now:
                wake = min(wake, due)
        return wake

    def dismiss(self, since: float | None = None) -> None:
        """Not a hang. The next stall is timed from now, or from ``since`` when the job showed
        activity then (steps that resumed while the diagnosis ran)."""
        self.postponed = 0
        self.moving_at = time.monotonic() if since is None else since

    def postpone(self) -> None:
        """Look again one full timeout from now."""
        self.postponed += 1
        self.moving_at = time.monotonic()

    def fire(self) -> None:
        """A hang is reported: no look until the signal shows activity again."""
        self.raised = time.monotonic()
        self.postponed = 0


def early_stall(silence: float, still_for: float, first_step_timeout: float) -> bool:
    """The first-step rule: the signal silent and every rank still, both for longer than
    ``first_step_timeout`` (0: the rule is off)."""
    return first_step_timeout > 0 and min(silence, still_for) > first_step_timeout


def resumed_at(clock: StallClock, stalled_at: float) -> float | None:
    """When steps came back after the stall was suspected, or None."""
    return clock.last if clock.last is not None and clock.last > stalled_at else None


class Action(enum.Enum):
    """What the watchdog does with a confirmed silence."""

    FIRE = "fire"  # a hang: write the report, then --on-hang
    DISMISS = "dismiss"  # the job is progressing: not a hang
    POSTPONE = "postpone"  # one rank still works while the others wait: look again later


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    reason: str


def judge(diagnosis: Diagnosis, postponed: int, max_postpone: int) -> Decision:
    """Whether a diagnosis taken during a silence is a hang, with the reason in words.

    ``not_hung`` is progress. A straggler whose culprits are themselves working (on CPU,
    moving bytes) is what a long evaluation or a checkpoint save on one
    rank looks like: postponed by one more stall timeout, at most ``max_postpone`` times,
    then reported. Every other verdict is a hang.
    """
    if diagnosis.verdict is Verdict.NOT_HUNG:
        return Decision(Action.DISMISS, f"the job is progressing: {diagnosis.summary}")
    if diagnosis.verdict is Verdict.STRAGGLER and postponed < max_postpone:
        culprits = set(diagnosis.culprit_ranks)
        working = [ra.rank for ra in diagnosis.ranks if ra.rank in culprits and ra.working]
        if culprits and len(working) == len(culprits):
            return Decision(
                Action.POSTPONE,
                (
                    f"{_ranks_words(sorted(working))} still working while the others wait "
                    f"(look {postponed + 1} of {max_postpone + 1}): {diagnosis.summary}"
                ),
            )
    if diagnosis.verdict is Verdict.STRAGGLER:
        return Decision(Action.FIRE, f"confirmed after {counted(postponed + 1, 'look')}: {diagnosis.summary}")
    return Decision(Action.FIRE, f"confirmed by diagnosis: {diagnosis.summary}")


def _ranks_words(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
