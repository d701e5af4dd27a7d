"""Ending a job whole: every process of it, in every session it made.

torchrun starts each worker in a session of its own, so signalling the launcher's process
group is not enough. ``end_job`` signals every process group in the job's process trees,
waits a grace period, then SIGKILLs whatever is left, looking for descendants again each
time. The watchdog, its ancestors and the processes it is told to spare (the ``--on-hang
exec`` commands) are never signalled. The watchdog uses this only to act when the user
asked for it (``--on-hang kill``; a second Ctrl-C: ``kill_job``, SIGKILL at once) or to leave nothing of a wrapped job
running when the watch itself stops (``Supervisor``, which makes the watchdog a child
subreaper: what double-forks away from the wrapped command is re-parented to it and found
by ``adopted``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable

import psutil


def exit_status(returncode: int) -> int:
    """A Popen return code as a shell reports it (128+N for death by signal N)."""
    return 128 - returncode if returncode < 0 else returncode


def _tree(roots: Iterable[int], exclude: set[int]) -> dict[int, psutil.Process]:
    found: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            members = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in members:
            if p.pid not in exclude:
                found.setdefault(p.pid, p)
    return found


def _alive(p: psutil.Process) -> bool:
    try:
        alive: bool = p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
    return alive


def _protected() -> set[int]:
    """This process and its ancestors: never signalled, whatever the tree says."""
    out = {os.getpid()}
    try:
        out.update(p.pid for p in psutil.Process().parents())
    except psutil.Error:
        pass
    return out


def _send(procs: Iterable[psutil.Process], sig: signal.Signals) -> None:
    """``sig`` once to each process: to its whole group, or to it alone when it is in ours.
    Once: torchrun, signalled again while it handles the first SIGTERM, prints a second
    traceback ("--- Logging error ---") on top of its own."""
    own_group = os.getpgrp()
    groups: set[int] = set()
    for p in procs:
        try:
            pgid = os.getpgid(p.pid)
            if pgid == own_group:
                p.send_signal(sig)
            elif pgid not in groups:
                groups.add(pgid)
                os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue


def reap_orphans(keep: Iterable[int] = ()) -> None:
    """Collect the exit status of re-parented descendants that died (never ``keep``)."""
    kept = set(keep)
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    for child in children:
        if child.pid in kept:
            continue
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError, OSError):
            continue


def adopted(spare: Iterable[int] = ()) -> list[int]:
    """Our child processes but ``spare``: as a subreaper, the processes that left the wrapped
    command's tree (double forks, workers whose launcher died) are among them."""
    skip = set(spare)
    try:
        return [p.pid for p in psutil.Process().children() if p.pid not in skip and _alive(p)]
    except psutil.Error:
        return []


def end_job(roots: Iterable[int], grace: float, spare: Iterable[int] = (), owned: Iterable[int] = ()) -> list[int]:
    """SIGTERM every process group of the trees under ``roots``, SIGKILL what is left after
    ``grace`` seconds. Returns the pids still alive afterwards (empty when it worked).
    ``spare``: processes not to signal (our hook commands); ``owned``: our children whose
    exit status a ``Popen`` collects, so they are not reaped here."""
    roots = list(roots)
    spare = set(spare)
    keep = spare | set(owned)
    exclude = _protected() | spare
    procs = _tree(roots, exclude)
    _send(procs.values(), signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        reap_orphans(keep)
        procs.update(_tree([p for p in procs if _alive(procs[p])], exclude))
        if not any(_alive(p) for p in procs.values()):
            return []
        time.sleep(0.1)
    return _kill(procs, exclude, keep)


def kill_job(roots: Iterable[int], spare: Iterable[int] = (), owned: Iterable[int] = ()) -> list[int]:
    """SIGKILL every process group of the trees under ``roots`` now, without a grace period
    (a second Ctrl-C). The trees are walked through psutil before anything is signalled:
    workers in sessions of their own are found under their launcher while it still lives.
    Returns the pids still alive afterwards; ``spare`` and ``owned`` as for ``end_job``."""
    spare = set(spare)
    exclude = _protected() | spare
    return _kill(_tree(list(roots), exclude), exclude, spare | set(owned))


def _kill(procs: dict[int, psutil.Process], exclude: set[int], keep: set[int]) -> list[int]:
    """SIGKILL ``procs`` and what they started meanwhile, up to three times; the pids left."""
    for _ in range(3):
        procs.update(_tree([p for p in procs if _alive(procs[p])], exclude))
        _send([p for p in procs.values() if _alive(p)], signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            reap_orphans(keep)
            if not any(_alive(p) for p in procs.values()):
                return []
            time.sleep(0.05)
    return sorted(p.pid for p in procs.values() if _alive(p))
