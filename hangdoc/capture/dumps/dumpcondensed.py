"""Read stacks as people paste them in issues: frame lines without py-spy's ``Process`` and
``Thread`` headers, tracebacks, each under a free-form label, into ``ProcessDump`` values.

The forms read::

    TP0 stuck forever in:                        <- a label (``dumplabels`` reads its ranks)
    all_reduce (torch/distributed/distributed_c10d.py:3075)     <- py-spy's frame lines,
      _all_reduce_attn_groups (hiradix_cache.py:196)               innermost first, indented
                                                                   or not
    rank 3: all_reduce (torch/distributed/distributed_c10d.py:2501)  <- a top-frame summary

    Traceback (most recent call last):           <- Python's traceback, ``traceback.print_stack``
      File "/x/train.py", line 40, in train         (no header), pystack: outermost first,
        dist.all_reduce(t)                          each frame's source line below it
    Thread 0x00007f57caf71740 (most recent call first):   <- faulthandler: innermost first
      File "/x/torch/cuda/streams.py", line 95 in synchronize

Markdown fences, ``> `` quotes and torchrun's ``[rankN]:`` line prefixes are read through
(a prefix is the label of its lines). A label is the last line of text before a stack; it
may name ranks (``ranks 1-3``: three processes with the stack below), a count (``3
processes in:``: three processes, ranks not named) or neither (``Node 48:``: one process).
Stacks without a label, each after a blank line, are one process each; faulthandler's
thread blocks one after another are the threads of one process. py-spy's ``Arguments:`` and
``Locals:`` blocks are passed over. Every other line is skipped, and ``CondensedRead.skipped``
says which and why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from ...bundle import MAX_STACK_DEPTH
from ...errors import DumpFileError
from ...model import MAX_WORLD_SIZE, Frame, ThreadStack
from .dumped import ProcessDump, text_frame
from .dumplabels import LabelIndex, label_count, label_ranks, world_size_in

MAX_LINE_CHARS = 64 * 1024
_LABEL_CHARS = 300
_LABEL_LINES = 6  # lines of text before a stack its label is looked for in

_FENCE = re.compile(r"(?:`{3,}|~{3,})\s*[\w+-]*")
_QUOTE = re.compile(r">\s?")
_PREFIX = re.compile(r"\[rank\s?(\d{1,7})\]:\s?", re.IGNORECASE)  # torchrun's --tee prefix
_PYSPY = re.compile(r"(\S.*?) \(([^\s()]+?)(?::(\d{1,10}))?\)")
_NATIVE_FILE = re.compile(r"(?:\.so(?:\.\d+)*|\.dylib|\.dll|python[\d.]*|\?)$")
_SUMMARY = re.compile(r"(.{1,120}?)\s*(?::|->|→|=>|—|–)\s+(\S.*)")  # "rank 3: frame"
_TB_FILE = re.compile(r'File "([^"]+)", line (\d{1,10})(,?) in (\S.*)')
_TB_LAST = re.compile(
    r"Traceback \(most recent call last\):|Traceback for thread (\d+).*"
    r"\(most recent call last\):"
)
_TB_FIRST = re.compile(
    r"(Current thread|Thread|Stack)(?: (0x[0-9a-fA-F]{1,16}))?(?: \[[^]]*\])?"
    r" \(most recent call first\):"
)
_VARS = re.compile(r"(?:Arguments|Locals)::?")
# a C++ function named without its library, as people trim py-spy's ``--native`` frames
# (``at::native::nonzero_cuda``): read only inside a stack, never to start one
_SYMBOL_PART = r"[A-Za-z_~][\w~]*(?:<[^()\s]*>)?"
_NATIVE_SYMBOL = re.compile(rf"{_SYMBOL_PART}(?:::{_SYMBOL_PART})+")
_ELISION = re.compile(r"\.{3,}|…|\[(?:\.{3,}|…)\]|\((?:\.{3,}|…)\)")  # frames left out
_CARETS = re.compile(r"[~^]+")

_PROSE = "text that is neither a frame nor the label of a stack"
_LONG = f"longer than {MAX_LINE_CHARS // 1024} KiB"
_ELIDED = "a mark of frames left out inside a stack: the stack is cut there"


def _strip(raw: str) -> tuple[str, int | None]:
    """The line without a quote marker and torchrun's ``[rankN]:`` prefix, and that rank."""
    line = raw.rstrip()
    stripped = line.lstrip()
    if _QUOTE.match(stripped):
        line = _QUOTE.sub("", stripped, count=1)
        stripped = line.lstrip()
    m = _PREFIX.match(stripped)
    if m is None:
        return line, None
    return stripped[m.end() :], int(m.group(1))


