"""Real ``hangdoc agent`` processes for the tests: started, found listening, stopped."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from .paths import REPO


class Agent:
    def __init__(self, proc: subprocess.Popen, port: int) -> None:
        self.proc, self.port = proc, port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def start_agent(tmp: Path, *args: str, wrapper: Sequence[str] = ()) -> Agent:
    """``wrapper``: a command the agent runs under (``prlimit --nofile=256 --``)."""
    log = (tmp / f"agent-{time.monotonic_ns()}.log").open("w+")
    proc = subprocess.Popen([*wrapper, sys.executable, "-m", "hangdoc", "agent", *args], stderr=log,
                            stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, cwd=REPO)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        log.seek(0)
        m = re.search(r"listening on port (\d+)", log.read())
        if m:
            return Agent(proc, int(m.group(1)))
        if proc.poll() is not None:
            log.seek(0)
            raise AssertionError(f"agent exited {proc.returncode}: {log.read()}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("agent did not start")


@contextmanager
def running_agent(tmp: Path, *args: str) -> Iterator[Agent]:
    """An agent for the block; SIGTERM at its end (SIGKILL if it does not stop)."""
    a = start_agent(tmp, *args)
    try:
        yield a
    finally:
        a.proc.send_signal(signal.SIGTERM)
        try:
            a.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            a.proc.kill()
            a.proc.wait()
