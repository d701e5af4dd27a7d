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
library frames from one package are folded into one line that names the library's function
the job called, by its package path (``torch.distributed.all_reduce
(torch/distributed/distributed_c10d.py:2800)``), not the decorators it passes through; a
stretch longer than ``max_frames`` lines keeps its first and last lines, which sit next to
the divergence points and the leaves.

The header says what the confidence rests on one phrase a line (``basis: · …``). The rank
table says each rank's state; in a job that is not hung no rank is "blocked": off CPU, it is
waiting, on CPU, running. Which frames fold and in what words is ``frames``'s to decide; a
rank's row, the classes of ranks and their words are ``rows``'s, shared with ``--html``.

The same report reads at 4 ranks and at 100,000 (a screen or two, a few hundred lines at
most); what changes with size changes only where it helps:

- rank sets are ranges with their count past 32 ranks (``[0-49999,50008-99999] (99,992)``),
  cut at a comma where long;
- at a divergence point the outlier and culprit branches come first, and only the top of an
  outlier branch is marked; past ``_BRANCHES`` branches at one point, or once the tree has
  taken ``_TREE_ROWS`` lines, the other branches fold into one line each;
- the trunk above the first divergence, common to every rank, is folded to its first line
  and the two above the split (``… 31 frames in common …``) when it is longer than
  ``_TRUNK_ROWS`` lines;
- the rank table has one row per rank up to ``max_rank_rows`` ranks (32: with the header
  and the tree, what two screens hold, and as many rows as one still reads one by one);
  beyond, one row per class of ranks in the same state, op and call site, with their
  ranges and count, culprits first, then the largest;
- evidence that says one thing of many ranks, one bullet a rank, becomes one bullet; a note
  that each node of a fleet made (``node7: not counted as ranks …: pid …``) becomes one
  line with the count of processes and nodes; long lists of unreachable agents are
  grouped by reason; ``--json`` keeps every item.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from itertools import chain, pairwise

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
    Evidence,
    Frame,
    JobSnapshot,
    Note,
    NoteKind,
    RankState,
    RootCause,
    ThreadStack,
    TreeNode,
    Unreachable,
    Verdict,
)
from ..rankranges import count_text, cut_ranges, ranks_label, scope_text
from ..waitwords import command_words, counted, waits_words, who
from .frames import Row, RowKind, fold
from .rows import CLASS_ROWS, RANK_ROWS, RankClass, RankRow, rank_classes, rank_rows

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
_RANKS_LABEL_MAX = 24  # characters of ranges in a tree or table label before it is cut
_LABEL_BESIDE = 16  # a tree label this wide sits beside its frames; a wider one above them
_HEADER_RANKS_MAX = 60  # ... in the header's culprit ranks
_CODE_MAX = 60
_TRUNK_ROWS = 5  # lines of the common trunk shown whole; a longer one is folded
_BRANCHES = 8  # branches shown at one divergence point; the rest fold into one line
_TREE_ROWS = 120  # lines of tree after which branches that are not outliers fold
_EVIDENCE = 24  # evidence bullets shown; --json has them all
_ALIKE = 5  # "rank N <same words>" bullets (or per-node notes) merged from this many on
_NOTES = 16  # notes shown
_UNREACHABLE = 8  # unreachable agents listed one a line; beyond, grouped by reason


