"""The human report: verdict and its confidence, merged stack tree, per-rank table, evidence,
next steps.

Everything is printed through the caller's ``rich`` ``Console``, so ``NO_COLOR``, the
terminal width and output capture are the console's business. Data from the job (function
names, paths, source lines, host names, notes, and the analysis' sentences that quote them)
is always wrapped in ``Text``, never parsed as markup (a function named ``[bold]x[/]``
prints as such), and passed through ``printable``: control characters, bidi overrides and
lone surrogates are shown as escapes (``\\x1b``, ``\\u202e``), so nothing a job or a
snapshot file holds can clear the screen, retitle the window or reorder a line.

The tree is ``Diagnosis.tree`` as the analysis built it. An unbranched stretch of it (one
set of ranks, one child after another) becomes a single tree node of several lines; runs of
library frames from one package are folded into one line (``torch: wrapper › all_reduce
(distributed_c10d.py:2800)``), and a stretch longer than ``max_frames`` lines keeps its
first and last lines, which sit next to the divergence points and the leaves.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from ..errors import printable
from ..model import (
    ROOT,
    CallTree,
    Confidence,
    Diagnosis,
    DistOp,
    Frame,
    JobSnapshot,
    RankAnalysis,
    RankState,
    Verdict,
    compress_ranks,
)

_VERDICT_STYLE = {Verdict.NOT_HUNG: "bold green", Verdict.UNKNOWN: "bold yellow"}
_HANG_STYLE = "bold red"
_CONFIDENCE_STYLE = {Confidence.HIGH: "green", Confidence.MEDIUM: "yellow",
                     Confidence.LOW: "bold yellow"}  # fmt: skip
_STATE_STYLE = {
    RankState.WAITING: "yellow",
    RankState.COMMUNICATING: "cyan",
    RankState.BUSY: "magenta",
    RankState.BLOCKED: "red",
    RankState.STOPPED: "red",
    RankState.PROGRESSING: "green",
    RankState.EXITED: "red",
    RankState.UNREADABLE: "dim",
    RankState.MISSING: "bold red",
    RankState.UNKNOWN: "dim",
}
_CULPRIT_STYLE = "bold red"
_OUTLIER_STYLE = "bold yellow"
_LIB_MARKERS = ("site-packages/", "dist-packages/", "/lib/python3")
_RANKS_LABEL_MAX = 20
_CODE_MAX = 60


def render(
    diagnosis: Diagnosis,
    snapshot: JobSnapshot,
    console: Console,
    *,
    max_frames: int = 12,
    max_rank_rows: int = 64,
) -> None:
    """Print the report of ``diagnosis`` to ``console``.

    ``max_frames`` caps the lines of one unbranched stretch of the stack tree;
    ``max_rank_rows`` caps the per-rank table, beyond which ranks alike are merged
    into one row.
    """
    culprits = frozenset(diagnosis.culprit_ranks)
    console.print(_header(diagnosis, snapshot))
    console.print()
    if diagnosis.tree is not None:
        console.print(_call_tree(diagnosis.tree, culprits, max_frames))
    elif diagnosis.groups:
        console.print(_group_tree(diagnosis, culprits, max_frames))
    if diagnosis.ranks:
        console.print()
        console.print(_rank_table(diagnosis.ranks, culprits, max_rank_rows))
    _section(console, "Evidence", _bullets(diagnosis.evidence))
    _section(console, "Next steps", _numbered(diagnosis.next_steps))
    _section(console, "Unreachable", _unreachable(snapshot))
    _section(console, "GPUs", _gpus(snapshot, culprits))
    _section(console, "Notes", _notes(diagnosis, snapshot))


# ------------------------------------------------------------------------- header


def _header(diagnosis: Diagnosis, snapshot: JobSnapshot) -> Text:
    style = _VERDICT_STYLE.get(diagnosis.verdict, _HANG_STYLE)
    head = Text.assemble(("verdict: ", "bold"), (diagnosis.verdict.value, style))
    if diagnosis.culprit_ranks:
        head.append("   culprit ranks ")
        head.append(compress_ranks(diagnosis.culprit_ranks), _CULPRIT_STYLE)
    elif diagnosis.verdict is not Verdict.NOT_HUNG:
        head.append("   no culprit ranks")
    head.append("   confidence: ")
    head.append(diagnosis.confidence.value, _CONFIDENCE_STYLE[diagnosis.confidence])
    if diagnosis.partial:
        head.append("   (partial evidence)", "yellow")
    head.append("\n")
    head.append(printable(diagnosis.summary))
    if diagnosis.basis:
        head.append("\nbasis: ", "bold")
        head.append(printable(" · ".join(diagnosis.basis)), "dim")
    found = len(snapshot.ranks)
    size = f" of {snapshot.world_size}" if snapshot.world_size is not None else ""
    job = f"\njob {printable(snapshot.spec)} · {found}{size} rank processes found"
    if snapshot.captured_at:
        job += f" · captured {printable(snapshot.captured_at)}"
    head.append(job, "dim")
    return head


# --------------------------------------------------------------------------- tree


def _call_tree(tree: CallTree, culprits: frozenset[int], max_frames: int) -> Tree:
    distinct = len(tree.classes)
    title = Text.assemble(
        ("Merged stacks", "bold"),
        f" of {len(tree.ranks)} ranks {compress_ranks(tree.ranks)}, "
        f"{distinct} distinct stack{'s' if distinct != 1 else ''}",
    )
    top = Tree(title, guide_style="dim")
    outliers = tree.outliers
    # branches to render: (parent rich node, first tree node of the stretch)
    todo = [(top, kid) for kid in reversed(tree.children(ROOT))]
    while todo:
        parent, start = todo.pop()
        stretch = [start]
        kids = tree.children(start.node_id)
        while len(kids) == 1 and kids[0].ranks == start.ranks:
            stretch.append(kids[0])
            kids = tree.children(kids[0].node_id)
        frames = [n.frame for n in stretch if n.frame is not None]
        show_ranks = start.ranks != tree.ranks
        label = _stretch_label(
            frames,
            start.ranks if show_ranks else None,
            outlier=start.node_id in outliers,
            culprit=bool(start.ranks) and culprits.issuperset(start.ranks),
            max_frames=max_frames,
        )
        branch = parent.add(label)
        todo.extend((branch, kid) for kid in reversed(kids))
    return top


def _group_tree(diagnosis: Diagnosis, culprits: frozenset[int], max_frames: int) -> Tree:
    top = Tree(Text("Stack groups", "bold"), guide_style="dim")
    for group in diagnosis.groups:
        culprit = bool(group.ranks) and culprits.issuperset(group.ranks)
        label = Text.assemble(
            (_ranks_label(group.ranks), _CULPRIT_STYLE if culprit else "bold"),
            f" group {group.group_id}: ",
            printable(group.op.describe()) if group.op else "no distributed op",
        )
        if culprit:
            label.append("  ◀ culprit", _CULPRIT_STYLE)
        rows = _stretch_label(group.stack, None, outlier=False, culprit=False,
                              max_frames=max_frames)  # fmt: skip
        top.add(Group(label, rows))
    return top


def _stretch_label(
    frames: Sequence[Frame],
    ranks: Sequence[int] | None,
    *,
    outlier: bool,
    culprit: bool,
    max_frames: int,
) -> RenderableType:
    """One unbranched stretch: its lines beside its ranks (when given), marks on line one."""
    lines = _elide(_fold(frames), max_frames) or [Text("(no frames)", "dim")]
    marks = [m for m, on in (("outlier", outlier), ("culprit", culprit)) if on]
    body: RenderableType
    if marks:
        body = _Marked(lines, Text("◀ " + ", ".join(marks), _CULPRIT_STYLE if culprit else ""),
                       _OUTLIER_STYLE if outlier else "")
    else:
        body = Text("\n").join(lines)
    if ranks is None:
        return body
    grid = Table.grid(padding=(0, 1, 0, 0))
    grid.add_column(no_wrap=True)
    grid.add_column()
    grid.add_row(Text(_ranks_label(ranks), _CULPRIT_STYLE if culprit else "bold"), body)
    return grid


class _Marked:
    """A stretch's lines with its marks (``◀ outlier, culprit``) at the end of the first
    line, or, where that line and the marks are wider than the space given (a narrow
    terminal), on a line of their own above it: the marks are never broken in two."""

    def __init__(self, lines: list[Text], mark: Text, style: str) -> None:
        self.lines, self.mark, self.style = lines, mark, style

    def _text(self, width: int | None) -> Text:
        first = self.lines[0] + Text("  ") + self.mark
        if width is not None and first.cell_len > width:
            lines = [self.mark, *self.lines]
        else:
            lines = [first, *self.lines[1:]]
        body = Text("\n").join(lines)
        if self.style:
            body.stylize_before(self.style)
        return body

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self._text(options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self._text(None))


def _ranks_label(ranks: Sequence[int]) -> str:
    full = compress_ranks(ranks)
    if len(full) <= _RANKS_LABEL_MAX:
        return full
    cut = full.rfind(",", 0, _RANKS_LABEL_MAX - 3)
    head = full[:cut] if cut > 0 else full[: _RANKS_LABEL_MAX - 3]
    return f"{head},…]({len(set(ranks))})"


def _package(frame: Frame) -> str | None:
    """The library a frame belongs to, or None for the job's own code."""
    if frame.native:
        return "native"
    name = frame.filename.replace("\\", "/")
    if name.startswith("<"):
        words = name.strip("<>").split()  # "<frozen runpy>" -> "runpy"
        return words[-1] if words else name
    if any(marker in name for marker in _LIB_MARKERS):
        return frame.short_filename.split("/", 1)[0].removesuffix(".py")
    return None


