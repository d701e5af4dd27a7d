"""Run ``py-spy dump --json`` on a process and turn its answer into model ThreadStacks.

py-spy prints one JSON list of threads, each with frames *innermost first*; the model
stores them outermost first. Failures become a ``CaptureError`` with a kind a caller can
act on (process gone, ptrace refused, not Python, timeout, py-spy missing) instead of
py-spy's words. ``start_dump`` starts py-spy and returns at once, so a sampling round
starts one py-spy per process and then collects them all.

py-spy runs in its default blocking mode: it pauses the target for the few milliseconds
the dump takes, so that every thread's stack is read at the same instant and is not torn.
``nonblocking=True`` is available for targets that must not be paused (or that are
already stopped, where blocking mode cannot attach).
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import IO, Any, NamedTuple

import psutil

from ...errors import PySpyMissing
from ...model import (
    GRAPH_CODE,
    MAX_LINES_BEFORE,
    CaptureError,
    CaptureErrorKind,
    Frame,
    FrameLocals,
    Origin,
    ThreadStack,
    frame_origin,
)
from .sourcefs import SourceReader

# Arguments worth keeping (with --locals), and only in torch.distributed's own frames: what
# a p2p or collective call was asked to do (peers, tags, the group's name), and the world
# size and rank ``init_process_group`` was given in code. A value is kept only as a number,
# None, a boolean or a bare type name (``_clean``): a string the job holds never leaves the
# node, and addresses (which differ per process) are dropped.
LOCAL_NAMES = frozenset(
    (
        "dst",
        "src",
        "group_dst",
        "group_src",
        "global_dst",
        "global_src",
        "peer",
        "tag",
        "async_op",
        "group",
        "group_name",
        "group_size",
        "group_rank",
        "rank",
        "world_size",
    )
)
_TORCH_DIST = "torch/distributed/"
# The code torch.fx generates for a compiled graph (``model.GRAPH_CODE``) has the graph's
# nodes as its locals, named after their ops (``_N`` added to repeats). The functional
# collectives' ops (``torch.ops._c10d_functional``):
GRAPH_COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_reduce_coalesced",
        "all_gather_into_tensor",
        "all_gather_into_tensor_coalesced",
        "reduce_scatter_tensor",
        "reduce_scatter_tensor_coalesced",
        "all_to_all_single",
        "broadcast",
        "wait_tensor",
    }
)
_NODE_SUFFIX = re.compile(r"_[0-9]+$")
# torch wraps its public c10d functions (``_exception_logger``) in a frame whose ``args``
# and ``kwargs`` are the call as the caller made it, before c10d replaces ``group=None``
# with the default group: the one place that tells "no group given" (WORLD) apart.
_CALL_WRAPPER = "torch/distributed/c10d_logger.py"
_TYPE = re.compile(r"<(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*)(?: at 0x[0-9a-fA-F]+| object)?>")
_LITERAL = re.compile(r"-?[0-9]{1,20}|None|True|False", re.ASCII)
_GROUP_NAME = re.compile(r'"([\w.:-]{1,64})"', re.ASCII)
_GROUP_KWARG = re.compile(r'"group":\s*(None|<[^>]*ProcessGroup[^>]*>)')
DEFAULT_GROUP = "(default)"  # the wrapper shows no group argument: the call is on WORLD
# A ``with`` block's ``__exit__`` (any code's) keeps one thing: the type of the exception it
# was called with, or None for the block's normal end. That tells a with-block that unwinds
# an error (cleanup) from one that simply ends.
_EXIT_METHODS = ("__exit__", "__aexit__")
_INSTANCE = re.compile(r"<([A-Za-z_]\w*) at 0x[0-9a-fA-F]+>")

# py-spy's words for a refused ptrace and for a process without a Python it can find (also
# read from dump files, ``dumped.capture_error``)
DENIED_WORDS = (
    "permission denied",
    "operation not permitted",
    "elevated permissions",
    "(os error 1)",
    "(os error 13)",
    "ptrace_scope",
)
NOT_PYTHON_WORDS = (
    "failed to find python version",
    "failed to find a python interpreter",
    "failed to find python interpreter",
    "not a python",
    "couldn't find python",
)
_PYTHON_EXE = re.compile(r"^(python|pypy)(\d+(\.\d+)*)?[dmu]*$")


class DumpResult(NamedTuple):
    """One py-spy dump: the threads, or why there are none."""

    threads: tuple[ThreadStack, ...]
    error: CaptureError | None


# ------------------------------------------------------------------ finding py-spy


def pyspy_candidates() -> list[Path]:
    """Where hangdoc looks for py-spy before PATH, in order."""
    names = [Path(sys.executable).parent, Path(sys.prefix) / "bin"]
    for scheme in (None, f"{os.name}_user"):
        try:
            scripts = sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
        except KeyError:
            continue
        names.append(Path(scripts))
    return list(dict.fromkeys(d / "py-spy" for d in names))


def find_pyspy() -> str:
    """py-spy next to this interpreter, in its environment's scripts, or on PATH."""
    for candidate in pyspy_candidates():
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    on_path = shutil.which("py-spy")
    if on_path:
        return on_path
    where = ", ".join(str(c.parent) for c in pyspy_candidates())
    raise PySpyMissing(f"py-spy not found in {where} or on PATH")


