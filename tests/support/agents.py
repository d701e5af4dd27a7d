"""Real ``hangdoc agent`` processes for the tests: started, found listening, stopped.

An ``Agent`` owns its process and the log file the agent writes its stderr to: ``stop()``
(SIGTERM, then SIGKILL) or ``close()`` (SIGKILL) ends the process and its descendants,
reaps it and closes the log, and ``with start_agent(...) as a:`` closes it whatever happens.
The log stays on disk (``agent-*.log`` in the directory given) for the test to read.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import psutil

from .paths import REPO


class Agent:
    def __init__(self, proc: subprocess.Popen, port: int, log: IO[str]) -> None:
        self.proc, self.port, self.log = proc, port, log

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        """Send ``sig``, wait up to ``timeout`` s for the exit (SIGKILL after), close the log;
        returns the exit status."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
                with suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=timeout)
        finally:
            self.close()
        assert self.proc.returncode is not None
        return self.proc.returncode

    def close(self) -> None:
        """SIGKILL the agent and whatever it started if it still runs, reap it, close the log;
        idempotent."""
        try:
            _kill_with_descendants(self.proc)
        finally:
            self.log.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _kill_with_descendants(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            children = []
        proc.kill()
        for child in children:
            with suppress(psutil.Error):
                child.kill()
    proc.wait()


def start_agent(tmp: Path, *args: str, wrapper: Sequence[str] = ()) -> Agent:
    """``wrapper``: a command the agent runs under (``prlimit --nofile=256 --``)."""
    log = (tmp / f"agent-{time.monotonic_ns()}.log").open("w+")
    try:
        proc = subprocess.Popen(
            [*wrapper, sys.executable, "-m", "hangdoc", "agent", *args],
            stderr=log,
            stdout=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
        )
    except BaseException:
        log.close()
        raise
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            log.seek(0)
            m = re.search(r"listening on port (\d+)", log.read())
            if m:
                return Agent(proc, int(m.group(1)), log)
            if proc.poll() is not None:
                log.seek(0)
                raise AssertionError(f"agent exited {proc.returncode}: {log.read()}")
            time.sleep(0.1)
        raise AssertionError("agent did not start")
    except BaseException:
        Agent(proc, 0, log).close()
        raise


@contextmanager
def running_agent(tmp: Path, *args: str) -> Iterator[Agent]:
    """An agent for the block; SIGTERM at its end (SIGKILL if it does not stop)."""
    a = start_agent(tmp, *args)
    try:
        yield a
    finally:
        a.stop()