def _frame_of(text: str) -> tuple[str, str, int | None] | None:
    """``function (file:line)`` as a frame, or None where ``text`` is not one (prose with
    parentheses, a file without a line that is no native library)."""
    m = _PYSPY.fullmatch(text)
    if m is None:
        return None
    function, filename, line = m.group(1), m.group(2), m.group(3)
    if line is None and not _NATIVE_FILE.search(filename):
        return None
    number = int(line) if line else None
    return function, filename, number if number and number < 2**31 else None


def is_stack_line(raw: str) -> bool:
    """Whether ``raw`` is a frame of one of the forms read here."""
    text = _strip(raw)[0].strip()
    return bool(_frame_of(text) or _TB_FILE.fullmatch(text) or _TB_FIRST.fullmatch(text) or _TB_LAST.fullmatch(text))


def looks_condensed(lines: list[str]) -> bool:
    """Whether ``lines`` hold a pasted stack of a form read here."""
    return any(len(line) <= MAX_LINE_CHARS and is_stack_line(line) for line in lines)


@dataclass
class _Block:
    """One thread's frames as pasted."""

    line: int
    innermost_first: bool
    thread_id: int = 0
    indent: int | None = None
    # (function, file, line, source line, py-spy's shortened path)
    frames: list[tuple[str, str, int | None, str | None, bool]] = field(default_factory=list)
    in_vars: bool = False


@dataclass
class _Group:
    """The stacks under one label: one process, or several ranks that share them."""

    line: int
    label: str
    label_line: int | None
    blocks: list[_Block] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class LabelReading:
    """How one label's ranks were read, for the notes."""

    label: str
    line: int
    ranks: tuple[int, ...]
    kind: LabelIndex | None  # None: a count, or no rank at all
    count: int = 1


@dataclass(frozen=True, slots=True)
class CondensedRead:
    """What ``parse_condensed`` read: the dumps, how their labels were read, the world size
    the text states and the lines it skipped (line numbers by reason)."""

    dumps: tuple[ProcessDump, ...]
    labels: tuple[LabelReading, ...]
    world_size: tuple[int, str] | None
    skipped: tuple[tuple[str, tuple[int, ...]], ...]


