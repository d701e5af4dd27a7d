"""Processes that are not ranks, named by the kernel as the other end of a rank's wait (a
server it reads from, a DataLoader worker, a child): described as the ranks are, command
line redacted, with no rank. Their environment is not read: nothing in it decides anything
about them, and a server's environment holds its own secrets."""

from __future__ import annotations

from collections.abc import Iterable

import psutil

from ...model import RankProcess
from .redact import redact_argv


def peer_processes(pids: Iterable[int], host: str) -> dict[int, RankProcess]:
    """The processes of ``pids`` that still run, as ``RankProcess`` values with no rank."""
    found = {}
    for pid in pids:
        try:
            cmdline = psutil.Process(pid).cmdline()
        except (psutil.Error, OSError):
            continue
        found[pid] = RankProcess(pid=pid, host=host, rank=None, cmdline=redact_argv(cmdline))
    return found
