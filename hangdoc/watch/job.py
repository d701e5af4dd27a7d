"""The watched job as the watchdog acts on it: the spec a diagnosis runs against,
``--on-hang`` once a hang is reported, and the ways it is ended (``--on-hang kill``, a
second signal, a watch that stops on an error).

A wrapped job is its ``Supervisor``'s command (its processes wherever they went); an
attached job is the ranks on this node and their launchers (``TrackedRanks``). The ``--on-hang
exec`` commands are never ended with it. The wrapped job never outlives the watch by
accident: ``abandon`` ends it whatever stops the watch.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from ..capture.find.jobspec import parse_job_spec
from ..errors import HangdocError
from ..model import counted
from .config import Level, OnHang, Say
from .hooks import Hooks
from .jobcontrol import adopted, end_job
from .supervisor import Supervisor
from .tracked import TrackedRanks

EXIT_HANG_KILLED = 124  # --on-hang kill ended the job (like timeout(1))


class Job:
    """The wrapped command (``supervisor``) or the attached ``ranks``, to name and to end."""

    def __init__(
        self,
        spec: str | None,
        supervisor: Supervisor | None,
        ranks: TrackedRanks | None,
        hooks: Hooks,
        grace: float,
        say: Say,
    ) -> None:
        self._spec = spec  # given; else the wrapped command's pid
        self.supervisor = supervisor
        self.ranks = ranks
        self.hooks = hooks
        self.grace = grace  # --kill-grace
        self.say = say
        self._killing = threading.Lock()

    @property
    def spec(self) -> str:
        if self._spec:
            return self._spec
        assert self.supervisor is not None
        return f"pid:{self.supervisor.pid}"

    def exited(self) -> bool:
        """The wrapped command has exited."""
        return self.supervisor is not None and self.supervisor.exited()

    def end(self, grace: float) -> None:
        """End the job's process trees, never the hook commands; collect the command's status."""
        if (sup := self._started()) is not None:
            left = sup.end(grace, spare=self.hooks.pids())
        else:
            left = end_job(self._roots(), grace, spare=self.hooks.pids())
        if left:
            self.say(Level.ERROR, f"could not end {counted(len(left), 'pid')} {', '.join(map(str, left))}")

    def kill(self) -> int:
        """``--on-hang kill``: end the job, wait for the hook commands; the exit status."""
        trees = counted(1 if self._started() else len(self._roots()), "process tree")
        self.say(Level.INFO, f"--on-hang kill: ending the job ({trees}), grace {self.grace:g} s")
        self.end(self.grace)
        self.hooks.end()
        return EXIT_HANG_KILLED

    def on_hang(self, action: OnHang, path: Path | None) -> int | None:
        """``--on-hang`` for a hang reported in ``path`` (None: no directory took it)."""
        if action.action == "kill":
            return self.kill()
        if action.action == "exec":
            if path is not None:
                self.hooks.start(path, parse_job_spec(self.spec).job_id)
            else:
                self.say(Level.ERROR, "could not run the --on-hang exec command: no directory could take the report")
        else:
            self.say(Level.INFO, "keeping watch (--on-hang report); the job is left as it is")
        return None

    def kill_now(self) -> None:
        """A second signal: SIGKILL the whole job at once (never the hook commands). Safe to
        call twice at the same time (the signal's thread and the loop): one kills, the
        other finds it done."""
        sup = self._started()
        if sup is None:
            return
        with self._killing:
            if sup.exited() and not adopted(self.hooks.pids()):
                return
            self.say(Level.STOP, f"killing the wrapped command (pid {sup.pid}) and all its processes now (SIGKILL)")
            left = sup.kill_tree(spare=self.hooks.pids())
        if left:
            self.say(Level.ERROR, f"could not end {counted(len(left), 'pid')} {', '.join(map(str, left))}")

    def stop(self) -> int:
        """A second signal: kill the whole job now; the command's status, else 137."""
        self.kill_now()
        status = self.supervisor.status() if self.supervisor is not None else None
        return status if status is not None else 128 + signal.SIGKILL

    def abandon(self, err: BaseException) -> None:
        """The watch is leaving by an exception: the wrapped job must not outlive it."""
        sup = self._started()
        if sup is None:
            return
        cause = (
            "interrupted"
            if isinstance(err, KeyboardInterrupt)
            else "stopping on an error"
            if isinstance(err, HangdocError)
            else "internal error"
        )
        self.say(Level.STOP, f"{cause}: ending the wrapped command (pid {sup.pid}) and all its processes")
        try:
            self.end(self.grace)
        except Exception:  # noqa: BLE001 - the way out must not fail: the command's group at least
            sup.kill()

    def _started(self) -> Supervisor | None:  # the wrapped command's, once it started
        return self.supervisor if self.supervisor is not None and self.supervisor.child is not None else None

    def _roots(self) -> list[int]:
        """Attach mode: the ranks on this node and their launchers."""
        return self.ranks.roots() if self.ranks is not None else []