class _Parser:
    def __init__(self, where: str, prefix: int | None = None) -> None:
        self.where = where
        self.prefix = prefix  # the rank of torchrun's [rankN]: prefix on every line read
        self.groups: list[_Group] = []
        self.group: _Group | None = None
        self.block: _Block | None = None
        # the lines of text since the last stack: the label of the next one is the last of
        # them that names ranks or a count, else the last of them
        self.texts: list[tuple[str, int]] = []
        self.blank = True  # a blank line (or the start) since the last stack line
        self.skipped: dict[str, list[int]] = {}
        self.text: list[str] = []

    def skip(self, lineno: int, why: str) -> None:
        self.skipped.setdefault(why, []).append(lineno)

    # -- structure -----------------------------------------------------------------

    def _end_block(self) -> None:
        if self.block is not None and self.block.frames and self.group is not None:
            self.group.blocks.append(self.block)
        self.block = None

    def _start_block(self, lineno: int, innermost_first: bool, thread_id: int = 0, continues: bool = False) -> _Block:
        """A new thread's stack: in the group of a label waiting for one, else in the open
        group when ``continues`` (faulthandler's next thread) or it has a label, else in a
        group of its own."""
        self._end_block()
        if (pending := self._take_label()) is not None:
            label, at = pending
            self.group = _Group(lineno, label, at)
            self.groups.append(self.group)
        elif self.group is None or not (continues or self.group.label or self.prefix is not None):
            self.group = _Group(lineno, "", None)
            self.groups.append(self.group)
        self.block = _Block(lineno, innermost_first, thread_id)
        return self.block

    def _take_label(self) -> tuple[str, int] | None:
        """The label of the stack that starts now (see ``texts``); the other lines of text
        before it are skipped."""
        if not self.texts:
            return None
        chosen = next(
            (t for t in reversed(self.texts) if label_ranks(t[0]) is not None or label_count(t[0]) is not None),
            self.texts[-1],
        )
        for _, at in self.texts:
            if at != chosen[1]:
                self.skip(at, _PROSE)
        self.texts = []
        return chosen

    def _label(self, lineno: int, text: str) -> None:
        self._end_block()
        self.texts.append((text[:_LABEL_CHARS], lineno))
        if len(self.texts) > _LABEL_LINES:
            self.skip(self.texts.pop(0)[1], _PROSE)
        self.group = None  # what follows is not the stack of the label above

    # -- one line ------------------------------------------------------------------

    def feed(self, lineno: int, raw: str) -> None:
        if len(raw) > MAX_LINE_CHARS:
            self.skip(lineno, _LONG)
            self._end_block()
            return
        line, _ = _strip(raw)
        text = line.strip()
        if not text:
            self._end_block()
            self.blank = True
            return
        if _FENCE.fullmatch(text):
            return
        self.text.append(text)
        indent = len(line) - len(line.lstrip())
        if self._summary(lineno, text) or self._stack_line(lineno, text, indent):
            self.blank = False
            return
        self._label(lineno, text)

    def _stack_line(self, lineno: int, text: str, indent: int) -> bool:
        block = self.block
        if (m := _TB_LAST.fullmatch(text)) is not None:
            self._start_block(lineno, False, int(m.group(1) or 0))
            return True
        if (m := _TB_FIRST.fullmatch(text)) is not None:
            self._start_block(lineno, True, int(m.group(2) or "0", 16), continues=self._after_thread())
            return True
        if (m := _TB_FILE.fullmatch(text)) is not None:
            if block is None or block.indent is not None and block.frames and block.frames[-1][4]:
                # no header: traceback.print_stack (outermost first), or faulthandler's
                # "line N in f" without a comma when its header was cut
                block = self._start_block(lineno, not m.group(3))
            block.indent = indent if block.indent is None else block.indent
            block.in_vars = False
            self._add(block, (m.group(4), m.group(1), int(m.group(2)) or None, None, False))
            return True
        if (frame := _frame_of(text)) is not None:
            if block is None or (block.frames and not block.frames[-1][4]):
                block = self._start_block(lineno, True)
            block.indent = indent if block.indent is None else block.indent
            block.in_vars = False
            self._add(block, (*frame, None, True))
            return True
        if block is not None and block.frames and _ELISION.fullmatch(text):
            self.skip(lineno, _ELIDED)  # the stack goes on below the cut
            return True
        if block is not None and block.frames and block.frames[-1][4] and _NATIVE_SYMBOL.fullmatch(text):
            self._add(block, (text, "?", None, None, True))  # native, its library not shown
            return True
        if block is None or not block.frames or block.indent is None or indent <= block.indent:
            return False
        # below a frame, indented deeper: py-spy's Arguments/Locals, a traceback's source line
        last = block.frames[-1]
        if _VARS.fullmatch(text):
            block.in_vars = True
        elif block.in_vars or _CARETS.fullmatch(text):
            pass
        elif not last[4] and last[3] is None:
            block.frames[-1] = (last[0], last[1], last[2], text, False)
        else:
            return False
        return True

    def _after_thread(self) -> bool:
        """Whether the stack just read is a faulthandler thread's (the next one is another
        thread of the same process)."""
        last = (
            self.block
            if self.block is not None and self.block.frames
            else (self.group.blocks[-1] if self.group is not None and self.group.blocks else None)
        )
        return last is not None and last.innermost_first and not last.frames[-1][4]

    def _add(self, block: _Block, frame: tuple[str, str, int | None, str | None, bool]) -> None:
        block.frames.append(frame)
        if len(block.frames) > MAX_STACK_DEPTH:
            raise DumpFileError(
                f"{self.where}: a stack of more than {MAX_STACK_DEPTH:,} frames; hangdoc reads at most that many"
            )

    def _summary(self, lineno: int, text: str) -> bool:
        """``LABEL: function (file:line)``: a label and its one frame on one line."""
        m = _SUMMARY.fullmatch(text)
        if (
            m is None
            or (frame := _frame_of(m.group(2))) is None
            or (label_ranks(m.group(1)) is None and label_count(m.group(1)) is None)
        ):
            return False
        for _, at in self.texts:
            self.skip(at, _PROSE)
        self.texts = [(m.group(1)[:_LABEL_CHARS], lineno)]
        block = self._start_block(lineno, True)
        self._add(block, (*frame, None, True))
        self._end_block()
        self.group = None
        return True

    def finish(self) -> None:
        self._end_block()
        for _, at in self.texts:
            self.skip(at, "text after the last stack")


