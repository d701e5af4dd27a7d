"""The command ``hangdoc watch`` wraps: started in a session of its own, signals passed on
to it, ended whole.

Before it starts, the watchdog makes itself a child subreaper (``become_subreaper``), so a
process that double-forks away from the command is re-parented to the watchdog and is
still found when the job has to be ended; the command gets a private heartbeat directory
(``heartbeat_dir``). The first Ctrl-C, SIGTERM or SIGHUP goes to the command's process
group, as a terminal would send it; a second one kills the whole job at once
(``Forwarder``, ``Supervisor.kill_tree``: SIGKILL, ``jobcontrol.kill_job``).
Ending it otherwise means its process tree and the processes that left it, SIGTERM, a
grace period, then SIGKILL (``jobcontrol.end_job``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from ..capture.read.heartbeat_files import read_dir
from ..errors import CommandNotFound, UsageError
from ..model import Heartbeat
from .jobcontrol import adopted, end_job, exit_status, kill_job, reap_orphans

LOCAL = "local"  # node name of the records in the command's own heartbeat directory
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_CHILD_SUBREAPER = 36


def heartbeat_dir() -> tempfile.TemporaryDirectory[str]:
    """A new private heartbeat directory for the command, removed when its context ends."""
    try:
        return tempfile.TemporaryDirectory(prefix="hangdoc-hb-")
    except OSError as err:
        raise UsageError(
            f"cannot create a heartbeat directory under {tempfile.gettempdir()}: {err.strerror or err}",
            help="Set TMPDIR to a writable directory.",
        ) from None


def local_heartbeats(directory: Path) -> dict[tuple[str, int], Heartbeat]:
    """The records in the command's heartbeat directory, whoever wrote them, by (``LOCAL``, pid)."""
    return {(LOCAL, pid): beat for pid, beat in read_dir(directory).items()}


def become_subreaper() -> bool:
    """Orphaned descendants re-parent to this process instead of init (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        status: int = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        return False
    return status == 0


class Supervisor:
    """The wrapped command's process: start it, know when it ended, end it and everything
    it started (``signals``: what the watchdog is sent, passed on to it)."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = tuple(argv)
        self.child: subprocess.Popen[bytes] | None = None
        self.signals = Forwarder(self)

    def close_pipes(self) -> None:
        """Close the command's output pipes, where no reader took them."""
        if self.child is not None:
            for pipe in (self.child.stdout, self.child.stderr):
                if pipe is not None:
                    pipe.close()

    def start(self, env: Mapping[str, str], heartbeats: str) -> subprocess.Popen[bytes]:
        """Run the command in a session of its own, its output piped to us, with ``heartbeats``."""
        env = dict(env)
        env.setdefault("PYTHONUNBUFFERED", "1")  # a piped Python child would block-buffer
        env["HANGDOC_HEARTBEAT_DIR"] = heartbeats
        try:
            self.child = subprocess.Popen(
                list(self.argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True
            )
        except (FileNotFoundError, PermissionError, NotADirectoryError) as err:
            raise CommandNotFound(f"cannot run {self.argv[0]!r}: {err.strerror or err}") from None
        return self.child

    @property
    def pid(self) -> int:
        assert self.child is not None
        return self.child.pid

    def exited(self) -> bool:
        """The command has exited (its status is collected)."""
        return self.child is not None and self.child.poll() is not None

    def status(self) -> int | None:
        """Its exit status as a shell reports it (128+N: signal N); None while it runs."""
        if self.child is None or self.child.returncode is None:
            return None
        return exit_status(self.child.returncode)

    def end(self, grace: float, spare: Iterable[int] = ()) -> list[int]:
        """End everything of the command: its process tree and the processes that left it,
        never ``spare``; collect its exit status. Returns the pids still alive."""
        child = self.child
        assert child is not None
        spare = set(spare)
        # once Popen has collected the child's status its pid may belong to someone else
        roots = ([child.pid] if child.poll() is None else []) + adopted(spare | {child.pid})
        left = end_job(roots, grace, spare=spare, owned=[child.pid])
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            left.append(child.pid)
        return left

    def kill_tree(self, spare: Iterable[int] = ()) -> list[int]:
        """SIGKILL everything of the command now (a second Ctrl-C), never ``spare``; collect
        its exit status. Returns the pids still alive."""
        child = self.child
        assert child is not None
        spare = set(spare)
        roots = ([child.pid] if child.poll() is None else []) + adopted(spare | {child.pid})
        left = kill_job(roots, spare=spare, owned=[child.pid])
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            left.append(child.pid)
        return left

    def kill(self) -> None:
        """SIGKILL the command's process group and collect it: the way out that cannot fail."""
        assert self.child is not None
        if self.child.returncode is None:
            with contextlib.suppress(OSError):
                os.killpg(self.child.pid, signal.SIGKILL)
            self.child.wait()

    def reap(self, spare: Iterable[int] = ()) -> None:
        """Collect the status of re-parented descendants that died (never ``spare``)."""
        if self.child is not None:
            reap_orphans(keep=[self.child.pid, *spare])


class Forwarder:
    """Ctrl-C, SIGTERM and SIGHUP sent to the watchdog: the first goes to the command's
    process group, as a terminal would send it; a second one (or one before the command
    started) asks the watch to end the whole job.

    ``notify(signum, seen)``, when set, is told of each signal once the command runs, in a
    thread of its own: a handler runs in the main thread between two of its bytecodes,
    which may be in the middle of a write to stderr (a reentrant write fails), or of a
    diagnosis that takes seconds; the thread says what happens, and acts, at once."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.seen = 0
        self.last: int | None = None  # the last signal's number
        self.stop_requested = False  # the watch loop ends the job at its next check
        self.notify: Callable[[int, int], None] | None = None

    def forward(self, signum: int, _frame: object) -> None:
        child = self.supervisor.child
        self.seen += 1
        self.last = signum
        if self.seen > 1 or child is None:
            self.stop_requested = True
        elif child.poll() is None:
            try:
                os.killpg(child.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass
        if child is not None and self.notify is not None:
            threading.Thread(target=self.notify, args=(signum, self.seen), name="hangdoc-signal", daemon=True).start()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Signals go to ``forward`` inside; to the previous handlers again after."""
        previous = {s: signal.signal(s, self.forward) for s in FORWARDED}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