def _fold(frames: Sequence[Frame]) -> list[tuple[Text, int]]:
    """One row per user frame, one per run of library frames of one package.

    Each row carries the number of frames it stands for.
    """
    rows: list[tuple[Text, int]] = []
    i = 0
    while i < len(frames):
        pkg = _package(frames[i])
        j = i + 1
        while pkg is not None and j < len(frames) and _package(frames[j]) == pkg:
            j += 1
        run = frames[i:j]
        rows.append((_library_row(pkg, run) if len(run) > 1 else _frame_row(run[0]), len(run)))
        i = j
    return rows


def _frame_row(frame: Frame) -> Text:
    if frame.native:
        return Text(f"{printable(str(frame))} [native]", "dim italic")
    if _package(frame) is not None:
        return Text(printable(str(frame)), "dim")
    row = Text(printable(str(frame)))
    if frame.code:
        code = frame.code.strip()
        if len(code) > _CODE_MAX:
            code = code[: _CODE_MAX - 1] + "…"
        row.append(f"  {printable(code)}", "dim cyan")
    return row


_TELLING_NATIVE = re.compile(r"c10d::|gloo::|nccl|Reducer|Work::wait|ProcessGroup", re.IGNORECASE)


def _short_name(frame: Frame) -> str:
    if frame.native:
        return frame.function.split("(", 1)[0].split("<", 1)[0]
    return frame.function.rsplit(".", 1)[-1]


