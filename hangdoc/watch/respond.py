"""What the watchdog does about a silence longer than the stall timeout.

The full ``diagnose`` pipeline runs against the still-hung job; then what the job did
meanwhile is collected. Steps that resumed, or a job that ended, dismiss the stall (the
next one is timed from those steps). Otherwise ``stall.judge`` decides from the
diagnosis: dismiss (progress), postpone (a straggler still working), or fire: the hang
directory is written (``incident``), even for a diagnosis that failed, and ``--on-hang``
applies: keep watching, end the job, or run the exec command.

A bug in hangdoc while it responds (an internal error) is one line and never harms the job
beyond what ``--on-hang`` asks: a diagnosis that fails on one is a diagnosis that failed;
one after it leaves the report what could be written (undiagnosed, if nothing else), and
``--on-hang`` applies as to any reported hang (``report`` and ``exec`` leave the job
running); the watch goes on.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..errors import HangdocError, InternalError, JobNotFound, described
from ..model import Diagnosis, Heartbeat, JobSnapshot, RankState
from ..pipeline import FleetSource, diagnose
from .config import Level, Say, WatchConfig
from .incident import write_failed_incident, write_incident
from .job import Job
from .metrics import MetricsBoard
from .pace import Pace
from .stall import Action, Alarm, Signal, StallClock, Timeout, Trigger, judge, resumed_at
from .supervisor import LOCAL

# seconds a wrapped launcher whose ranks have all exited gets to exit itself, before the
# missing ranks are reported (see ``Responder._let_it_end``)
LAUNCHER_EXIT_GRACE = 10.0


class Responder:
    """A stall: diagnose the job, judge, then dismiss, postpone or fire (an exit code when
    ``--on-hang kill`` ended the job)."""

    def __init__(
        self,
        config: WatchConfig,
        say: Say,
        board: MetricsBoard,
        pace: Pace,
        alarm: Alarm,
        job: Job,
        collect: Callable[[], None],
    ) -> None:
        self.c = config
        self.say = say
        self.board = board
        self.pace = pace
        self.alarm = alarm
        self.job = job
        self.collect = collect  # the loop's look at the job's activity
        self.ranks_seen = False  # an earlier diagnosis found the job's ranks

    def on_stall(self, sig: Signal, clock: StallClock, now: float, timeout: Timeout | None = None) -> int | None:
        """``timeout``: the rule that applied, when not the clock's (the first-step rule)."""
        trigger = self.pace.trigger(sig, now, heartbeat_details(self.pace), timeout)
        self.board.count("suspected_total")
        self.say(Level.INFO, f"stall suspected: {trigger.sentence()}; diagnosing {self.job.spec}")
        try:
            return self._respond(trigger, clock, now)
        except Exception as err:
            if os.environ.get("HANGDOC_DEBUG"):
                raise  # the traceback, asked for
            return self._bug(trigger, err)

    def _respond(self, trigger: Trigger, clock: StallClock, now: float) -> int | None:
        started = time.monotonic()
        try:
            snapshot, diagnosis = diagnose(self.job.spec, self.c.capture, None, self.c.nodes, self._source())
        except HangdocError as err:
            return self._undiagnosed(trigger, clock, now, err, str(err), err.help)
        except Exception as err:
            if os.environ.get("HANGDOC_DEBUG"):
                raise
            return self._undiagnosed(trigger, clock, now, err, f"internal error: {described(err)}", InternalError.help)
        self.ranks_seen = True
        self.board.count_diagnosis(diagnosis.verdict.value)
        if reason := self._moved_on(clock, now, diagnosis):
            return self._dismiss(reason, resumed_at(clock, now))
        decision = judge(diagnosis, self.alarm.postponed, self.c.max_postpone)
        if decision.action is Action.DISMISS:
            return self._dismiss(decision.reason)
        if decision.action is Action.POSTPONE:
            self.alarm.postpone()
            self.say(Level.INFO, f"not yet: {decision.reason}")
            return None
        trigger = replace(trigger, details=heartbeat_details(self.pace, snapshot) or trigger.details)
        path = write_incident(
            self.c.out, snapshot, diagnosis, trigger, decision.reason, time.monotonic() - started, self.say
        )
        self.board.count("reports_total")
        culprits = diagnosis.culprit_ranks
        head = diagnosis.verdict.value + (f" (culprit ranks {', '.join(map(str, culprits))})" if culprits else "")
        return self._fire(path, head, diagnosis.summary)

    def _undiagnosed(
        self, trigger: Trigger, clock: StallClock, now: float, err: Exception, error: str, help_text: str
    ) -> int | None:
        """The diagnosis failed (``error``; an internal error is a bug in hangdoc): unless the
        job moved on meanwhile, the stall is reported with verdict ``unknown``."""
        self.board.count_diagnosis("failed")
        if isinstance(err, JobNotFound) and self.ranks_seen:
            self._let_it_end()
        if reason := self._moved_on(clock, now, None):
            return self._dismiss(reason, resumed_at(clock, now))
        self.say(Level.ERROR, f"could not diagnose: {error}")
        path = write_failed_incident(self.c.out, self.job.spec, trigger, error, help_text, self.say)
        self.board.count("reports_total")
        return self._fire(path, "unknown", f"could not diagnose: {error}")

    def _bug(self, trigger: Trigger, err: Exception) -> int | None:
        """A bug in hangdoc while responding to the stall (judging, writing the report, ``--on-hang``):
        one line, and the job is left as ``--on-hang`` says. A hang not yet reported is
        reported undiagnosed (what report can still be written) and ``--on-hang`` applies as
        to any hang; one reported already is not reported again. The watch goes on."""
        error = f"internal error: {described(err)}"
        if self.alarm.raised is not None:  # the report was out: the error came from --on-hang
            self.say(Level.ERROR, f"{error}; keeping watch")
            return None
        self.say(Level.ERROR, f"{error}; reporting the stall undiagnosed")
        try:
            path = write_failed_incident(self.c.out, self.job.spec, trigger, error, InternalError.help, self.say)
            self.board.count("reports_total")
        except Exception as again:  # noqa: BLE001 - not even that: --on-hang still applies
            self.say(Level.ERROR, f"internal error: no report written: {described(again)}")
            path = None
        return self._fire(path, "unknown", error)

    def _source(self) -> FleetSource | None:
        """The fleet source the watch holds (a ray: job's agents), lent to one diagnosis."""
        finder = self.job.ranks.finder if self.job.ranks is not None else None
        if finder is None:
            return None
        return lambda _say: contextlib.nullcontext(finder)

    def _let_it_end(self) -> None:
        """No rank left to diagnose, where an earlier diagnosis found them, while the wrapped
        command still runs: its ranks have exited and the launcher is on its way out (torchrun
        reaps its workers and closes its rendezvous, which took up to a few seconds on a loaded 2-core machine). Give it
        ``LAUNCHER_EXIT_GRACE`` seconds before calling it a hang."""
        deadline = time.monotonic() + LAUNCHER_EXIT_GRACE
        sup = self.job.supervisor
        while sup is not None and sup.child is not None and not sup.exited() and time.monotonic() < deadline:
            time.sleep(0.2)

    def _moved_on(self, clock: StallClock, since: float, diagnosis: Diagnosis | None) -> str | None:
        """Why the stall is over by the time the diagnosis is done, or None: steps resumed,
        or the job (or every rank the diagnosis saw) exited."""
        self.collect()  # what the job did while we looked
        if clock.last is not None and clock.last > since:
            taken = f" ({diagnosis.verdict.value} taken meanwhile)" if diagnosis else ""
            return f"steps resumed during the diagnosis{taken}"
        if self.job.exited() or (
            diagnosis and diagnosis.ranks and all(ra.state is RankState.EXITED for ra in diagnosis.ranks)
        ):
            return "the job ended during the diagnosis"
        return None

    def _dismiss(self, reason: str, since: float | None = None) -> int | None:
        """Not a hang. The next stall is timed from now, or from ``since`` when the job showed
        activity then (steps that resumed while the diagnosis ran)."""
        self.board.count("dismissed_total")
        self.alarm.dismiss(since)
        self.say(Level.INFO, f"not a hang: {reason}")
        return None

    def _fire(self, path: Path | None, head: str, summary: str) -> int | None:
        """``path``: the hang directory, None when no directory could take the report."""
        self.alarm.fire()
        self.board.update(stalled=True)
        self.say(Level.HANG, f"HANG {head}: {summary}")
        if path is not None:
            self.say(Level.HANG, f"report: {path}/report.txt (json: {path}/report.json)")
        return self.job.on_hang(self.c.on_hang, path)


