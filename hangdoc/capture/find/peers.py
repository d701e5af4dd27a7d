"""Processes that are not ranks, named by the kernel as the other end of a rank's wait (a
server it reads from, a DataLoader worker, a child): described as the ranks are, command
line redacted, with no rank. Their environment is not read: nothing in it decides anything
about them, and a server's environment holds its own secrets."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence

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


MAX_INCLUDED = 16  # processes one node names for --include (as many as a diagnosis follows)


def included_processes(
    words: Sequence[str], host: str, readable: Callable[[int], bool], exclude: Iterable[int] = ()
) -> dict[int, RankProcess]:
    """The processes whose command line contains one of ``words`` (a plain substring: no
    pattern a caller could make slow), that the caller may read, at most ``MAX_INCLUDED``."""
    if not words:
        return {}
    skip = {os.getpid(), *exclude}
    found: dict[int, RankProcess] = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        pid, cmdline = proc.info["pid"], proc.info["cmdline"] or []
        if pid in skip or not cmdline or not readable(pid):
            continue
        text = " ".join(cmdline)
        if any(word in text for word in words):
            found[pid] = RankProcess(pid=pid, host=host, rank=None, cmdline=redact_argv(cmdline))
            if len(found) >= MAX_INCLUDED:
                break
    return found
