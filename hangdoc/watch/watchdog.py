"""``hangdoc watch``: notice that a job stopped stepping, diagnose it while it is hung.

The loop ticks every check interval. Each tick drains the activity events of the
job's signals (``signals``), feeds each to the ``StallClock`` of its signal (``stall``),
and asks the clock of the most exact signal available whether the silence has grown
longer than its timeout. When it has, the full ``diagnose`` pipeline runs against the
still-hung job; ``stall.judge`` decides from its progress evidence whether that is a
hang. A hang is written to ``OUT/hang-<UTC>/`` (``incident``) and ``--on-hang`` applies.

The loop reads argparse nowhere: the CLI builds a ``WatchConfig``. Messages go through
``say``; the wrapped command's own output passes through untouched.

The wrapped job never outlives the watch by accident: whatever ends the watch (a bug, an
interrupt), the command's processes are ended before it exits.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..capture.heartbeat_files import read_dir
from ..capture.jobspec import parse_job_spec
from ..capture.pyspy import find_pyspy
from ..diagnose import CaptureOptions, diagnose
from ..errors import HangdocError, InternalError, JobNotFound, UsageError
from ..fleet.coordinator import Fleet, find_ranks
from ..fleet.node import LocalNode, Node
from ..model import Diagnosis, Heartbeat, JobSnapshot, RankState
from . import jobcontrol
from .activity import (
    EventQueue,
    HeartbeatReader,
    LogTail,
    StackProbe,
    StepPattern,
    fleet_heartbeats,
    tee,
)
from .incident import check_out, write_failed_incident, write_incident
from .metrics import MetricsBoard, serve, unix_time
from .stall import Action, Signal, StallClock, StallPolicy, Trigger, judge

LOCAL = "local"  # node name of the wrapped command's own heartbeat records
EXIT_HANG_KILLED = 124  # --on-hang kill ended the job (like timeout(1))
EXIT_JOB_ENDED = 0  # attach mode: the job's ranks are gone
EXIT_WATCH_FAILED = 70  # an internal error stopped the watch (EX_SOFTWARE); a wrapped job was ended
FLEET_REFRESH = 10.0  # attach mode: seconds between looks for restarted or ended ranks
PROBE_INTERVAL = 5.0  # default check interval when stacks have to be sampled

Say = Callable[[str], None]
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class WatchFailed(InternalError):
    """An unexpected error stopped the watch (a bug in hangdoc); a wrapped job was ended."""

    exit_code = EXIT_WATCH_FAILED


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
            raise UsageError(f"--on-hang {text!r}: cannot split it like a shell command line: "
                             f"{str(err).lower()}") from None
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
    check_interval: float | None = None  # default 1 s, or PROBE_INTERVAL when sampling stacks
    step_regex: str | None = None
    log: str | None = None
    on_hang: OnHang = OnHang()
    kill_grace: float = 10.0
    max_postpone: int = 3
    capture: CaptureOptions = field(default_factory=CaptureOptions)
    nodes: Sequence[Node] | None = None  # agents; None: this node
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))


class Watchdog:
    def __init__(self, config: WatchConfig, say: Say) -> None:
        self.c = config
        self.say = _unfailing(say)
        self.t0 = time.monotonic()
        self.queue = EventQueue()
        self.clocks = {s: StallClock(config.policy, self.t0) for s in Signal}
        self.pattern = StepPattern(config.step_regex) if config.step_regex else None
        self.board = MetricsBoard()
        self.last_step: int | None = None
        self.alarm: float | None = None  # when the current hang was confirmed
        self.moving_at = 0.0  # when a diagnosis last found the job progressing (or working)
        self.postponed = 0
        self.hooks: list[subprocess.Popen[bytes]] = []
        self.child: subprocess.Popen[bytes] | None = None
        self.fleet: Fleet | None = None
        self.heartbeats: HeartbeatReader | None = None
        self.log: LogTail | None = None
        self.probe: StackProbe | None = None
        self.signals_seen = 0
        self.fleet_checked = -FLEET_REFRESH
        self.stop_requested = False

    # ----------------------------------------------------------------- set-up

    @property
    def spec(self) -> str:
        if self.c.job:
            return self.c.job
        assert self.child is not None
        return f"pid:{self.child.pid}"

    def check_interval(self) -> float:
        if self.c.check_interval is not None:
            return self.c.check_interval
        return PROBE_INTERVAL if self.primary() is Signal.STACKS else 1.0

    def run(self) -> int:
        try:
            return self._run()
        except (HangdocError, KeyboardInterrupt):
            raise
        except Exception as err:
            if os.environ.get("HANGDOC_DEBUG"):
                raise  # the traceback, asked for
            ended = "; the wrapped command and its processes were ended" if self.child is not None else ""
            raise WatchFailed(f"internal error: {_where(err)}{ended}") from err

    def _run(self) -> int:
        if self.c.nodes is None:
            find_pyspy()  # fail before starting anything, with install help
        if self.c.metrics_port is not None:
            server = serve(self.board, self.c.metrics_host, self.c.metrics_port)
            host, port = server.server_address[:2]
            self.say(f"metrics on http://{host!s}:{port}/metrics")
        if self.c.log:
            self.log = LogTail(self.c.log, self.pattern, self.queue)
        if self.c.command:
            return self._run_wrapped()
        return self._run_attached()

    def _run_wrapped(self) -> int:
        jobcontrol.become_subreaper()
        try:
            beats = tempfile.TemporaryDirectory(prefix="hangdoc-hb-")
        except OSError as err:
            raise UsageError(f"cannot create a heartbeat directory under {tempfile.gettempdir()}: "
                             f"{err.strerror or err}", help="Set TMPDIR to a writable directory.") from None
        with beats as hb_dir:
            env = dict(self.c.env)
            env.setdefault("PYTHONUNBUFFERED", "1")  # a piped Python child would block-buffer
            env["HANGDOC_HEARTBEAT_DIR"] = hb_dir
            self.heartbeats = HeartbeatReader(lambda: self._wrapped_beats(Path(hb_dir)))
            previous = {s: signal.signal(s, self._forward) for s in FORWARDED}
            try:
                self.child = jobcontrol.start(self.c.command, env)
                self.say(f"watching {shlex.join(self.c.command)} (pid {self.child.pid}); "
                         f"reports go to {self.c.out}/")
                assert self.child.stdout is not None and self.child.stderr is not None
                readers = [tee(self.child.stdout, sys.stdout.buffer, self.pattern, self.queue),
                           tee(self.child.stderr, sys.stderr.buffer, self.pattern, self.queue)]
                code = self._loop(ended=self._wrapped_ended)
                if code is None and self.signals_seen and jobcontrol.adopted(self._hook_pids()):
                    # asked to stop: what the command left running in sessions of its own goes too
                    self.say("the command exited, leaving processes of its job running: ending them")
                    self._end_job(self.c.kill_grace)
            except BaseException as err:
                self._abandon(err)
                raise
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)
            if code is not None:
                return code
            for reader in readers:
                reader.join(timeout=2.0)
            status = jobcontrol.exit_status(self.child.returncode)
            self.say(f"command exited with status {status}")
            self._end_hooks()
            return status

    def _run_attached(self) -> int:
        assert self.c.job is not None
        job = parse_job_spec(self.c.job)
        nodes = self.c.nodes or [LocalNode()]
        self.fleet = find_ranks(nodes, job, deadline=self.c.capture.timeout + 10.0)
        self.say(f"watching {self.c.job}: {len(self.fleet.placed)} rank process(es); reports go to {self.c.out}/")
        self.heartbeats = HeartbeatReader(self._fleet_beats)
        if self.log is None:
            self.probe = StackProbe(self.fleet, self.c.capture.timeout)
        self.fleet_checked = time.monotonic()

        def ended() -> bool:
            if (self.probe is not None and self.probe.all_gone) or self._refresh_due():
                return self._refresh(nodes, job)
            return False

        code = self._loop(ended)
        if code is not None:
            return code
        self.say("the job's rank processes are gone: stopped watching")
        self._end_hooks()
        return EXIT_JOB_ENDED

    def _refresh_due(self) -> bool:
        if time.monotonic() - self.fleet_checked < FLEET_REFRESH:
            return False
        self.fleet_checked = time.monotonic()
        return True

    def _refresh(self, nodes: Sequence[Node], job) -> bool:
        """Look for the job's ranks again (restarted workers get new pids). True only when
        every node answered and none has a rank: an agent that is down is not a job that ended."""
        try:
            fleet = find_ranks(nodes, job, deadline=self.c.capture.timeout + 10.0)
        except JobNotFound as err:
            if err.unreachable:
                self.say(f"could not look for the job's ranks on {err.unreachable[0]}")
            return not err.unreachable
        except HangdocError as err:  # no node answered at all
            self.say(f"could not look for the job's ranks: {err}")
            return False
        if self.fleet is None or {p.pid for p in fleet.procs} != {p.pid for p in self.fleet.procs}:
            self.fleet = fleet
            if self.probe is not None:
                self.probe = StackProbe(fleet, self.c.capture.timeout)
        return False

    def _wrapped_ended(self) -> bool:
        assert self.child is not None
        if self.child.poll() is not None:
            return True
        if self.c.nodes is not None and self.c.job and self._refresh_due():
            # ranks on other nodes: their heartbeats come through the agents, once found
            self._refresh(self.c.nodes, parse_job_spec(self.c.job))
        return False

    def _wrapped_beats(self, directory: Path) -> dict[tuple[str, int], Heartbeat]:
        if self.c.nodes is not None:  # the agents see every node's ranks, this one's included
            return self._fleet_beats()
        return {(LOCAL, pid): beat for pid, beat in read_dir(directory).items()}

    def _fleet_beats(self) -> dict[tuple[str, int], Heartbeat]:
        return fleet_heartbeats(self.fleet, self.c.capture.timeout) if self.fleet else {}

    # ------------------------------------------------------------------- loop

    def primary(self) -> Signal:
        """The most exact signal this job gives."""
        if self.clocks[Signal.HEARTBEAT].events:
            return Signal.HEARTBEAT
        if self.pattern is not None:
            return Signal.STEP_LINE
        if self.child is not None or self.log is not None:
            return Signal.OUTPUT
        return Signal.STACKS

    def _loop(self, ended: Callable[[], bool]) -> int | None:
        """Watch until the job ends (None) or the watchdog ends it (an exit code)."""
        while True:
            tick = time.monotonic()
            self._collect()
            if self.stop_requested:
                return self._stop()
            if ended():
                return None
            now = time.monotonic()
            sig = self.primary()
            clock = self.clocks[sig]
            self._publish(sig, clock, now)
            if self.alarm is None and clock.stalled(now) and now - self.moving_at > clock.timeout().seconds:
                code = self._on_stall(sig, clock, now)
                if code is not None:
                    return code
            wake = tick + self.check_interval()
            if self.alarm is None:  # check right when the silence would pass the timeout
                last = clock.started if clock.last is None else clock.last
                due = max(last, self.moving_at) + clock.timeout().seconds + 0.02
                if due > now:
                    wake = min(wake, due)
            time.sleep(max(0.0, wake - time.monotonic()))

    def _collect(self) -> None:
        if self.log is not None:
            self.log.poll()
        events = self.queue.drain()
        if self.heartbeats is not None:
            events += self.heartbeats.poll()
        if self.probe is not None and self.primary() is Signal.STACKS:
            events += self.probe.poll()
        for event in events:
            self.clocks[event.signal].activity(event.at, event.count)
            if event.step is not None:
                self.last_step = event.step
        if any(e.signal is self.primary() for e in events):
            self.postponed = 0
        if self.alarm is not None:
            last = self.clocks[self.primary()].last
            if last is not None and last > self.alarm:
                self.say(f"activity again ({self.primary().value}) {last - self.alarm:.1f} s after the report: "
                         "watching for the next stall")
                self.alarm = None
                self.board.update(stalled=False)
        self._reap_hooks()

    def _publish(self, sig: Signal, clock: StallClock, now: float) -> None:
        self.board.update(
            signal=sig.value, steps_seen=clock.events, last_step=self.last_step,
            last_step_time=unix_time(clock.last) if clock.last is not None else None,
            step_rate=clock.rate(now), silence_seconds=clock.silence(now),
            stall_timeout_seconds=clock.timeout().seconds,
        )

    # ---------------------------------------------------------------- a stall

    def _trigger(self, sig: Signal, clock: StallClock, now: float) -> Trigger:
        timeout = clock.timeout()
        return Trigger(
            signal=sig, silence_seconds=round(clock.silence(now), 3), timeout_seconds=round(timeout.seconds, 3),
            timeout_basis=timeout.basis, check_interval=self.check_interval(), steps_seen=clock.events,
            last_step=self.last_step,
            detected_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            details=self._heartbeat_details(),
        )

    def _heartbeat_details(self, snapshot: JobSnapshot | None = None) -> tuple[str, ...]:
        """One line per heartbeat record; ranks named from the fleet or, for a wrapped job's
        own records, from the diagnosis that found them."""
        if self.heartbeats is None or not self.heartbeats.records:
            return ()
        where_is = {(node.name, p.pid): (p.rank, p.host) for node, p in self.fleet.placed} if self.fleet else {}
        if snapshot is not None:
            where_is.update({(LOCAL, r.process.pid): (r.process.rank, r.process.host) for r in snapshot.ranks})

        def order(item: tuple[tuple[str, int], Heartbeat]) -> tuple[bool, int, str, int]:
            rank = where_is.get(item[0], (None, None))[0]
            return rank is None, rank or 0, item[0][0], item[0][1]

        out = []
        for (node, pid), hb in sorted(self.heartbeats.records.items(), key=order):
            rank, host = where_is.get((node, pid), (None, None))
            who = f"rank {rank} (pid {pid} on {host})" if rank is not None else f"pid {pid}"
            at = f"step {hb.step}" if hb.step is not None else f"beat {hb.beats}"
            inside = ", inside a step" if hb.in_step else ""
            out.append(f"{who}: last heartbeat {hb.age_seconds:.1f} s ago at {at}{inside}")
        return tuple(out)

    def _on_stall(self, sig: Signal, clock: StallClock, now: float) -> int | None:
        trigger = self._trigger(sig, clock, now)
        self.board.count("suspected_total")
        self.say(f"stall suspected: {trigger.sentence()}; diagnosing {self.spec}")
        started = time.monotonic()
        try:
            snapshot, diagnosis = diagnose(self.spec, self.c.capture, None, self.c.nodes)
        except HangdocError as err:
            self.board.count_diagnosis("failed")
            if reason := self._moved_on(clock, now, None):
                return self._dismiss(clock, reason, self._resumed_at(clock, now))
            self.say(f"could not diagnose: {err}")
            path = write_failed_incident(self.c.out, self.spec, trigger, str(err), err.help, self.say)
            self.board.count("reports_total")
            return self._fire(path, "unknown", f"could not diagnose: {err}")
        self.board.count_diagnosis(diagnosis.verdict.value)
        if reason := self._moved_on(clock, now, diagnosis):
            return self._dismiss(clock, reason, self._resumed_at(clock, now))
        decision = judge(diagnosis, self.postponed, self.c.max_postpone)
        if decision.action is Action.DISMISS:
            return self._dismiss(clock, decision.reason)
        if decision.action is Action.POSTPONE:
            self.postponed += 1
            self.moving_at = time.monotonic()
            self.say(f"not yet: {decision.reason}")
            return None
        trigger = replace(trigger, details=self._heartbeat_details(snapshot) or trigger.details)
        path = write_incident(self.c.out, snapshot, diagnosis, trigger, decision.reason,
                              time.monotonic() - started, self.say)
        self.board.count("reports_total")
        culprits = diagnosis.culprit_ranks
        head = diagnosis.verdict.value + (f" (culprit ranks {', '.join(map(str, culprits))})" if culprits else "")
        return self._fire(path, head, diagnosis.summary)

    def _moved_on(self, clock: StallClock, since: float, diagnosis: Diagnosis | None) -> str | None:
        """Why the stall is over by the time the diagnosis is done, or None: steps resumed,
        or the job (or every rank the diagnosis saw) exited."""
        self._collect()  # what the job did while we looked
        if clock.last is not None and clock.last > since:
            taken = f" ({diagnosis.verdict.value} taken meanwhile)" if diagnosis else ""
            return f"steps resumed during the diagnosis{taken}"
        if (self.child is not None and self.child.poll() is not None) or (
                diagnosis and diagnosis.ranks and all(ra.state is RankState.EXITED for ra in diagnosis.ranks)):
            return "the job ended during the diagnosis"
        return None

    @staticmethod
    def _resumed_at(clock: StallClock, stalled_at: float) -> float | None:
        """When steps came back after the stall was suspected, or None."""
        return clock.last if clock.last is not None and clock.last > stalled_at else None

    def _dismiss(self, clock: StallClock, reason: str, since: float | None = None) -> int | None:
        """Not a hang. The next stall is timed from now, or from ``since`` when the job showed
        activity then (steps that resumed while the diagnosis ran)."""
        self.board.count("dismissed_total")
        self.postponed = 0
        self.moving_at = time.monotonic() if since is None else since
        self.say(f"not a hang: {reason}")
        return None

    def _fire(self, path: Path | None, head: str, summary: str) -> int | None:
        """``path``: the hang directory, None when no directory could take the report."""
        self.alarm = time.monotonic()
        self.postponed = 0
        self.board.update(stalled=True)
        self.say(f"HANG {head}: {summary}")
        if path is not None:
            self.say(f"report: {path}/report.txt (json: {path}/report.json)")
        action = self.c.on_hang
        if action.action == "kill":
            return self._kill()
        if action.action == "exec":
            if path is not None:
                self._exec_hook(path)
            else:
                self.say("could not run the --on-hang exec command: no directory could take the report")
        else:
            self.say("keeping watch (--on-hang report); the job is left as it is")
        return None

    def _kill(self) -> int:
        trees = len(self._job_roots()) if self.child is None else 1
        self.say(f"--on-hang kill: ending the job ({trees} process tree(s)), grace {self.c.kill_grace:g} s")
        self._end_job(self.c.kill_grace)
        self._end_hooks()
        return EXIT_HANG_KILLED

    def _end_job(self, grace: float) -> None:
        """End the job's process trees (never our hook commands); collect the wrapped
        command's status."""
        if self.child is not None:
            left = jobcontrol.end_command(self.child, grace, spare=self._hook_pids())
        else:
            left = jobcontrol.end_job(self._job_roots(), grace, spare=self._hook_pids())
        if left:
            self.say(f"could not end pid(s) {', '.join(map(str, left))}")

    def _abandon(self, err: BaseException) -> None:
        """The watch is leaving by an exception: the wrapped job must not outlive it."""
        if self.child is None:
            return
        cause = ("interrupted" if isinstance(err, KeyboardInterrupt) else
                 "stopping on an error" if isinstance(err, HangdocError) else "internal error")
        self.say(f"{cause}: ending the wrapped command (pid {self.child.pid}) and all its processes")
        try:
            self._end_job(self.c.kill_grace)
        except Exception:  # noqa: BLE001 - the way out must not fail: the command's group at least
            if self.child.returncode is None:
                with contextlib.suppress(OSError):
                    os.killpg(self.child.pid, signal.SIGKILL)
                self.child.wait()

    def _hook_pids(self) -> list[int]:
        return [h.pid for h in self.hooks]

    def _job_roots(self) -> list[int]:
        """Attach mode: the ranks on this node and their launchers."""
        roots: set[int] = set()
        for node, proc in self.fleet.placed if self.fleet else []:
            if isinstance(node, LocalNode):
                roots.add(proc.pid)
                if proc.launcher_pid:
                    roots.add(proc.launcher_pid)
        return sorted(roots)

    def _exec_hook(self, path: Path) -> None:
        words = list(self.c.on_hang.command)
        if any("{report}" in w for w in words):
            words = [w.replace("{report}", str(path)) for w in words]
        else:
            words.append(str(path))
        env = dict(self.c.env, HANGDOC_HANG_DIR=str(path), HANGDOC_REPORT=str(path / "report.json"))
        try:
            self.hooks.append(subprocess.Popen(words, env=env, stdin=subprocess.DEVNULL))
            self.say(f"ran --on-hang exec: {shlex.join(words)}")
        except (OSError, ValueError, subprocess.SubprocessError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            self.say(f"could not run the --on-hang exec command {words[0]!r}: {reason}; keeping watch")

    def _reap_hooks(self) -> None:
        for hook in list(self.hooks):
            if hook.poll() is not None:
                self.hooks.remove(hook)
                if hook.returncode:
                    self.say(f"--on-hang exec command exited with status {jobcontrol.exit_status(hook.returncode)}")
        if self.child is not None:
            jobcontrol.reap_orphans(keep=[self.child.pid, *(h.pid for h in self.hooks)])

    def _end_hooks(self, timeout: float = 30.0) -> None:
        """Give hook commands (a pager call) time to finish before we exit."""
        deadline = time.monotonic() + timeout
        for hook in self.hooks:
            try:
                hook.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"--on-hang exec command (pid {hook.pid}) still running; left alone")

    # ---------------------------------------------------------------- signals

    def _forward(self, signum: int, _frame: object) -> None:
        """Ctrl-C / SIGTERM / SIGHUP go to the wrapped command; a second one ends the job."""
        self.signals_seen += 1
        if self.signals_seen > 1 or self.child is None:
            self.stop_requested = True
            return
        if self.child is not None and self.child.poll() is None:
            try:
                os.killpg(self.child.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def _stop(self) -> int:
        self.say("second signal: ending the wrapped command and all its processes")
        self._end_job(grace=2.0)
        if self.child is not None and self.child.returncode is not None:
            return jobcontrol.exit_status(self.child.returncode)
        return 128 + signal.SIGTERM


def _unfailing(say: Say) -> Say:
    """``say`` that never stops the watch: a closed stderr silences it, nothing more."""

    def safe(message: str) -> None:
        try:
            say(message)
        except (OSError, ValueError):
            pass

    return safe


def _where(err: BaseException) -> str:
    """``Type: message (file:line)`` of where ``err`` was raised, for a one-line report."""
    frames = traceback.extract_tb(err.__traceback__)
    at = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    message = " ".join(str(err).split())
    return f"{type(err).__name__}: {message[:500]}{at}"


def _check_config(config: WatchConfig) -> None:
    """Numbers the loop sleeps and waits on: a NaN would crash ``time.sleep`` or never expire."""
    if config.check_interval is not None and not (math.isfinite(config.check_interval) and config.check_interval > 0):
        raise UsageError(f"--check-interval {config.check_interval!r}: need a finite number above 0")
    if not (math.isfinite(config.kill_grace) and config.kill_grace >= 0):
        raise UsageError(f"--kill-grace {config.kill_grace!r}: need a finite number, 0 or more")


def run_watch(config: WatchConfig, say: Say) -> int:
    """Watch a job (wrapped or attached) until it ends; returns the exit status."""
    if config.nodes is not None and config.on_hang.action == "kill" and not config.command:
        raise UsageError("--on-hang kill cannot end ranks on other nodes through agents",
                         help="Use --on-hang 'exec CMD' to call your scheduler (scancel, kubectl delete), "
                         "or wrap the launcher: hangdoc watch --agents ... -- srun ...")
    if not config.command and not config.job:
        raise UsageError("watch needs a JOB to attach to or a command after `--`")
    if config.command and config.nodes is not None and not config.job:
        raise UsageError("with --agents, say which job the wrapped command runs: --job HOST:PORT")
    _check_config(config)
    check_out(config.out)  # before anything is started: a report must have somewhere to go
    return Watchdog(config, say).run()