# ------------------------------------------------------------------ parsing py-spy's JSON


def source_line(filename: str, line: int | None, reader: SourceReader | None = None) -> str | None:
    """The stripped source line, read as the dumped process could read it; None otherwise."""
    text = (reader or SourceReader()).line(filename, line)
    return (text or "").strip() or None


def _frame(raw: dict[str, Any], reader: SourceReader | None) -> Frame:
    native = raw.get("module") is not None
    line = raw.get("line") or None
    filename = raw.get("filename") or "?"
    code = None if native or reader is None else source_line(filename, line, reader)
    return Frame(function=raw.get("name") or "?", filename=filename, line=line, native=native, code=code)


def _clean(name: str, text: str) -> str | None:
    """A local's py-spy repr as it may leave the node, or None to drop it."""
    text = text.strip()
    if _LITERAL.fullmatch(text):
        return text
    if name == "group_name" and (m := _GROUP_NAME.fullmatch(text)):
        return m.group(1)
    if m := _TYPE.fullmatch(text):
        return f"<{m.group(1)}>"
    return None


def _call_group(values: dict[str, str]) -> str | None:
    """The group a wrapped c10d call was given: ``<ProcessGroup>``, ``None`` or
    ``DEFAULT_GROUP``; None when the wrapper's reprs were cut short before saying."""
    kwargs, args = values.get("kwargs", ""), values.get("args", "")
    if m := _GROUP_KWARG.search(kwargs):
        return "None" if m.group(1) == "None" else "<ProcessGroup>"
    if "ProcessGroup" in args:
        return "<ProcessGroup>"
    if kwargs.endswith("...") or args.endswith("..."):
        return None
    return DEFAULT_GROUP if "kwargs" in values else None


def _exit_exception(variables: list[Any]) -> str | None:
    """``None`` or ``<TypeName>`` of the exception an ``__exit__(self, type, value, tb)``
    (or ``__exit__(self, *args)``) was called with; None when its arguments do not say."""
    args = [v for v in variables if isinstance(v, dict) and v.get("arg")]
    if len(args) >= 3:
        text = str(args[2].get("repr") or "").strip()
    elif len(args) == 2 and args[1].get("name") == "args":
        text = str(args[1].get("repr") or "").strip().lstrip("(")
        text = "None" if text.startswith("None") else text.split(",")[1] if "," in text else ""
    else:
        return None
    text = text.strip()
    if text == "None":
        return "None"
    m = _INSTANCE.match(text)
    return f"<{m.group(1)}>" if m else None


def frame_locals(index: int, raw: dict[str, Any]) -> FrameLocals | None:
    """The kept arguments of a torch.distributed frame (see ``LOCAL_NAMES``), and the
    exception an ``__exit__`` was called with."""
    variables = raw.get("locals")
    if not variables or raw.get("module") is not None:
        return None
    if str(raw.get("name") or "").rsplit(".", 1)[-1] in _EXIT_METHODS:
        exception = _exit_exception(variables)
        return FrameLocals(index, (("exception", exception),)) if exception else None
    filename = raw.get("filename") or ""
    if filename.startswith(GRAPH_CODE):
        return _graph_locals(index, variables)
    origin = frame_origin(filename)
    if not origin.under(_TORCH_DIST):
        return None
    reprs = {str(v.get("name")): str(v.get("repr") or "") for v in variables if isinstance(v, dict)}
    if origin.module_path == _CALL_WRAPPER:
        group = _call_group(reprs)
        return FrameLocals(index, (("group", group),)) if group else None
    kept = tuple(
        (name, value)
        for name, text in reprs.items()
        if name in LOCAL_NAMES and (value := _clean(name, text)) is not None
    )
    return FrameLocals(index, kept) if kept else None


