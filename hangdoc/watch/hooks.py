"""``--on-hang 'exec CMD [ARGS]'``: the commands run when a hang is reported.

Each is started in the background, not through a shell, with the hang directory in its
environment (``HANGDOC_HANG_DIR``, ``HANGDOC_REPORT``) and in its arguments: where they
say ``{report}``, else appended, unless they name the job instead: ``{job}`` is the job's
id (the Slurm or Ray job id, else the job spec: ``ray job stop {job}``, ``scancel {job}``),
also in ``HANGDOC_JOB``. The watch goes on. Their exit is collected at every check (a
non-zero status is said), ending the job never signals them, and the watchdog waits for
them before it exits.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .config import Level, Say
from .jobcontrol import exit_status


class Hooks:
    """The ``--on-hang exec`` commands started and not yet seen to exit."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str], say: Say) -> None:
        self.command = tuple(command)
        self.env = env
        self.say = say
        self.running: list[subprocess.Popen[bytes]] = []

    def pids(self) -> list[int]:
        return [h.pid for h in self.running]

    def start(self, path: Path, job: str) -> None:
        """Run the command for the hang directory ``path`` of job ``job`` (its id); one line
        when it cannot run."""
        words = [w.replace("{job}", job) for w in self.command]
        if any("{report}" in w for w in words):
            words = [w.replace("{report}", str(path)) for w in words]
        elif not any("{job}" in w for w in self.command):  # a command about the job takes no path
            words.append(str(path))
        env = dict(self.env, HANGDOC_HANG_DIR=str(path), HANGDOC_REPORT=str(path / "report.json"), HANGDOC_JOB=job)
        try:
            self.running.append(subprocess.Popen(words, env=env, stdin=subprocess.DEVNULL))
            self.say(Level.INFO, f"ran --on-hang exec: {shlex.join(words)}")
        except (OSError, ValueError, subprocess.SubprocessError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            self.say(Level.ERROR, f"could not run the --on-hang exec command {words[0]!r}: {reason}; keeping watch")

    def reap(self) -> None:
        """Collect the commands that exited; say a non-zero status."""
        for hook in list(self.running):
            if hook.poll() is not None:
                self.running.remove(hook)
                if hook.returncode:
                    self.say(Level.WARNING, f"--on-hang exec command exited with status {exit_status(hook.returncode)}")

    def end(self, timeout: float = 30.0) -> None:
        """Give the commands (a pager call) ``timeout`` seconds in all to finish before we exit."""
        deadline = time.monotonic() + timeout
        for hook in self.running:
            try:
                hook.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(Level.INFO, f"--on-hang exec command (pid {hook.pid}) still running; left alone")
