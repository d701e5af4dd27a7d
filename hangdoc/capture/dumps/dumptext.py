"""Read the text ``py-spy dump`` prints, for one process or for many in one file, and
``ray stack``'s output, into ``ProcessDump`` values in the file's order.

py-spy prints, for each process (its ``src/dump.rs``)::

    Process 4711: /usr/bin/python3 -u train.py --local_rank=0
    Python v3.11.7 (/usr/bin/python3.11)

    Thread 4711 (idle): "MainThread"
        all_reduce (torch/distributed/distributed_c10d.py:2501)
            Arguments:
                tensor: <Tensor at 0x7f31c0>
            Locals:
                work: None
        train (train.py:40)
    Thread 0x7F12AB3C4740 (active+gil): "pin_memory"

Frames come innermost first (the model stores them outermost first). A thread is named by
its OS thread id in decimal where py-spy knows it (Linux), else by its pthread id in hex;
its status is ``idle``, ``active`` or ``active+gil``. ``--locals`` adds ``Arguments:`` and
``Locals:`` blocks under a frame (``Arguments::`` in py-spy before 0.4), ``--native`` adds
native frames (``waitRecv (libtorch_cpu.so)``, ``0x7f25... (libc.so.6)``), ``--subprocesses``
a ``Parent Process`` line; py-spy before 0.2 indented frames with a tab. ``ray stack`` runs
``py-spy dump --native`` on every Ray worker of the node after a line
``Stack dump for USER PID %CPU ... COMMAND`` (a ``ps aux`` line).

Everything else is kept as the *label* of the dump that follows it (a loop's
``echo "rank 3"``, a log line announcing the dump, a shell prompt): ``dumpranks`` reads
ranks and pids there. py-spy's own errors (``Error: Permission Denied``, printed when its
stderr went to the file too; the causes below it as ``Reason: EPERM: ...`` lines or
anyhow's ``Caused by:``) make a dump with an error and no threads. Dumps without a
``Process`` line (stacks pasted on their own) are told apart by their ``MainThread``: a
second one starts another process.

Posts that summarise many processes list their main threads' header lines one under the
other above the one stack they share (``4 in:`` then four ``Thread N (active): "MainThread"``
lines and the frames, as BLOOM-176B's training logbook does): each header right above
another, with no frames of its own, is a process of its own with the stack below.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from ...bundle import MAX_STACK_DEPTH
from ...errors import DumpFileError, shown
from ...model import PID_MAX, PID_MIN, Frame, FrameLocals, ThreadStack
from ..read.pyspy import frame_locals
from .dumped import ProcessDump, capture_error, text_frame

MAX_LINE_CHARS = 64 * 1024  # py-spy cuts a local's repr far shorter; longer lines are not its
_LABEL_LINES = 6  # the lines before a dump kept as its label
_LABEL_CHARS = 500

_PROCESS = re.compile(r"Process (\d{1,10}): ?(.*)")
_PARENT = re.compile(r"Parent Process (\d{1,10}):")
_PYTHON = re.compile(r"Python v(\S+) \(.*\)")
_RAY = re.compile(r"Stack dump for (.*)")
_THREAD = re.compile(r'Thread (0[xX][0-9a-fA-F]{1,16}|\d{1,20})(?: \(([a-z+]+)\))?(?:: "(.*)")?')
_FRAME = re.compile(r"(\S.*) \(([^()]*)\)")
_LINE = re.compile(r"(.*):(\d{1,10})")
_VARS = re.compile(r"(Arguments|Locals)::?")
_VAR = re.compile(r"(\S+): (.*)")
_ERROR = re.compile(r"(?:Error|error): (.*)")  # anyhow's (py-spy 0.3+), clap's
_MARKERS = (_PROCESS, _THREAD, _RAY)


def looks_like_text_dump(lines: list[str]) -> bool:
    """Whether some line starts a py-spy dump, a thread of one, or a ray stack entry."""
    return any(m.fullmatch(line.strip()) for line in lines for m in _MARKERS)


@dataclass
class _Thread:
    header: re.Match[str]
    indent: int | None = None  # the indentation of its frames
    frames: list[tuple[str, str, int | None]] = field(default_factory=list)
    variables: dict[int, list[dict[str, object]]] = field(default_factory=dict)
    in_vars: bool | None = None  # inside a frame's Arguments/Locals block (True: arguments)


@dataclass
class _Process:
    line: int
    pid: int | None
    cmdline: str = ""
    label: str = ""
    python: str = ""
    threads: list[ThreadStack] = field(default_factory=list)
    error: list[str] = field(default_factory=list)
    headed: bool = False  # started by a Process line (not by a thread or ray's line)
    caused_by: bool = False  # inside the "Caused by:" lines of py-spy's error


class _Parser:
    def __init__(self, where: str) -> None:
        self.where = where
        self.dumps: list[ProcessDump] = []
        self.labels: list[str] = []
        self.process: _Process | None = None
        self.thread: _Thread | None = None
        self.skipped = 0  # lines too long to be py-spy's
        # dumps of main threads listed right above another with no frames of their own
        # (a grouped post, module doc): they take the frames of the next thread that has some
        self.grouped: list[int] = []

    # -- the dumps ---------------------------------------------------------------------

    def _end_thread(self) -> None:
        if self.thread is not None and self.process is not None:
            stack = _thread_stack(self.thread, self.process.python, self.where)
            self.process.threads.append(stack)
            if stack.frames and self.grouped and stack.is_main and len(self.process.threads) == 1:
                for i in self.grouped:
                    dump = self.dumps[i]
                    shared = replace(dump.threads[0], frames=stack.frames, locals=stack.locals)
                    self.dumps[i] = replace(dump, threads=(shared,))
            if stack.frames:
                self.grouped = []
        self.thread = None

    def _end_process(self) -> None:
        self._end_thread()
        p = self.process
        if p is not None and (p.threads or p.error or p.headed or p.cmdline):
            error = capture_error("\n".join(p.error)) if p.error and not p.threads else None
            self.dumps.append(ProcessDump(p.line, p.pid, p.cmdline, p.label, tuple(p.threads), error, p.python))
        self.process = None

    def _start(self, lineno: int, pid: int | None, cmdline: str = "") -> _Process:
        self._end_process()
        label = "\n".join(self.labels[-_LABEL_LINES:])
        self.labels = []
        self.process = _Process(lineno, pid, cmdline, label)
        return self.process

    # -- one line ----------------------------------------------------------------------

    def feed(self, lineno: int, raw: str) -> None:
        if len(raw) > MAX_LINE_CHARS:
            self.skipped += 1
            self._end_thread()
            return
        line = raw.rstrip()
        text = line.strip()
        if not text:
            self._end_thread()
            self.grouped = []
            return
        indent = len(line) - len(line.lstrip())
        if self.thread is not None and self._thread_line(line, text, indent):
            return
        self._header_line(lineno, text, indent)

    def _thread_line(self, line: str, text: str, indent: int) -> bool:
        """Read ``line`` as part of the current thread; False when it is not."""
        th = self.thread
        assert th is not None
        deeper = th.indent is not None and indent > th.indent
        if th.in_vars is not None and deeper:
            if (m := _VARS.fullmatch(text)) is not None:
                th.in_vars = m.group(1) == "Arguments"
            elif (v := _VAR.fullmatch(text)) is not None and th.frames:
                th.variables.setdefault(len(th.frames) - 1, []).append(
                    {"name": v.group(1), "repr": v.group(2), "arg": th.in_vars}
                )
            return True
        if (m := _VARS.fullmatch(text)) is not None and th.frames and deeper:
            th.in_vars = m.group(1) == "Arguments"
            return True
        if _THREAD.fullmatch(text) or _PROCESS.fullmatch(text) or _RAY.fullmatch(text):
            return False
        frame = _FRAME.fullmatch(text)
        if frame is None or (indent == 0 and th.indent):
            return False
        if th.indent is None:
            th.indent = indent
        th.in_vars = None
        where = _LINE.fullmatch(frame.group(2))
        filename, number = (where.group(1), int(where.group(2))) if where else (frame.group(2), None)
        if number is not None and number >= 2**31:
            number = None  # no source file has that many lines
        th.frames.append((frame.group(1), filename, number or None))
        if len(th.frames) > MAX_STACK_DEPTH:
            raise DumpFileError(
                f"{self.where}: a thread of more than {MAX_STACK_DEPTH:,} frames; hangdoc reads at most that many"
            )
        return True

    def _header_line(self, lineno: int, text: str, indent: int) -> None:
        bare = self.thread is not None and not self.thread.frames  # a header right above
        self._end_thread()
        thread = _THREAD.fullmatch(text)
        if thread is None or not bare:
            self.grouped = []
        if (m := _PROCESS.fullmatch(text)) is not None:
            pid = _pid(m.group(1))
            p = self.process
            if p is not None and not p.headed and not p.threads and not p.error and p.pid in (pid, None):
                p.pid, p.headed = pid, True  # ray stack's line, then py-spy's header
                p.cmdline = p.cmdline or m.group(2)
            else:
                self._start(lineno, pid, m.group(2)).headed = True
        elif (m := _RAY.fullmatch(text)) is not None:
            fields = m.group(1).split(None, 10)
            listed = len(fields) > 1 and re.fullmatch(r"\d{1,10}", fields[1])
            self._start(lineno, _pid(fields[1]) if listed else None, fields[10] if len(fields) == 11 else m.group(1))
        elif (m := thread) is not None:
            p = self.process
            if p is None or (not p.headed and m.group(3) == "MainThread" and any(t.is_main for t in p.threads)):
                # a main thread right above this one, with no frames: grouped (module doc)
                above = tuple(p.threads) if p is not None and bare and not p.error else ()
                self._start(lineno, None)
                if len(above) == 1 and self.dumps and self.dumps[-1].threads == above:
                    self.grouped.append(len(self.dumps) - 1)
                else:
                    self.grouped = []
            self.thread = _Thread(m)
        elif (m := _PYTHON.fullmatch(text)) is not None and self.process is not None and not self.process.threads:
            self.process.python = m.group(1)
        elif _PARENT.fullmatch(text) and self.process is not None:
            pass  # --subprocesses: the parent of the process above
        elif (m := _ERROR.fullmatch(text)) is not None:
            p = self.process
            if p is None or p.threads or p.error:  # py-spy failed before printing a header
                p = self._start(lineno, None)
            p.error.append(m.group(1))
        elif (
            (p := self.process) is not None
            and p.error
            and not p.threads
            and (
                text in ("Caused by:", "Stack backtrace:")
                or (p.caused_by and indent > 0)
                or text.startswith("Reason: ")
            )
        ):
            # anyhow's "Caused by:" and the reasons indented below it; with RUST_BACKTRACE
            # set, py-spy's own backtrace (``clean_message`` leaves it out); py-spy's main
            # prints each cause of its error as a "Reason: " line of its own
            reason = text.removeprefix("Reason: ")
            p.error.append(reason)
            p.caused_by = p.caused_by or reason == text
        else:
            if self.process is not None and (self.process.threads or self.process.error):
                self._end_process()
            self.labels.append(text[:_LABEL_CHARS])
            del self.labels[:-_LABEL_LINES]


def _pid(text: str) -> int | None:
    """A pid as a header shows it; None for a number no Linux pid can be."""
    pid = int(text)
    return pid if PID_MIN <= pid <= PID_MAX else None


def _thread_stack(th: _Thread, python: str, where: str) -> ThreadStack:
    ident, status, name = th.header.group(1), th.header.group(2) or "", th.header.group(3)
    hexadecimal = ident.lower().startswith("0x")
    number = int(ident, 16) if hexadecimal else int(ident)
    if number >= 2**64:
        raise DumpFileError(f"{where}: thread id {shown(ident)} does not fit in 64 bits")
    frames: list[Frame] = []
    kept: list[FrameLocals] = []
    count = len(th.frames)
    for position, (function, filename, line) in enumerate(reversed(th.frames)):
        frame = text_frame(function, filename, line, python)
        frames.append(frame)
        variables = th.variables.get(count - 1 - position)
        if variables and not frame.native:
            found = frame_locals(
                position, {"name": function, "filename": frame.filename, "module": None, "locals": variables}
            )
            if found is not None:
                kept.append(found)
    return ThreadStack(
        thread_id=number,
        name=name,
        frames=tuple(frames),
        native_id=None if hexadecimal else number,
        active=status.startswith("active"),
        owns_gil="gil" in status,
        locals=tuple(kept),
    )


def _name_main_threads(dump: ProcessDump) -> ProcessDump:
    """py-spy names no thread when the job never imported threading: its main thread is the
    one whose OS thread id is the pid (as ``pyspy.threads_from_json`` reads it)."""
    if dump.pid is None or any(t.is_main for t in dump.threads):
        return dump
    threads = tuple(
        replace(t, name="MainThread") if t.name is None and t.native_id == dump.pid else t for t in dump.threads
    )
    return replace(dump, threads=threads)


def parse_text(lines: Iterator[str] | list[str], where: str) -> tuple[list[ProcessDump], int]:
    """The dumps in the text ``lines`` (of the file named ``where`` in messages), and how
    many lines were skipped as too long to be py-spy's."""
    parser = _Parser(where)
    for lineno, line in enumerate(lines, 1):
        parser.feed(lineno, line)
    parser._end_process()
    return [_name_main_threads(d) for d in parser.dumps], parser.skipped