def _graph_locals(index: int, variables: list[Any]) -> FrameLocals | None:
    """Of a compiled FX graph's frame, the last node bound so far that is a functional
    collective (``graph_op``): the graph's locals are its nodes, named after their ops, in
    the order the graph runs them, and a node freed is None. The name only."""
    last = None
    for variable in variables:
        if not isinstance(variable, dict):
            continue
        name = str(variable.get("name") or "")
        op = _NODE_SUFFIX.sub("", name)
        if op in GRAPH_COLLECTIVES and str(variable.get("repr") or "None") != "None":
            last = op
    return FrameLocals(index, (("graph_op", last),)) if last else None


# Of the job's and its libraries' frames, capture keeps which object each lock expression
# of the function starts from (``with self._lock:``, ``with loader.lock:``, ``lock.acquire()``
# on a line from the ``def`` to the current one): ``@NAME`` -> the object's address, with its
# type only for the standard library's lock types; ``-`` when NAME is not a local (a global).
# An address is no secret and changes per process; a value is never kept
# (``hangdoc.analysis.locks`` matches waiters to holders with them).
OBJECT_PREFIX = "@"
_LOCK_TYPES = frozenset(
    {"_thread.lock", "_thread.RLock", "Condition", "Semaphore", "BoundedSemaphore", "RLock", "Lock", "_RLock"}
)
_OBJECT = re.compile(r"<((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*) at (0x[0-9a-fA-F]{1,16})>")
_LOCK_ROOT = re.compile(
    r"^\s*(?:(?:async\s+)?with\s+(?P<items>.+?)\s*:\s*(?:#.*)?$"
    r"|(?:(?:if|while)\s+(?:not\s+)?|[A-Za-z_]\w*\s*=\s*)?(?P<acq>[A-Za-z_]\w*)[\w.]*\.acquire\s*\()"
)
_ROOT = re.compile(r"\s*([A-Za-z_]\w*)[\w.]*(?:\s+as\s+\w+)?\s*")
_DEF = re.compile(r"^\s*(async\s+def|def|class)\s")


def _lock_roots(raw: dict[str, Any], reader: SourceReader) -> set[str]:
    """The names that ``with``/``acquire`` lines of the frame's function start from."""
    filename, line = raw.get("filename") or "", raw.get("line") or 0
    roots: set[str] = set()
    for lineno in range(line, max(0, line - MAX_LINES_BEFORE), -1):
        text = reader.line(filename, lineno)
        if text is None:
            break
        if m := _LOCK_ROOT.match(text):
            if m.group("acq"):
                roots.add(m.group("acq"))
            for item in (m.group("items") or "").split(","):
                if root := _ROOT.fullmatch(item):
                    roots.add(root.group(1))
        if lineno < line and _DEF.match(text):
            break
    return roots


def object_locals(raw: dict[str, Any], reader: SourceReader | None) -> tuple[tuple[str, str], ...]:
    """The kept identities of a frame's lock expressions (``OBJECT_PREFIX``), for frames of
    the job's and its libraries' code when py-spy ran with ``--locals``."""
    variables = raw.get("locals")
    if (
        reader is None
        or not isinstance(variables, list)
        or raw.get("module") is not None
        or frame_origin(raw.get("filename") or "").kind not in (Origin.USER, Origin.LIBRARY)
    ):
        return ()
    roots = _lock_roots(raw, reader)
    if not roots:
        return ()
    reprs = {str(v.get("name")): str(v.get("repr") or "") for v in variables if isinstance(v, dict)}
    kept = []
    for name in sorted(roots):
        if name not in reprs:
            # py-spy lists neither a closure's variables nor a function's own cell
            # variables: only a name the module assigns at its top level is its global
            if _module_global(reader, raw.get("filename") or "", name):
                kept.append((OBJECT_PREFIX + name, "-"))
        elif (m := _OBJECT.fullmatch(reprs[name].strip())) and m.group(1) != "cell":
            kind = m.group(1) if m.group(1) in _LOCK_TYPES else ""
            kept.append((OBJECT_PREFIX + name, f"{m.group(2).lower()} {kind}".strip()))
    return tuple(kept)


def _module_global(reader: SourceReader, filename: str, name: str) -> bool:
    """``name`` is assigned or imported at the top level of ``filename``."""
    top = re.compile(rf"^(?:{name}\s*(?::[^=]*)?=(?!=)|(?:from\s+\S+\s+)?import\s.*\b{name}\b)")
    return any(top.match(text) for text in reader.lines(filename) or ())


