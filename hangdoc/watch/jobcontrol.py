"""Start the command ``hangdoc watch`` wraps, pass signals on to it, and end a job whole.

Only the watchdog uses this, and only to act when the user asked for it (``--on-hang
kill``), to pass on a Ctrl-C, or to leave nothing of a wrapped job running when the watch
itself stops on an error. Ending a job means every process of it: torchrun starts
each worker in a session of its own, so signalling the launcher's process group is not
enough. We signal every process group in the job's process tree, wait a grace period,
then SIGKILL whatever is left, looking for descendants again each time. The watchdog
makes itself a child subreaper, so a process that double-forks away from the wrapped
command is re-parented to us and is still found.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence

import psutil

from ..errors import CommandNotFound

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphaned descendants re-parent to this process instead of init (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def start(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Run ``argv`` in a session of its own with its stdout/stderr piped to us."""
    try:
        return subprocess.Popen(
            list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=dict(env), start_new_session=True,
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as err:
        raise CommandNotFound(f"cannot run {argv[0]!r}: {err.strerror or err}") from None


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
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _protected() -> set[int]:
    """This process and its ancestors: never signalled, whatever the tree says."""
    out = {os.getpid()}
    try:
        out.update(p.pid for p in psutil.Process().parents())
    except psutil.Error:
        pass
    return out


def _send(procs: Iterable[psutil.Process], sig: signal.Signals) -> None:
    own_group = os.getpgrp()
    groups: set[int] = set()
    for p in procs:
        try:
            pgid = os.getpgid(p.pid)
            if pgid != own_group and pgid not in groups:
                groups.add(pgid)
                os.killpg(pgid, sig)
            p.send_signal(sig)
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


def end_command(child: subprocess.Popen[bytes], grace: float, spare: Iterable[int] = ()) -> list[int]:
    """End everything of the wrapped command: its process tree and the processes that left
    it, never ``spare``; collect ``child``'s exit status. Returns the pids still alive."""
    spare = set(spare)
    # once Popen has collected the child's status its pid may belong to someone else
    roots = ([child.pid] if child.poll() is None else []) + adopted(spare | {child.pid})
    left = end_job(roots, grace, spare=spare, owned=[child.pid])
    try:
        child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        left.append(child.pid)
    return left


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
