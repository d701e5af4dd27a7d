"""``hangdoc watch``: notice that a job stopped stepping, diagnose it while it is hung.

``run_watch`` checks a ``WatchConfig`` (``config``; the CLI builds it, the watch reads
argparse nowhere) and runs a ``Watchdog``. The watchdog builds the parts of one watch and
wires them: the job's activity and stall clocks (``pace``), the ``Loop`` that checks them
(``loop``) and what it does about a stall (``respond``), the job to name and to end
(``job``), the ``--on-hang exec`` commands (``hooks``) and the metrics page (``metrics``).
It then runs one of two ways: ``WrappedRun`` starts the command after ``--``
(``supervisor``) and passes its output through untouched; ``AttachedRun`` watches the rank
processes of a running job (``tracked``). Messages go through ``say``.

A bug in hangdoc (an internal error) never harms the job beyond what ``--on-hang`` asks.
One while responding to a stall is contained there (``respond``): one line, the report
that could be written, ``--on-hang`` as for any hang, and the watch goes on. One anywhere
else in the wrapped watch's loop stops the watching, not the job: the watchdog says so in
one line and goes on passing the command's output and signals through until it exits
(``WrappedRun._unwatched``), then exits with its status. The wrapped job still never
outlives the watch by accident: whatever else ends the watch (an interrupt that reaches it,
an error before the loop), the command's processes are ended before it exits
(``Job.abandon``); an unexpected error is then one line, ``WatchFailed``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

from ..capture.find.jobspec import parse_job_spec
from ..capture.read.pyspy import find_pyspy
from ..errors import HangdocError, InternalError, described
from ..fleet.coordinator import Fleet, find_ranks
from ..fleet.node import LocalNode
from ..model import Heartbeat, counted
from .activity import HeartbeatSource, tee
from .config import Level, OnHang, Say, WatchConfig, check_config, messages
from .hooks import Hooks
from .incident import check_out
from .job import EXIT_HANG_KILLED, Job
from .jobcontrol import adopted
from .loop import Loop
from .metrics import MetricsBoard, Textfile, identity, serve, textfile_path
from .pace import Pace
from .still import EarlyLook
from .supervisor import Supervisor, become_subreaper, heartbeat_dir, local_heartbeats
from .tracked import TrackedRanks

__all__ = [
    "EXIT_HANG_KILLED",
    "EXIT_JOB_ENDED",
    "EXIT_WATCH_FAILED",
    "OnHang",
    "WatchConfig",
    "WatchFailed",
    "Watchdog",
    "run_watch",
]

EXIT_JOB_ENDED = 0  # attach mode: the job's ranks are gone
EXIT_WATCH_FAILED = 70  # an internal error stopped the watch (EX_SOFTWARE)


class WatchFailed(InternalError):
    """An unexpected error stopped the watch (a bug in hangdoc): an attached job is left as it
    is; a wrapped one, before its watch loop ran, was ended."""

    exit_code = EXIT_WATCH_FAILED


class Watchdog:
    """One watch: its parts, wired, run the wrapped or the attached way."""

    def __init__(self, config: WatchConfig, say: Say) -> None:
        self.c = config
        self.say = _unfailing(say)
        started = time.monotonic()
        self.board = MetricsBoard(identity(config.job, config.env))
        self.supervisor = Supervisor(config.command) if config.command else None
        self.ranks = _ranks(config, self.say)
        self.pace = Pace(config, started, self.ranks)
        self.hooks = Hooks(config.on_hang.command, config.env, self.say)
        self.job = Job(config.job, self.supervisor, self.ranks, self.hooks, config.kill_grace, self.say)
        early = config.policy.early
        self.early = EarlyLook(self._fleet, config.capture.timeout, config.policy.first_step_timeout) if early else None
        self.loop = Loop(config, self.say, self.board, self.pace, self.job, self.hooks, self.early)

    def _fleet(self) -> Fleet | None:
        """The job's ranks now, for the first-step rule: those tracked, or a wrapped job's
        found again each time (its launcher starts them late, and restarts them)."""
        if self.ranks is not None:
            return self.ranks.fleet
        return find_ranks(self.c.nodes or [LocalNode()], parse_job_spec(self.job.spec), self.c.capture.timeout + 10.0)

    def rule(self) -> str:
        """What a hang is, for the line that starts the watch."""
        return f"a hang is {self.c.policy.words(self.pace.primary())}"

    def run(self) -> int:
        try:
            return self._run()
        except (HangdocError, KeyboardInterrupt):
            raise
        except Exception as err:
            if os.environ.get("HANGDOC_DEBUG"):
                raise  # the traceback, asked for
            started = self.supervisor is not None and self.supervisor.child is not None
            ended = "; the wrapped command and its processes were ended" if started else ""
            raise WatchFailed(f"internal error: {described(err)}{ended}") from err

    def _run(self) -> int:
        if self.c.nodes is None and self.c.source is None:
            find_pyspy()  # fail before starting anything, with install help
        with contextlib.ExitStack() as held:
            if self.c.source is not None:
                # held for the whole watch: a ray: job's agents stay placed, and are removed
                # however the watch ends
                assert self.ranks is not None
                self.ranks.finder = held.enter_context(self.c.source(messages(self.say)))
            return self._watch(held)

    def _watch(self, held: contextlib.ExitStack) -> int:
        if self.c.metrics_port is not None:
            server = serve(self.board, self.c.metrics_host, self.c.metrics_port)
            host, port = server.server_address[:2]
            self.say(Level.INFO, f"metrics on http://{host!s}:{port}/metrics")
        if self.c.metrics_textfile is not None:
            textfile = Textfile(self.board, textfile_path(self.c.metrics_textfile), self.say)
            textfile.open()
            held.callback(textfile.close)  # however the watch ends
            self.say(Level.INFO, f"metrics written to {textfile.path}")
        if self.c.log:
            self.pace.follow(self.c.log)
            held.callback(self.pace.close)
        if self.supervisor is not None:
            return WrappedRun(self, self.supervisor).run()
        assert self.ranks is not None
        return AttachedRun(self, self.ranks).run()


class WrappedRun:
    """The command after ``--``, watched from its start to its exit status."""

    def __init__(self, dog: Watchdog, supervisor: Supervisor) -> None:
        self.c, self.say, self.pace, self.loop = dog.c, dog.say, dog.pace, dog.loop
        self.job, self.hooks, self.ranks, self.rule = dog.job, dog.hooks, dog.ranks, dog.rule
        self.supervisor = supervisor

    def run(self) -> int:
        sup = self.supervisor
        sup.signals.notify = self._signalled
        become_subreaper()
        with heartbeat_dir() as hb_dir:
            self.pace.heartbeats = HeartbeatSource(lambda: self._beats(Path(hb_dir)))
            with sup.signals.installed():
                readers: list[threading.Thread] | None = None
                try:
                    child = sup.start(self.c.env, hb_dir)
                    self.say(
                        Level.INFO,
                        f"watching {shlex.join(self.c.command)} (pid {child.pid}): {self.rule()}; "
                        f"reports go to {self.c.out}/",
                    )
                    assert child.stdout is not None and child.stderr is not None
                    readers = [
                        tee(child.stdout, sys.stdout.buffer, self.pace.pattern, self.pace.queue, self.say),
                        tee(child.stderr, sys.stderr.buffer, self.pace.pattern, self.pace.queue, self.say),
                    ]
                    try:
                        code = self.loop.run(self._ended)
                    except Exception as err:
                        if os.environ.get("HANGDOC_DEBUG"):
                            raise  # the traceback, asked for (and the job ended with the watch)
                        code = self._unwatched(err)
                    if code is None and sup.signals.seen and adopted(self.hooks.pids()):
                        # asked to stop: what the command left running in sessions of its own goes too
                        self.say(Level.INFO, "the command exited, leaving processes of its job running: ending them")
                        self.job.end(self.c.kill_grace)
                except BaseException as err:
                    self.job.abandon(err)
                    if readers is None:  # once started, the tees own and close the pipes
                        sup.close_pipes()
                    raise
            if code is not None:
                return code
            assert readers is not None
            for reader in readers:
                reader.join(timeout=2.0)
            status = sup.status()
            assert status is not None
            if sup.signals.last is not None:  # after the launcher's own words on the signal, ours
                name = signal.Signals(sup.signals.last).name
                self.say(Level.STOP, f"stopped: the command exited with status {status} after {name}")
            else:
                self.say(Level.INFO, f"command exited with status {status}")
            self.hooks.end()
            return status

    def _signalled(self, signum: int, seen: int) -> None:
        """A signal to the watchdog, told from a thread of its own (``Forwarder``): the first
        was passed to the command, say so and what comes next; a second kills the job now."""
        name = signal.Signals(signum).name
        if seen == 1:
            self.say(
                Level.STOP,
                f"stopping: {name} passed to the command (pid {self.supervisor.pid}), which ends its job its own "
                "way (a launcher may give its workers time to exit: torchrun up to 30 s, with a traceback of "
                "the signal); signal again (Ctrl-C) to kill the whole job now",
            )
        elif seen == 2:
            self.job.kill_now()

    def _unwatched(self, err: Exception) -> int | None:
        """A bug stopped the watch loop: leave the job alone, its output and signals still
        passed through, until the command exits (None) or a second signal ends it (its code)."""
        sup = self.supervisor
        self.say(
            Level.ERROR,
            f"internal error: {described(err)}; no longer watching for hangs: the job is "
            "left running, its output and signals passed through until it exits",
        )
        while not sup.exited():
            if sup.signals.stop_requested:
                return self.job.stop()
            time.sleep(0.2)
        return None

    def _ended(self) -> bool:
        if self.supervisor.exited():
            return True
        if self.ranks is not None and self.ranks.due():
            # ranks on other nodes: their heartbeats come through the agents, once found
            self.ranks.refresh()
        return False

    def _beats(self, directory: Path) -> dict[tuple[str, int], Heartbeat]:
        if self.c.nodes is not None:  # the agents see every node's ranks, this one's included
            return self.ranks.heartbeats() if self.ranks is not None else {}
        return local_heartbeats(directory)


class AttachedRun:
    """A running job's rank processes, watched until they are gone."""

    def __init__(self, dog: Watchdog, ranks: TrackedRanks) -> None:
        self.c, self.say, self.pace, self.loop, self.hooks = dog.c, dog.say, dog.pace, dog.loop, dog.hooks
        self.ranks, self.rule = ranks, dog.rule

    def run(self) -> int:
        fleet = self.ranks.find()
        found = counted(len(fleet.placed), "rank process", "rank processes")
        self.say(Level.INFO, f"watching {self.c.job} ({found}): {self.rule()}; reports go to {self.c.out}/")
        self.pace.heartbeats = HeartbeatSource(self.ranks.heartbeats)
        self.ranks.start()
        code = self.loop.run(self.ranks.gone)
        if code is not None:
            return code
        self.say(Level.INFO, "the job's rank processes are gone: stopped watching")
        self.hooks.end()
        return EXIT_JOB_ENDED


def _ranks(config: WatchConfig, say: Say) -> TrackedRanks | None:
    """The job's ranks to look for: an attached job's (on this node unless agents are
    given), or a wrapped job's named with ``--job`` and found through ``--agents``."""
    if not config.job:
        return None
    if not config.command:
        nodes = [] if config.source is not None else config.nodes or [LocalNode()]
        return TrackedRanks(nodes, config.job, config.capture.timeout, say, sample=not config.log)
    if config.nodes is not None:
        return TrackedRanks(config.nodes, config.job, config.capture.timeout, say)
    return None


def _unfailing(say: Say) -> Say:
    """``say`` that never stops the watch: a closed stderr silences it, nothing more."""

    def safe(level: Level, message: str) -> None:
        try:
            say(level, message)
        except (OSError, ValueError):
            pass

    return safe


def run_watch(config: WatchConfig, say: Say) -> int:
    """Watch a job (wrapped or attached) until it ends; returns the exit status."""
    check_config(config)
    check_out(config.out)  # before anything is started: a report must have somewhere to go
    return Watchdog(config, say).run()