def render(
    diagnosis: Diagnosis,
    snapshot: JobSnapshot,
    console: Console,
    *,
    max_frames: int = 12,
    max_rank_rows: int = RANK_ROWS,
) -> None:
    """Print the report of ``diagnosis`` to ``console``.

    ``max_frames`` caps the lines of one unbranched stretch of the stack tree;
    ``max_rank_rows`` caps the per-rank table, beyond which ranks in the same state, op and
    call site share one row.
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
        if len(diagnosis.ranks) <= max_rank_rows:
            console.print(_rank_table(rank_rows(diagnosis.ranks, culprits, diagnosis.verdict)))
        else:
            console.print(_class_table(rank_classes(diagnosis.ranks, culprits, diagnosis.verdict)))
    _section(console, "Wait chain (where the ranks' wait ends)", _chain(diagnosis.root_cause, snapshot))
    _section(console, "Other processes of the job", _others(snapshot))
    _section(console, "Evidence", _bullets(_evidence(diagnosis.evidence)))
    _section(console, "Next steps", _numbered(diagnosis.next_steps))
    _section(console, "Unreachable", _unreachable(snapshot))
    _section(console, "GPUs", _gpus(snapshot, culprits))
    _section(console, "Notes", _notes(diagnosis, snapshot))


# ------------------------------------------------------------------------- header


def _header(diagnosis: Diagnosis, snapshot: JobSnapshot) -> Group:
    style = _VERDICT_STYLE.get(diagnosis.verdict, _HANG_STYLE)
    head = Text.assemble(("verdict: ", "bold"), (diagnosis.verdict.value, style))
    if diagnosis.culprit_ranks:
        head.append("   culprit ranks ")
        head.append(_label(diagnosis.culprit_ranks, _HEADER_RANKS_MAX), _CULPRIT_STYLE)
    elif diagnosis.verdict is not Verdict.NOT_HUNG:
        head.append("   no culprit ranks")
    head.append("   confidence: ")
    head.append(diagnosis.confidence.value, _CONFIDENCE_STYLE[diagnosis.confidence])
    if diagnosis.partial:
        head.append("   (partial evidence)", "yellow")
    head.append("\n")
    head.append(_text(diagnosis.summary))
    found, size = len(snapshot.ranks), snapshot.world_size
    counts = counted(found if size is None else size, "rank process", "rank processes")
    if size is not None:
        counts = f"{count_text(found)} of {counts}"
    job = f"job {printable(snapshot.spec)} · {counts} found"
    scope = diagnosis.scope
    if said := scope_text(scope.seen, scope.not_seen, scope.absent, scope.world_size):
        job += f" · {said}"
    if snapshot.captured_at:
        job += f" · captured {printable(snapshot.captured_at)}"
    return Group(head, *_basis(diagnosis.basis), Text(job, "dim"))


def _basis(basis: Sequence[str]) -> list[RenderableType]:
    """What the confidence rests on, one phrase a line (``basis: · stacks of …``), a phrase
    too long for the line wrapped under itself."""
    if not basis:
        return []
    grid = Table.grid(padding=(0, 1, 0, 0))
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column()
    for i, phrase in enumerate(basis):
        grid.add_row(Text("basis:" if i == 0 else "", "bold"), Text("·", "dim"), Text(_text(phrase), "dim"))
    return [grid]


# --------------------------------------------------------------------------- tree


def _call_tree(tree: CallTree, culprits: frozenset[int], max_frames: int) -> Tree:
    distinct = len(tree.classes)
    title = Text.assemble(
        ("Merged stacks", "bold"),
        f" of {counted(len(tree.ranks), 'rank')} {_label(tree.ranks, count=False)}, "
        f"{counted(distinct, 'distinct stack')}",
    )
    top = Tree(title, guide_style="dim")
    parent = {kid: node.node_id for node in tree.nodes for kid in node.children}
    outliers = tree.outliers

    def blamed(node: TreeNode) -> bool:
        return bool(node.ranks) and len(node.ranks) <= len(culprits) and culprits.issuperset(node.ranks)

    def outlier_top(node: TreeNode) -> bool:  # the top of an outlier branch
        return node.node_id in outliers and parent.get(node.node_id, ROOT) not in outliers

    def culprit_top(node: TreeNode) -> bool:  # the top of a branch of culprits only
        above = parent.get(node.node_id, ROOT)
        return blamed(node) and (above == ROOT or not blamed(tree.node(above)))

    def marked(node: TreeNode) -> bool:
        return outlier_top(node) or culprit_top(node)

    majors: set[int] = set()  # the largest unmarked branch at each divergence: never folded

    def first(kids: Sequence[TreeNode]) -> list[TreeNode | _Folded]:
        """Marked branches first, then the rest in rank order; past ``_BRANCHES``, the
        smallest of the rest (and the marked past ``_BRANCHES``) fold into one line."""
        shown = [k for k in kids if marked(k)]
        rest = sorted((k for k in kids if not marked(k)), key=lambda k: -len(k.ranks))
        if rest:
            majors.add(rest[0].node_id)
        out: list[TreeNode | _Folded] = list(shown[:_BRANCHES])
        if len(shown) > _BRANCHES:
            out.append(_Folded(shown[_BRANCHES:], "outlier "))
        room = max(1, _BRANCHES - len(shown))
        kept = {k.node_id for k in (rest if len(rest) <= room else rest[: max(1, room - 1)])}
        out += [k for k in kids if k.node_id in kept]  # in rank order
        if len(kept) < len(rest):
            out.append(_Folded([k for k in kids if not marked(k) and k.node_id not in kept]))
        return out

    def spared(node: TreeNode, rows: int) -> bool:
        """Not folded in a long tree (marked, or a majority), unless twice as long."""
        return (marked(node) or node.node_id in majors) and rows < 2 * _TREE_ROWS

    rows = 0
    todo: list[tuple[Tree, list[TreeNode | _Folded]]] = [(top, first(tree.children(ROOT)))]
    while todo:
        branch_of, kids = todo[-1]
        if not kids:
            todo.pop()
            continue
        start = kids.pop(0)
        if isinstance(start, _Folded):
            branch_of.add(start.label())
            rows += 1
            continue
        if rows >= _TREE_ROWS and not spared(start, rows):
            # the tree is long: this branch and its siblings not spared fold into one line
            keep = [k for k in kids if isinstance(k, TreeNode) and spared(k, rows)]
            folded = [start, *(n for k in kids if k not in keep for n in (k.nodes if isinstance(k, _Folded) else [k]))]
            kids[:] = keep
            branch_of.add(_Folded(folded).label())
            rows += 1
            continue
        stretch = [start]
        below = tree.children(start.node_id)
        while len(below) == 1 and len(below[0].ranks) == len(start.ranks):  # the same ranks
            stretch.append(below[0])
            below = tree.children(below[0].node_id)
        frames = [n.frame for n in stretch if n.frame is not None]
        trunk = parent.get(start.node_id, ROOT) == ROOT and len(start.ranks) == len(tree.ranks) and bool(below)
        label, lines = _stretch_label(
            frames,
            start.ranks if len(start.ranks) != len(tree.ranks) else None,
            outlier=outlier_top(start),
            culprit=culprit_top(start),
            max_frames=max_frames,
            trunk=trunk,
        )
        rows += lines
        branch = branch_of.add(label)
        if below:
            todo.append((branch, first(below)))
    return top


class _Folded:
    """Sibling branches folded into one line: ``… 17 more branches: ranks [5,9,…] (312)
    (all in --html)``."""

    def __init__(self, nodes: list[TreeNode], kind: str = "") -> None:
        self.nodes, self.kind = nodes, kind

    def label(self) -> Text:
        ranks = sorted(chain.from_iterable(n.ranks for n in self.nodes))
        many = len(self.nodes) != 1
        return Text(
            f"… {count_text(len(self.nodes))} more {self.kind}branch{'es' if many else ''}"
            f": ranks {_label(ranks, count=True)} (all in --html)",
            "dim",
        )


def _group_tree(diagnosis: Diagnosis, culprits: frozenset[int], max_frames: int) -> Tree:
    top = Tree(Text("Stack groups", "bold"), guide_style="dim")
    for group in diagnosis.groups:
        culprit = bool(group.ranks) and culprits.issuperset(group.ranks)
        label = Text.assemble(
            (_label(group.ranks), _CULPRIT_STYLE if culprit else "bold"),
            f" group {group.group_id}: ",
            printable(group.op.describe()) if group.op else "no distributed op",
        )
        if culprit:
            label.append("  ◀ culprit", _CULPRIT_STYLE)
        rows, _ = _stretch_label(group.stack, None, outlier=False, culprit=False,
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
    trunk: bool = False,
) -> tuple[RenderableType, int]:
    """One unbranched stretch: its lines beside its ranks (when given), marks on line one;
    and how many lines it has (before wrapping)."""
    rows = [(_row_text(row), row.frames) for row in fold(frames)]
    lines = (_fold_trunk(rows) if trunk else _elide(rows, max_frames)) or [Text("(no frames)", "dim")]
    marks = [m for m, on in (("outlier", outlier), ("culprit", culprit)) if on]
    body: RenderableType
    if marks:
        body = _Marked(
            lines, Text("◀ " + ", ".join(marks), _CULPRIT_STYLE if culprit else ""), _OUTLIER_STYLE if outlier else ""
        )
    else:
        body = Text("\n").join(lines)
    if ranks is None:
        return body, len(lines)
    label = Text(_label(ranks), _CULPRIT_STYLE if culprit else "bold")
    if label.cell_len > _LABEL_BESIDE:  # a long label on a line of its own, the frames below
        return Group(label, body), len(lines) + 1
    grid = Table.grid(padding=(0, 1, 0, 0))
    grid.add_column(no_wrap=True)
    grid.add_column()
    grid.add_row(label, body)
    return grid, len(lines)


class _Marked:
    """A stretch's lines with its marks (``◀ outlier, culprit``) at the end of the first
    line, or, where that line and the marks are wider than the space given (a narrow
    terminal), on a line of their own above it: the marks are never broken in two."""

    def __init__(self, lines: list[Text], mark: Text, style: str) -> None:
        self.lines, self.mark, self.style = lines, mark, style

    def _text(self, width: int | None) -> Text:
        first = self.lines[0] + Text("  ") + self.mark
        lines = [self.mark, *self.lines] if width is not None and first.cell_len > width else [first, *self.lines[1:]]
        body = Text("\n").join(lines)
        if self.style:
            body.stylize_before(self.style)
        return body

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self._text(options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self._text(None))


def _label(ranks: Sequence[int], limit: int = _RANKS_LABEL_MAX, *, count: bool | None = None) -> str:
    """``[0-2,5]``; ``[0-49999,50008-99999] (99,992)`` (see ``rankranges.ranks_label``);
    ``count`` forces the count on or off."""
    ordered = ranks if all(a < b for a, b in pairwise(ranks)) else sorted(set(ranks))
    if count is None:
        return ranks_label(ordered, limit, RANK_ROWS)
    text, _ = cut_ranges(ordered, limit)
    return f"[{text}]" + (f" ({count_text(len(ordered))})" if count else "")


def _row_text(row: Row) -> Text:
    """A folded stack's line styled: library and native lines dim, a line of the job's own
    code followed by its source line (cut to ``_CODE_MAX``)."""
    if row.kind is RowKind.NATIVE:
        return Text(row.words, "dim italic")
    if row.kind is not RowKind.OWN:
        return Text(row.words, "dim")
    text = Text(row.words)
    if row.code:
        code = row.code.strip()
        if len(code) > _CODE_MAX:
            code = code[: _CODE_MAX - 1] + "…"
        text.append(f"  {printable(code)}", "dim cyan")
    return text


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


def _fold_trunk(rows: list[tuple[Text, int]]) -> list[Text]:
    """The trunk every rank shares above the first split: past ``_TRUNK_ROWS`` lines, its
    first line (the job's entry point) and the two lines above the split."""
    if len(rows) <= _TRUNK_ROWS:
        return [text for text, _ in rows]
    hidden = sum(n for _, n in rows[1:-2])
    marker = Text(f"… {hidden} frames in common …", "dim")
    return [rows[0][0], marker, rows[-2][0], rows[-1][0]]


# ---------------------------------------------------------------------- rank table


def _rank_table(rows: Sequence[RankRow]) -> Table:
    """One row per rank."""
    with_detail = any(row.detail for row in rows)
    table = Table(title=None, show_edge=False, header_style="bold", pad_edge=False)
    for name in ("rank", "host", "pid", "state", "op", "call site"):
        table.add_column(name, no_wrap=name in ("rank", "pid", "state"))
    if with_detail:
        table.add_column("detail")
    for row in rows:
        rank_cell = ("?" if row.rank is None else str(row.rank)) + (" *" if row.culprit else "")
        cells = [
            Text(rank_cell, _CULPRIT_STYLE if row.culprit else ""),
            Text(printable(row.host)),
            Text(str(row.pid) if row.pid is not None else ""),
            _state(row.state, row.state_word),
            Text(printable(row.op)),
            Text(printable(row.site)),
        ]
        if with_detail:
            cells.append(Text(printable(row.detail), "dim"))
        table.add_row(*cells)
    if any(row.culprit for row in rows):
        table.caption = "* culprit"
        table.caption_justify = "left"
    return table


def _class_table(classes: Sequence[RankClass]) -> Group:
    """One row per class of ranks (``rows.rank_classes``: culprits first, then the
    largest), at most ``CLASS_ROWS`` rows. What the analysis says of each class
    (``detail``) follows the table, a line or two per class: in a column it would wrap a
    word a line."""
    table = Table(title=None, show_edge=False, header_style="bold", pad_edge=False)
    for name in ("ranks", "count", "hosts", "state", "op", "call site"):
        table.add_column(
            name, no_wrap=name in ("ranks", "count", "state"), justify="right" if name == "count" else "left"
        )
    details = []
    for rc in classes[:CLASS_ROWS]:
        cell = Text(rc.label(_RANKS_LABEL_MAX) + (" *" if rc.culprit else ""), _CULPRIT_STYLE if rc.culprit else "")
        table.add_row(
            cell,
            Text(count_text(len(rc.members))),
            Text(printable(rc.hosts)),
            _state(rc.state, rc.state_word),
            Text(printable(rc.op)),
            Text(printable(rc.site)),
        )
        detail = rc.detail
        if detail:
            details.append(Text.assemble(cell, ": ", (printable(detail), "dim")))
    if len(classes) > CLASS_ROWS:
        rest = sum(len(rc.members) for rc in classes[CLASS_ROWS:])
        table.add_row(
            Text(f"… {count_text(len(classes) - CLASS_ROWS)} more classes", "dim"),
            Text(count_text(rest), "dim"),
            Text("(--json lists every rank)", "dim"),
        )
    ranks = sum(len(rc.members) for rc in classes)
    table.caption = f"{count_text(ranks)} ranks in {count_text(len(classes))} classes" + (
        " · * culprit" if any(rc.culprit for rc in classes) else ""
    )
    table.caption_justify = "left"
    return Group(table, *details)


def _state(state: RankState, word: str) -> Text:
    """A rank's state in its words (``rows.state_word``), coloured by the state where the
    words are the state's own."""
    return Text(word, _STATE_STYLE.get(state, "") if word == state.value else "")


# ---------------------------------------------------------------------- sections


_END_FRAMES = 8  # frames of the root's thread shown under the chain, innermost last


def _chain(root: RootCause | None, snapshot: JobSnapshot) -> list[Text]:
    """The links from the ranks to the process that holds the wait, then that thread's stack."""
    if root is None:
        return []
    lines = []
    for i, link in enumerate(root.chain):
        last = i == len(root.chain) - 1
        head = Text.assemble(("▶ " if last else "  "), (_text(who(link)), _CULPRIT_STYLE if last else ""))
        if last:
            head.append("   ◀ root cause", _CULPRIT_STYLE)
        lines.append(head)
        said = waits_words(link)
        if said:
            back = "   ↺ back into the chain: a deadlock across processes" if last and root.cycle else ""
            how = "" if link.certain else " (inferred)"
            lines.append(Text.assemble("    └─ ", _text(said), (how, "dim"), (back, "yellow")))
    thread = _root_thread(root, snapshot)
    if thread is not None:
        lines.append(Text(f"    stack of thread '{root.thread}' (innermost last):", "dim"))
        for frame in [f for f in thread.frames if not f.native][-_END_FRAMES:]:
            where = f"{frame.function} ({frame.short_filename}:{frame.line or '?'})"
            lines.append(Text("      " + _text(where)))
            if frame.code:
                lines.append(Text("        " + _text(frame.code), "dim"))
    return lines


_OTHERS = 12  # other processes listed; --json has them all


def _others(snapshot: JobSnapshot) -> list[Text]:
    """The processes met past the ranks, by what they run."""
    lines = []
    for proc in snapshot.beyond[:_OTHERS]:
        good = proc.good_samples
        threads = ", ".join(f"'{t.name or t.thread_id}'" for t in good[-1].threads[:6]) if good else "not sampled"
        runs = command_words(proc.process.cmdline) or "?"
        lines.append(Text("• " + _text(f"pid {proc.process.pid} on {proc.process.host}: {runs} — threads {threads}")))
    if len(snapshot.beyond) > _OTHERS:
        lines.append(Text(f"  … and {len(snapshot.beyond) - _OTHERS} more (--json lists them all)", "dim"))
    return lines


def _root_thread(root: RootCause, snapshot: JobSnapshot) -> ThreadStack | None:
    for proc in (*snapshot.beyond, *snapshot.ranks):
        if proc.process.pid == root.pid and proc.process.host == root.host:
            good = proc.good_samples
            if good:
                return next((t for t in good[-1].threads if (t.name or str(t.thread_id)) == root.thread), None)
    return None


def _section(console: Console, title: str, lines: list[Text]) -> None:
    if not lines:
        return
    console.print()
    console.print(Text(title, "bold underline"))
    console.print(Group(*lines))


def _bullets(items: Iterable[str]) -> list[Text]:
    return [Text.assemble("• ", _text(item)) for item in items]


def _numbered(items: Iterable[str]) -> list[Text]:
    return [Text.assemble(f"{i}. ", _text(item)) for i, item in enumerate(items, start=1)]


# A list of rank numbers and ranges as ``rankranges`` writes them (``0-2,5,9``): a whole
# token (atomic: a list followed by a letter, a dash or a decimal point is no list, and never
# a part of one).
_RANK_LIST = re.compile(r"(?<![\w.,\-])(?>\d+(?:-\d+)?(?:,\d+(?:-\d+)?){7,})(?![\w\-]|\.\d)")
_RANGES_IN_TEXT = 60  # characters of a rank list quoted in a sentence before it is cut


def _text(text: str) -> str:
    """``printable(text)``, a long list of ranks in it (``0,2,4,…`` of 50,000 ranks, which
    would fill a screen) cut at a comma, with its count."""
    return printable(_RANK_LIST.sub(_cut_ranks, text))


def _cut_ranks(match: re.Match[str]) -> str:
    """A rank list longer than ``_RANGES_IN_TEXT`` cut after its last whole item that fits,
    with how many ranks it holds. Only a list that rises, as ``rankranges`` writes rank lists,
    is one (``1,234,567`` is a number; ``7,3,9`` lists something else)."""
    found = match.group()
    if len(found) <= _RANGES_IN_TEXT:
        return found
    runs = [tuple(map(int, part.split("-"))) for part in found.split(",")]
    if any(run[0] > run[-1] for run in runs) or any(a[-1] >= b[0] for a, b in pairwise(runs)):
        return found
    kept: list[str] = []
    shown = 0
    for part in found.split(","):
        if kept and shown + len(part) + 1 > _RANGES_IN_TEXT:
            break
        kept.append(part)
        shown += len(part) + 1
    count = sum(run[-1] - run[0] + 1 for run in runs)
    return f"{','.join(kept)},… ({counted(count, 'rank')})"


def _evidence(items: Sequence[Evidence]) -> list[str]:
    """The evidence, where ``_ALIKE`` or more items say the same of one rank each (``rank
    512`` + ``is on a cleanup path: …``) one bullet for them all; at most ``_EVIDENCE``."""
    alike: dict[str, list[int]] = {}
    for item in items:
        if item.rank is not None:
            alike.setdefault(item.text, []).append(item.rank)
    out: list[str] = []
    for item in items:
        ranks = alike.get(item.text, []) if item.rank is not None else []
        if len(ranks) < _ALIKE:
            out.append(item.words())
        elif item.rank == ranks[0]:
            others = sorted(set(ranks[1:]))
            out.append(
                f"{item.words()} (the same for {count_text(len(others))} more ranks: "
                f"{_label(others, 40, count=False)[1:-1]})"
            )
    if len(out) > _EVIDENCE:
        more = count_text(len(out) - _EVIDENCE + 1)
        out = [*out[: _EVIDENCE - 1], f"… and {more} more (--json lists them all)"]
    return out


_NUMBERS = re.compile(r"\d+")


def _unreachable(snapshot: JobSnapshot) -> list[Text]:
    """One line per agent that did not answer; past ``_UNREACHABLE``, one per reason."""

    def unknown(ranks: Iterable[int]) -> str:
        ranks = sorted(set(ranks))
        return f" (ranks {_label(ranks, 40)} unknown)" if ranks else ""

    lines = []
    if len(snapshot.unreachable) <= _UNREACHABLE:
        for u in snapshot.unreachable:
            line = Text.assemble(("✗ ", "red"), (printable(u.target), "bold"), f": {printable(u.reason)}")
            line.append(unknown(u.ranks), "dim")
            lines.append(line)
        return lines
    by_reason: dict[str, list[Unreachable]] = {}
    for u in snapshot.unreachable:
        by_reason.setdefault(_NUMBERS.sub("#", u.reason), []).append(u)
    for agents in sorted(by_reason.values(), key=len, reverse=True):
        names = ", ".join(printable(u.target) for u in agents[:2]) + (", …" if len(agents) > 2 else "")
        line = Text.assemble(
            ("✗ ", "red"), (f"{count_text(len(agents))} agents", "bold"), f" ({names}): {printable(agents[0].reason)}"
        )
        line.append(unknown(chain.from_iterable(u.ranks for u in agents)), "dim")
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
        lines.append(Text(f"… and {counted(len(shown) - _GPU_ROWS, 'more rank')} (--json lists them all)", "dim"))
    return lines


def _notes(diagnosis: Diagnosis, snapshot: JobSnapshot) -> list[Text]:
    samples = max((len(rs.samples) for rs in snapshot.ranks), default=0)
    plural = "s" if samples != 1 else ""
    lines = [f"observed for {diagnosis.observed_seconds:.1f} s over {samples} sample{plural}"]
    lines += _node_notes(snapshot.notes)
    if len(lines) > _NOTES:
        more = count_text(len(lines) - _NOTES + 1)
        lines = [*lines[: _NOTES - 1], f"… and {more} more notes (--json lists them all)"]
    return [Text.assemble("• ", _text(line)) for line in lines]


def _node_notes(notes: Sequence[Note]) -> list[str]:
    """The notes, where ``_ALIKE`` or more nodes said a note alike (``node7: not counted as
    ranks (DataLoader/...): pid 4242 (child of rank 56 (pid 4100)), …``), one line for them
    all: the count of processes listed and of nodes."""
    groups: dict[tuple[NoteKind, str], list[Note]] = {}
    for note in notes:
        if note.node:
            groups.setdefault(_alike(note), []).append(note)
    out: list[str] = []
    done: set[tuple[NoteKind, str]] = set()
    for note in notes:
        key = _alike(note)
        said = groups.get(key, []) if note.node else []
        if len(said) < _ALIKE:
            out.append(note.words())
            continue
        if key in done:
            continue
        done.add(key)
        nodes = sorted({n.node for n in said})
        where = f"{count_text(len(nodes))} nodes ({', '.join(nodes[:2])}, …)"
        if note.listed:
            processes = sum(len(n.pids) for n in said)
            out.append(f"{note.text}: {count_text(processes)} processes on {where}; --json lists every pid")
        else:
            first = dataclasses.replace(said[0], node="").words()
            out.append(f"{first} (and alike on {count_text(len(said) - 1)} more of {where})")
    return out


def _alike(note: Note) -> tuple[NoteKind, str]:
    """What makes notes of several nodes one line: a note that lists processes by its words
    without the list; any other by its kind, or its words where the kind is ``OTHER``."""
    if note.listed or note.kind is NoteKind.OTHER:
        return note.kind, note.text
    return note.kind, ""