def _thread(block: _Block, main: bool) -> ThreadStack:
    frames: list[Frame] = []
    ordered = reversed(block.frames) if block.innermost_first else iter(block.frames)
    for function, filename, line, code, shortened in ordered:
        # py-spy shortens paths (``dumped.python_filename`` restores them); a traceback's
        # are as Python knew them
        frame = (
            text_frame(function, filename, line)
            if shortened
            else Frame(function=function, filename=filename, line=line, code=code)
        )
        frames.append(frame)
    return ThreadStack(thread_id=block.thread_id, name="MainThread" if main else None, frames=tuple(frames))


def _threads(group: _Group) -> tuple[ThreadStack, ...]:
    """The group's threads; the main thread is the one whose outermost frame is
    ``<module>``, else the first."""
    blocks = group.blocks
    main = next(
        (i for i, b in enumerate(blocks) if (b.frames[-1] if b.innermost_first else b.frames[0])[0] == "<module>"), 0
    )
    return tuple(_thread(b, i == main) for i, b in enumerate(blocks))


def parse_condensed(lines: list[str], where: str) -> CondensedRead:
    """The dumps in pasted ``lines`` (of the file named ``where`` in messages)."""
    by_prefix: dict[int | None, list[tuple[int, str]]] = {}
    for lineno, raw in enumerate(lines, 1):
        by_prefix.setdefault(_strip(raw)[1] if len(raw) <= MAX_LINE_CHARS else None, []).append((lineno, raw))
    dumps: list[ProcessDump] = []
    readings: list[LabelReading] = []
    skipped: dict[str, list[int]] = {}
    text: list[str] = []
    for prefix, numbered in by_prefix.items():
        parser = _Parser(where, prefix)
        for lineno, raw in numbered:
            parser.feed(lineno, raw)
        parser.finish()
        for why, at in parser.skipped.items():
            skipped.setdefault(why, []).extend(at)
        text.extend(parser.text)
        groups = [g for g in parser.groups if g.blocks]
        if prefix is not None and len(groups) > 1:  # all the lines of one rank: one process
            groups = [
                _Group(groups[0].line, groups[0].label, groups[0].label_line, [b for g in groups for b in g.blocks])
            ]
        for group in groups:
            if group.blocks:
                reading = _reading(group, prefix)
                readings.append(reading)
                dumps.extend(_dumps(group, reading))
    if len(dumps) > MAX_WORLD_SIZE:
        raise DumpFileError(
            f"{where}: stacks of {len(dumps):,} processes, more than the {MAX_WORLD_SIZE:,} ranks hangdoc analyses"
        )
    dumps.sort(key=lambda d: d.line)
    world = world_size_in(text)
    if world is not None:
        dumps = [replace(d, world_size=world[0]) for d in dumps]
    return CondensedRead(
        tuple(dumps), tuple(readings), world, tuple((why, tuple(sorted(at))) for why, at in skipped.items())
    )