def _with_objects(
    found: FrameLocals | None, index: int, raw: dict[str, Any], reader: SourceReader | None
) -> FrameLocals | None:
    objects = object_locals(raw, reader)
    if not objects:
        return found
    return FrameLocals(index, (found.values if found else ()) + objects)


def parse_dump(text: str | bytes, pid: int | None = None) -> tuple[ThreadStack, ...]:
    """Parse ``py-spy dump --json`` output; ``Frame.code`` is read as process ``pid`` could
    (hangdoc.sourcefs; this process when ``pid`` is None), and torch.distributed frames keep
    their cleaned arguments when py-spy ran with ``--locals``.

    Raises ValueError when the text is not py-spy's JSON.
    """
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("py-spy JSON is not a list of threads")  # noqa: TRY004
    return threads_from_json(data, pid, SourceReader(pid))


def threads_from_json(
    data: list[Any], pid: int | None = None, reader: SourceReader | None = None
) -> tuple[ThreadStack, ...]:
    """The threads of one py-spy JSON dump (its list of thread objects), frames outermost
    first; ``Frame.code`` is read through ``reader``, and left out without one (a dump read
    from a file, away from the process)."""
    threads = []
    for raw in data:
        frames_raw = list(reversed(raw.get("frames") or ()))
        native_id = raw.get("os_thread_id")
        name = raw.get("thread_name")
        if name is None and native_id is not None and native_id == (pid or raw.get("pid")):
            name = "MainThread"  # threading was never imported; the main thread's tid is the pid
        found = (_with_objects(frame_locals(i, f), i, f, reader) for i, f in enumerate(frames_raw))
        threads.append(
            ThreadStack(
                thread_id=int(raw["thread_id"]),
                name=name,
                frames=tuple(_frame(f, reader) for f in frames_raw),
                native_id=native_id,
                active=bool(raw.get("active")),
                owns_gil=bool(raw.get("owns_gil")),
                locals=tuple(f for f in found if f is not None),
            )
        )
    return tuple(threads)


# ------------------------------------------------------------------ failures


def process_gone(pid: int) -> bool:
    """The pid no longer names a live process (exited, or a zombie awaiting its parent)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def _looks_python(pid: int) -> bool | None:
    """Whether the process runs a Python interpreter; None when that cannot be read."""
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        if _PYTHON_EXE.match(exe):
            return True
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            return "libpython" in maps.read()
    except OSError:
        return None


def clean_message(stderr: str) -> str:
    """py-spy's error without the Rust backtrace, on one line."""
    lines = []
    for line in stderr.splitlines():
        if line.startswith("Stack backtrace:"):
            break
        line = line.strip()
        if line and line != "Caused by:":
            lines.append(line.removeprefix("Error: "))
    return "; ".join(dict.fromkeys(lines))[:400] or "py-spy failed without a message"


def classify_failure(pid: int, returncode: int, stderr: str) -> CaptureError:
    """Map a failed py-spy run to a structured error kind."""
    message = clean_message(stderr)
    lowered = stderr.lower()
    if process_gone(pid):
        return CaptureError(CaptureErrorKind.PROCESS_GONE, f"pid {pid} exited")
    if any(p in lowered for p in DENIED_WORDS):
        return CaptureError(CaptureErrorKind.PTRACE_DENIED, message)
    looks_python = _looks_python(pid)
    no_interpreter = any(p in lowered for p in NOT_PYTHON_WORDS)
    if looks_python is False or (no_interpreter and looks_python is None):
        return CaptureError(CaptureErrorKind.NOT_PYTHON, message)
    if no_interpreter:
        # A Python binary whose interpreter py-spy cannot find: still starting up, or a
        # Python version this py-spy does not support.
        return CaptureError(
            CaptureErrorKind.PYSPY_FAILED,
            f"{message} (the process runs Python: is it still starting, or "
            "is its Python version newer than this py-spy?)",
        )
    return CaptureError(CaptureErrorKind.PYSPY_FAILED, f"exit code {returncode}: {message}")


# ------------------------------------------------------------------ running py-spy


def pyspy_argv(
    pyspy: str, pid: int, *, native: bool = False, locals_: bool = False, nonblocking: bool = False
) -> list[str]:
    argv = [pyspy, "dump", "--pid", str(pid), "--json"]
    if native:
        argv.append("--native")
    if locals_:
        argv.append("--locals")
    if nonblocking:
        argv.append("--nonblocking")
    return argv