def _library_row(pkg: str | None, run: Sequence[Frame]) -> Text:
    # "_exception_logger.<locals>.wrapper" -> "wrapper": the run is context, not the point
    names = [_short_name(f) for f in run[:-1]]
    if len(names) > 3:
        # keep the frames that say which collective the C++ side waits in
        keep = [n for n in names[1:-1] if _TELLING_NATIVE.search(n)][:3]
        hidden = len(names) - 2 - len(keep)
        names = [names[0], *keep, *([f"…{hidden} more…"] if hidden else []), names[-1]]
    return Text(printable(f"{pkg}: " + " › ".join([*names, str(run[-1])])), "dim")


def _elide(rows: list[tuple[Text, int]], max_frames: int) -> list[Text]:
    """At most ``max_frames`` rows: the first quarter and the rest from the end."""
    limit = max(3, max_frames)
    if len(rows) <= limit:
        return [text for text, _ in rows]
    head = max(1, limit // 4)
    tail = limit - head - 1
    hidden = sum(n for _, n in rows[head : len(rows) - tail])
    marker = Text(f"⋮ {hidden} frames", "dim")
    return [t for t, _ in rows[:head]] + [marker] + [t for t, _ in rows[len(rows) - tail :]]


# ---------------------------------------------------------------------- rank table


def _rank_table(ranks: Sequence[RankAnalysis], culprits: frozenset[int], max_rows: int) -> Table:
    with_detail = any(_detail(ra) for ra in ranks)
    table = Table(title=None, show_edge=False, header_style="bold", pad_edge=False)
    for name in ("rank", "host", "pid", "state", "op", "call site"):
        table.add_column(name, no_wrap=name in ("rank", "pid", "state"))
    if with_detail:
        table.add_column("detail")
    ordered = sorted(ranks, key=lambda ra: (ra.rank is None, ra.rank or 0))
    rows = _rank_rows(ordered, max_rows)
    marked = False
    for members, ra in rows:
        numbers = [m.rank for m in members if m.rank is not None]
        is_culprit = bool(numbers) and culprits.issuperset(numbers)
        marked |= is_culprit
        rank_cell = _rank_cell(members) + (" *" if is_culprit else "")
        pid_cell = str(ra.pid) if len(members) == 1 and ra.pid is not None else ""
        if len(members) > 1:
            pid_cell = f"({len(members)} pids)"
        cells = [
            Text(rank_cell, _CULPRIT_STYLE if is_culprit else ""),
            Text(printable(ra.host)),
            Text(pid_cell),
            Text(ra.state.value, _STATE_STYLE.get(ra.state, "")),
            Text(printable(_op_text(ra.op))),
            Text(printable(ra.op.call_site.location) if ra.op and ra.op.call_site else ""),
        ]
        if with_detail:
            cells.append(Text(printable(_detail(ra)), "dim"))
        table.add_row(*cells)
    if marked:
        table.caption = "* culprit"
        table.caption_justify = "left"
    return table


def _detail(ra: RankAnalysis) -> str:
    """A rank's detail, blank where it only says again what the op and call site columns
    say (``in all_reduce (train.py:30)``): a column of repeats that squeezes the others."""
    if ra.op is not None and ra.op.call_site is not None and ra.detail == f"in {ra.op.describe()}" \
            and ra.op.describe() == f"{ra.op.name} ({ra.op.call_site.location})":
        return ""
    return ra.detail


def _rank_rows(
    ranks: Sequence[RankAnalysis], max_rows: int
) -> list[tuple[list[RankAnalysis], RankAnalysis]]:
    """One row per rank, or, past ``max_rows``, one per (host, state, op, detail)."""
    if len(ranks) <= max_rows:
        return [([ra], ra) for ra in ranks]
    merged: dict[tuple[object, ...], list[RankAnalysis]] = {}
    for ra in ranks:
        key = (ra.host, ra.state, ra.op, ra.detail)
        merged.setdefault(key, []).append(ra)
    return [(members, members[0]) for members in merged.values()]


def _rank_cell(members: Sequence[RankAnalysis]) -> str:
    numbers = [m.rank for m in members if m.rank is not None]
    unnumbered = len(members) - len(numbers)
    if len(members) == 1:
        return str(numbers[0]) if numbers else "?"
    cell = _ranks_label(numbers) if numbers else ""
    return cell + (f" +{unnumbered} unnumbered" if unnumbered else "")


def _op_text(op: DistOp | None) -> str:
    if op is None:
        return "—"
    text = op.name
    if op.peer is not None:
        text += f" (peer {op.peer})"
    if op.in_cleanup:
        text += " [cleanup]"
    return text


# ---------------------------------------------------------------------- sections


def _section(console: Console, title: str, lines: list[Text]) -> None:
    if not lines:
        return
    console.print()
    console.print(Text(title, "bold underline"))
    console.print(Group(*lines))


def _bullets(items: Iterable[str]) -> list[Text]:
    return [Text.assemble("• ", printable(item)) for item in items]


def _numbered(items: Iterable[str]) -> list[Text]:
    return [Text.assemble(f"{i}. ", printable(item)) for i, item in enumerate(items, start=1)]


def _unreachable(snapshot: JobSnapshot) -> list[Text]:
    lines = []
    for u in snapshot.unreachable:
        line = Text.assemble(("✗ ", "red"), (printable(u.target), "bold"), f": {printable(u.reason)}")
        if u.ranks:
            line.append(f" (ranks {compress_ranks(u.ranks)} unknown)", "dim")
        lines.append(line)
    return lines


_GPU_ROWS = 16  # ranks listed in the GPUs section; --json has them all


def _gpus(snapshot: JobSnapshot, culprits: frozenset[int]) -> list[Text]:
    """One line per rank NVML showed on a GPU (none: no section)."""
    shown = [r for r in snapshot.ranks if r.gpus]
    lines = []
    for r in shown[:_GPU_ROWS]:
        style = _CULPRIT_STYLE if r.rank in culprits else ""
        who = f"rank {r.rank}" if r.rank is not None else f"pid {r.process.pid}"
        lines.append(Text.assemble((who, style), ": ", printable("; ".join(g.describe() for g in r.gpus))))
    if len(shown) > _GPU_ROWS:
        lines.append(Text(f"… and {len(shown) - _GPU_ROWS} more rank(s) (--json lists them all)", "dim"))
    return lines


def _notes(diagnosis: Diagnosis, snapshot: JobSnapshot) -> list[Text]:
    samples = max((len(rs.samples) for rs in snapshot.ranks), default=0)
    lines = [
        Text(
            f"observed for {diagnosis.observed_seconds:.1f} s over {samples} "
            f"sample{'s' if samples != 1 else ''}"
        )
    ]
    lines += [Text(printable(note)) for note in snapshot.notes]
    return [Text.assemble("• ", line) for line in lines]