def _reading(group: _Group, prefix: int | None) -> LabelReading:
    if prefix is not None:  # every line says its rank
        return LabelReading(
            group.label or f"[rank{prefix}]:", group.label_line or group.line, (prefix,), LabelIndex.RANK
        )
    named = label_ranks(group.label) if group.label else None
    if named is not None:
        return LabelReading(group.label, group.label_line or group.line, named.ranks, named.kind, len(named.ranks))
    count = label_count(group.label) if group.label else None
    return LabelReading(group.label, group.label_line or group.line, (), None, count or 1)


def _dumps(group: _Group, reading: LabelReading) -> list[ProcessDump]:
    threads = _threads(group)
    if not reading.ranks:
        return [ProcessDump(group.line, None, "", group.label, threads)] * reading.count
    words = f"the label {reading.label!r} (line {reading.line})"
    if reading.kind is not LabelIndex.RANK and reading.kind is not None:
        words += f", a {reading.kind.value}"
    return [
        ProcessDump(group.line, None, "", group.label, threads, rank=rank, rank_words=words) for rank in reading.ranks
    ]


def describe(read: CondensedRead, name: str) -> list[str]:
    """The notes on what ``read`` took from the labels and text, and what it skipped."""
    notes: list[str] = []
    said = [r for r in read.labels if r.ranks]
    if said:
        parts = [
            f"{r.label!r} -> rank{'s' if len(r.ranks) > 1 else ''} {_ranges(r.ranks)}"
            + ("" if r.kind is LabelIndex.RANK or r.kind is None else f" ({r.kind.value})")
            for r in said
        ]
        notes.append("ranks read from labels: " + "; ".join(parts))
    unnamed = [r for r in read.labels if not r.ranks]
    if said and unnamed:
        notes.append(
            f"{len(unnamed)} stack{'s' if len(unnamed) != 1 else ''} under labels "
            "that name no rank ("
            + ", ".join(repr(r.label) if r.label else f"no label, line {r.line}" for r in unnamed[:4])
            + "): rank numbers follow the file's order"
        )
    counted = [r for r in read.labels if r.count > 1 and not r.ranks]
    for r in counted:
        notes.append(f"{r.count} processes with one stack read from the label {r.label!r}: the post names none of them")
    seen = sorted({d.rank for d in read.dumps if d.rank is not None})
    if seen and len(seen) == len(read.dumps):
        notes.append(f"ranks seen: {_ranges(tuple(seen))}; no other rank is in this text")
    if read.world_size is not None:
        notes.append(f"world size {read.world_size[0]}, as the text says: {read.world_size[1][:100]!r}")
    if read.skipped:
        notes.append(
            f"lines of {name} skipped: " + "; ".join(f"{_ranges(at, 'line')} ({why})" for why, at in read.skipped)
        )
    return notes


def _ranges(numbers: tuple[int, ...], word: str = "") -> str:
    spans: list[str] = []
    ordered = sorted(set(numbers))
    start = prev = ordered[0]
    for n in [*ordered[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        spans.append(f"{start}" if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    head = f"{word}{'s' if len(ordered) > 1 else ''} " if word else ""
    listed = ", ".join(spans[:12]) + (f" and {len(spans) - 12} more" if len(spans) > 12 else "")
    return head + listed