class DumpHandle:
    """A py-spy dump under way; ``result()`` waits for it (until its deadline) and parses."""

    def __init__(self, pid: int, argv: list[str], timeout: float) -> None:
        self.pid = pid
        self.argv = argv
        self.timeout = timeout
        self.started = time.monotonic()
        self._result: DumpResult | None = None
        self._retried = False
        self._launch(argv)

    def _launch(self, argv: list[str]) -> None:
        # Files, not pipes: py-spy never blocks on a full pipe while we wait on another dump.
        self._out: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in _close)
        self._err: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self._pidfd: int | None = None
        try:
            self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self._out,
                stderr=self._err,
                env={**os.environ, "RUST_BACKTRACE": "0"},
            )
        except OSError as exc:
            self._proc = None
            self._finish(CaptureError(CaptureErrorKind.PYSPY_MISSING, f"cannot run {argv[0]}: {exc.strerror or exc}"))
            return
        try:
            self._pidfd = os.pidfd_open(self._proc.pid)
        except (OSError, AttributeError):
            self._pidfd = None  # old kernel: fall back to Popen.wait's polling

    def _finish(self, error: CaptureError | None, threads: tuple[ThreadStack, ...] = ()) -> DumpResult:
        self._result = DumpResult(threads, error)
        self._close()
        return self._result

    def _close(self) -> None:
        self._out.close()
        self._err.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def _read(self, handle: IO[bytes]) -> bytes:
        handle.seek(0)
        return handle.read()

    def _wait(self) -> int | None:
        """py-spy's exit code, or None at the deadline."""
        assert self._proc is not None
        remaining = max(0.0, self.started + self.timeout - time.monotonic())
        if self._pidfd is not None:
            # Popen.wait(timeout) polls with sleeps of up to 50 ms; a pidfd wakes us at exit.
            readable, _, _ = select.select([self._pidfd], [], [], remaining)
            return self._proc.wait() if readable else None
        try:
            return self._proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            return None

    def result(self) -> DumpResult:
        if self._result is not None:
            return self._result
        returncode = self._wait()
        if returncode is None:
            self.cancel()
            if process_gone(self.pid):
                return self._finish(CaptureError(CaptureErrorKind.PROCESS_GONE, f"pid {self.pid} exited"))
            return self._finish(
                CaptureError(CaptureErrorKind.TIMEOUT, f"py-spy did not answer within {self.timeout:g}s")
            )
        if returncode != 0:
            stderr = self._read(self._err).decode(errors="replace")
            if self._should_retry_nonblocking(stderr):
                return self.result()
            return self._finish(classify_failure(self.pid, returncode, stderr))
        try:
            threads = parse_dump(self._read(self._out), self.pid)
        except (ValueError, KeyError, TypeError) as exc:
            return self._finish(CaptureError(CaptureErrorKind.PYSPY_FAILED, f"unreadable py-spy output: {exc}"))
        return self._finish(None, threads)

    def _should_retry_nonblocking(self, stderr: str) -> bool:
        """py-spy read the process but could not pause it: another tracer (a debugger, a
        concurrent py-spy) holds it. Read it once more without pausing."""
        if self._retried or "--nonblocking" in self.argv or "failed to suspend process" not in stderr.lower():
            return False
        self._retried = True
        self._close()
        self.argv = [*self.argv, "--nonblocking"]
        self._launch(self.argv)
        return self._result is None

    def cancel(self) -> None:
        """Kill py-spy (the kernel detaches it from the target) and reap it."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def abandon(self) -> None:
        """Cancel a dump whose result is no longer wanted, and release its files."""
        self.cancel()
        if self._result is None:
            self._finish(CaptureError(CaptureErrorKind.TIMEOUT, "dump abandoned"))


def start_dump(
    pid: int,
    *,
    native: bool = False,
    locals_: bool = True,
    nonblocking: bool = False,
    timeout: float = 5.0,
    pyspy: str | None = None,
) -> DumpHandle:
    """Start ``py-spy dump`` on ``pid`` and return at once; ``.result()`` collects it.

    Raises ``PySpyMissing`` when ``pyspy`` is not given and none is found.
    """
    argv = pyspy_argv(pyspy or find_pyspy(), pid, native=native, locals_=locals_, nonblocking=nonblocking)
    return DumpHandle(pid, argv, timeout)


def dump(
    pid: int,
    *,
    native: bool = False,
    locals_: bool = True,
    nonblocking: bool = False,
    timeout: float = 5.0,
    pyspy: str | None = None,
) -> DumpResult:
    """Dump every thread of ``pid``: ``(threads, error)``; failures are in ``error``."""
    return start_dump(
        pid, native=native, locals_=locals_, nonblocking=nonblocking, timeout=timeout, pyspy=pyspy
    ).result()