def heartbeat_details(pace: Pace, snapshot: JobSnapshot | None = None) -> tuple[str, ...]:
    """One line per heartbeat record; ranks named from the fleet or, for a wrapped job's
    own records, from the diagnosis that found them."""
    if pace.heartbeats is None or not pace.heartbeats.records:
        return ()
    where_is = pace.ranks.where_is() if pace.ranks is not None else {}
    if snapshot is not None:
        where_is.update({(LOCAL, r.process.pid): (r.process.rank, r.process.host) for r in snapshot.ranks})

    def order(item: tuple[tuple[str, int], Heartbeat]) -> tuple[bool, int, str, int]:
        rank = where_is.get(item[0], (None, None))[0]
        return rank is None, rank or 0, item[0][0], item[0][1]

    out = []
    for (node, pid), hb in sorted(pace.heartbeats.records.items(), key=order):
        rank, host = where_is.get((node, pid), (None, None))
        who = f"rank {rank} (pid {pid} on {host})" if rank is not None else f"pid {pid}"
        at = f"step {hb.step}" if hb.step is not None else f"beat {hb.beats}"
        inside = ", inside a step" if hb.in_step else ""
        out.append(f"{who}: last heartbeat {hb.age_seconds:.1f} s ago at {at}{inside}")
    return tuple(out)
