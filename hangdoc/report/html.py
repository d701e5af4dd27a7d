"""The ``--html`` report: one self-contained file to share, with the merged tree to explore.

The page needs nothing but itself: its CSS and JavaScript (``assets/report.css``,
``assets/report.js``, written for hangdoc, no third-party code) are inlined, and a
Content-Security-Policy forbids every fetch, so it opens the same from a mail attachment,
a CI artifact or an air-gapped cluster. The verdict, confidence, culprits, summary, the
rank table (the terminal's, from ``rows``), evidence, next steps, the picture of
``--svg`` (``graph.svg_element``, inline), basis and notes are plain HTML; the script
draws the merged stack tree (``Diagnosis.tree``, as the analysis built it), the classes
of ranks and a rank's own stacks from one JSON object embedded in the page
(``report_data``). The tree, the proof, comes first below a three-line header, so that it
is on the first screen at 1280x800 (tests/live/test_html_browser.py checks it there and
at 800x1000).

That object stays small at 100,000 ranks, and the page opens in well under a second,
because nothing in it grows with ranks times frames:

- frames and stacks are interned: each distinct frame once, each distinct thread stack
  once (a list of frame numbers), each distinct sample (its threads: name, stack, flags)
  once, each distinct series of samples (a rank's *view*) once;
- rank sets are range strings (``0-2,5``), each distinct set once; tree nodes, classes
  and culprits refer to them by number;
- per-rank columns (host, what the analysis says, view) are run-length encoded in rank
  order; only the pids are one number a rank;
- the script renders lazily: a branch's DOM is made when it is first expanded, a rank's
  stacks when the rank is shown.

Strings from the job pass through ``errors.printable`` and reach the page only as JSON
data set with ``textContent`` (or, in the static part, HTML-escaped): a function named
``<script>`` shows as such.
"""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Callable, Hashable, Iterable, Sequence
from importlib import resources
from typing import Any

from .. import __version__
from ..bundle import StackTable
from ..errors import printable
from ..model import (
    ROOT,
    CallTree,
    Diagnosis,
    Frame,
    JobSnapshot,
    RankAnalysis,
    RankSnapshot,
    RankState,
    RootCause,
    Sample,
    Verdict,
)
from ..rankranges import count_text, ranges_text, scope_text
from ..waitwords import waits_words, who
from .graph import svg_element
from .rows import CLASS_ROWS, RANK_ROWS, RankClass, RankRow, culprit_parts, rank_classes, rank_rows, state_word

DATA_VERSION = 1  # the layout of the embedded object; bumped when the script must change

_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
    "img-src data:; base-uri 'none'; form-action 'none'"
)


def render_html(diagnosis: Diagnosis, snapshot: JobSnapshot) -> str:
    """The report as one HTML document (UTF-8 text)."""
    data = report_data(diagnosis, snapshot)
    # "<" never appears raw in the embedded JSON: no "</script>" or "<!--" can end it early
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    title = f"hangdoc: {diagnosis.verdict.value} · {printable(snapshot.spec)}"
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n',
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">\n',
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
            f'<meta name="generator" content="hangdoc {html.escape(__version__)}">\n',
            f"<title>{html.escape(title)}</title>\n<style>\n{_asset('report.css')}</style>\n",
            "</head>\n<body>\n",
            _static(diagnosis, snapshot),
            f'<script type="application/json" id="hangdoc-data">{payload}</script>\n',
            f"<script>\n{_asset('report.js')}</script>\n</body></html>\n",
        ]
    )


def _asset(name: str) -> str:
    return (resources.files(__package__) / "assets" / name).read_text(encoding="utf-8")


# ------------------------------------------------------------------ the static part


def _esc(text: str) -> str:
    return html.escape(printable(text))


def _verdict_class(verdict: Verdict) -> str:
    if verdict is Verdict.NOT_HUNG:
        return "ok"
    return "unsure" if verdict is Verdict.UNKNOWN else "hang"


def _static(diagnosis: Diagnosis, snapshot: JobSnapshot) -> str:
    """The header and the text sections, as HTML; the script fills the placeholders.

    The merged tree, the proof, comes first below a header of three lines, so that it is
    on the first screen; the rank table, as the terminal prints it, follows; the longer
    sections (evidence, next steps, the picture, the basis, notes) come after."""
    partial = ' <span class="partial">partial evidence</span>' if diagnosis.partial else ""
    head = [
        "<header>",
        (
            f'<h1><span class="verdict {_verdict_class(diagnosis.verdict)}" id="verdict">'
            f"{_esc(diagnosis.verdict.value)}</span> {_culprit_line(diagnosis)}"
            f'<span class="meta">confidence <b class="conf-{diagnosis.confidence.value}" id="confidence">'
            f"{diagnosis.confidence.value}</b>{partial}</span>"
            '<span class="brand">hangdoc report</span></h1>'
        ),
        f'<p class="summary" id="summary">{_esc(diagnosis.summary)}</p>',
        f'<p class="job dim">{_job_line(diagnosis, snapshot)}</p>',
        "</header>",
        "<main>",
        '<div id="content">',
    ]
    samples = max((len(rs.samples) for rs in snapshot.ranks), default=0)
    notes = [
        (f"observed for {diagnosis.observed_seconds:.1f} s over {samples} sample{'s' if samples != 1 else ''}"),
        *(note.words() for note in snapshot.notes),
    ]
    unreachable = [
        f"{u.target}: {u.reason}" + (f" (ranks {ranges_text(sorted(set(u.ranks)))} unknown)" if u.ranks else "")
        for u in snapshot.unreachable
    ]
    body = [
        (
            '<section id="tree-section"><h2>Merged stacks</h2>'
            '<div class="toolbar"><input id="search" type="search" placeholder="search a '
            'function or file (press /)" autocomplete="off" spellcheck="false">'
            '<button id="expand-outliers" type="button">show outliers</button>'
            '<button id="collapse-all" type="button">collapse all</button>'
            '<span id="tree-stats" class="dim"></span></div>'
            '<div id="search-results"></div>'
            '<div id="tree" class="tree"><p class="dim">the tree is drawn by the page\'s '
            "script</p></div></section>"
        ),
        rank_table(diagnosis.ranks, frozenset(diagnosis.culprit_ranks), diagnosis.verdict),
        _chain(diagnosis.root_cause),
        _list("evidence", "Evidence", [e.words() for e in diagnosis.evidence], "ul"),
        _list("next-steps", "Next steps", diagnosis.next_steps, "ol"),
        _picture(diagnosis),
        '<section id="classes-section"><h2>Classes of ranks</h2><div id="classes"></div></section>',
        _list("basis", "Basis of the verdict", diagnosis.basis, "ul"),
        _list("unreachable", "Unreachable", unreachable, "ul"),
        _list("notes", "Notes", notes, "ul"),
        f'<footer class="dim">hangdoc {html.escape(__version__)}</footer>',
        "</div>",
        (
            '<aside id="rank-panel"><h2>Rank</h2><div class="toolbar">'
            '<input id="rank-input" type="text" inputmode="numeric" placeholder="rank number" '
            'autocomplete="off"><button id="rank-go" type="button">show</button>'
            '<button id="rank-prev" type="button" title="previous rank">◀</button>'
            '<button id="rank-next" type="button" title="next rank">▶</button></div>'
            '<div id="rank-set"></div><div id="rank-view" class="dim">click a rank (a culprit, '
            "a rank set on the tree, a row of the rank table) or type its number</div></aside>"
        ),
        "</main>",
    ]
    return "\n".join(head + [b for b in body if b]) + "\n"


def _culprit_line(diagnosis: Diagnosis) -> str:
    """``culprit: rank 3`` (the ranks a link that lists them); ``no culprit named``."""
    word, ranks = culprit_parts(diagnosis.culprit_ranks)
    if ranks:
        return f'<span class="who">{word}: <span class="culprits" id="culprits">{_esc(ranks)}</span></span>'
    if diagnosis.verdict is Verdict.NOT_HUNG:
        return ""
    return '<span class="who dim">no culprit named</span>'


def _job_line(diagnosis: Diagnosis, snapshot: JobSnapshot) -> str:
    found = count_text(len(snapshot.ranks))
    size = f" of {count_text(snapshot.world_size)}" if snapshot.world_size is not None else ""
    parts = [f"job {_esc(snapshot.spec)}", f"{found}{size} rank processes found"]
    scope = diagnosis.scope
    if said := scope_text(scope.seen, scope.not_seen, scope.absent, scope.world_size):
        parts.append(_esc(said))
    if snapshot.captured_at:
        parts.append(f"captured {_esc(snapshot.captured_at)}")
    return " · ".join(parts)


_PICTURE_NODES = 2_000  # tree nodes past which the page leaves the picture to --svg


def _picture(diagnosis: Diagnosis) -> str:
    """The STAT-style picture of ``--svg``, inline (the page fetches nothing)."""
    if diagnosis.tree is None:
        return ""
    if len(diagnosis.tree) > _PICTURE_NODES:
        inner = (
            f'<p class="dim">{count_text(len(diagnosis.tree))} frames: too many for a picture on this '
            "page; <code>--svg FILE</code> writes it</p>"
        )
    else:
        inner = f'<div class="picture">{svg_element(diagnosis)}</div>'
    return f'<section id="picture-section"><h2>Picture of the merged stacks</h2>{inner}</section>'


# ------------------------------------------------------------------ the rank table

_RANKS_LABEL = 40  # characters of a class's rank ranges before they are cut
_STATE_CLASS = {state: f"st-{state.value}" for state in RankState}


def rank_table(ranks: Sequence[RankAnalysis], culprits: frozenset[int], verdict: Verdict) -> str:
    """The terminal's rank table as HTML: a row per rank (rank, host, pid, state, op, call
    site, detail where any says more than its op), culprits marked; past ``RANK_ROWS``
    ranks, a row per class of ranks in one state, op and call site, culprits first, then
    the largest. The rows and their words are the terminal's (``rows.rank_rows``,
    ``rows.rank_classes``): in a job that is not hung no rank is ``blocked``."""
    if not ranks:
        return ""
    if len(ranks) > RANK_ROWS:
        return _class_rows(rank_classes(ranks, culprits, verdict))
    rows = rank_rows(ranks, culprits, verdict)
    with_detail = any(row.detail for row in rows)
    names = ["rank", "host", "pid", "state", "op", "call site"] + (["detail"] if with_detail else [])
    out = []
    for row in rows:
        mark = ' <span class="tag culprit">culprit</span>' if row.culprit else ""
        cells = [
            f'<td class="mono">{"?" if row.rank is None else row.rank}{mark}</td>',
            f"<td>{_esc(row.host)}</td>",
            f'<td class="mono">{"" if row.pid is None else row.pid}</td>',
            _state_cell(row),
            f'<td class="mono">{_esc(row.op)}</td>',
            f'<td class="mono site">{_esc(row.site)}</td>',
        ]
        if with_detail:
            cells.append(f'<td class="dim">{_esc(row.detail)}</td>')
        out.append(f"<tr{_row_attrs(row.culprit, row.rank)}>{''.join(cells)}</tr>")
    return _table_section(names, out, f"{count_text(len(ranks))} ranks")


def _row_attrs(culprit: bool, rank: int | None) -> str:
    """A row's class and the rank the panel shows when it is clicked."""
    return (' class="culprit"' if culprit else "") + (f' data-rank="{rank}"' if rank is not None else "")


def _state_cell(row: RankRow | RankClass) -> str:
    """A rank's state in the terminal's words, coloured by the state where the words are
    the state's own."""
    own = row.state_word == row.state.value
    return f'<td class="{_STATE_CLASS[row.state] if own else "st-healthy"}">{_esc(row.state_word)}</td>'


def _class_rows(classes: Sequence[RankClass]) -> str:
    rows = []
    for rc in classes[:CLASS_ROWS]:
        mark = ' <span class="tag culprit">culprit</span>' if rc.culprit else ""
        first = rc.numbers[0] if rc.numbers else None
        rows.append(
            f'<tr{_row_attrs(rc.culprit, first)}><td class="mono">{_esc(rc.label(_RANKS_LABEL))}{mark}</td>'
            f'<td class="num">{count_text(len(rc.members))}</td><td>{_esc(rc.hosts)}</td>'
            f'{_state_cell(rc)}<td class="mono">{_esc(rc.op)}</td>'
            f'<td class="mono site">{_esc(rc.site)}</td><td class="dim">{_esc(rc.detail)}</td></tr>'
        )
    if len(classes) > CLASS_ROWS:
        rest = sum(len(rc.members) for rc in classes[CLASS_ROWS:])
        rows.append(
            f'<tr class="dim"><td>… {count_text(len(classes) - CLASS_ROWS)} more classes</td>'
            f'<td class="num">{count_text(rest)}</td><td colspan="5">the rank panel shows any rank</td></tr>'
        )
    names = ["ranks", "count", "hosts", "state", "op", "call site", "detail"]
    ranks = sum(len(rc.members) for rc in classes)
    return _table_section(names, rows, f"{count_text(ranks)} ranks in {count_text(len(classes))} classes")


def _table_section(names: Sequence[str], rows: Sequence[str], caption: str) -> str:
    head = "".join(f"<th>{name}</th>" for name in names)
    return (
        f'<section id="ranks-section"><h2>Ranks</h2><div class="scroll"><table class="ranks" id="ranks">'
        f'<caption class="dim">{caption}</caption><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div></section>"
    )


def _chain(root: RootCause | None) -> str:
    """The links from the ranks to the process that holds the wait, the end marked."""
    if root is None:
        return ""
    rows = []
    for i, link in enumerate(root.chain):
        end = i == len(root.chain) - 1
        said = waits_words(link)
        back = " ↺ back into the chain: a deadlock across processes" if end and root.cycle else ""
        rows.append(
            f'<li class="{"root" if end else "link"}"><span class="who">{_esc(who(link))}</span>'
            + (' <b class="culprits">root cause</b>' if end else "")
            + (f'<div class="dim">{_esc(said + back)}</div>' if said else "")
            + "</li>"
        )
    return f'<section id="wait-chain"><h2>Wait chain</h2><ol>{"".join(rows)}</ol></section>'


def _list(ident: str, title: str, items: Sequence[str], tag: str) -> str:
    if not items:
        return ""
    rows = "".join(f"<li>{_esc(item)}</li>" for item in items)
    return f'<section id="{ident}"><h2>{title}</h2><{tag}>{rows}</{tag}></section>'


# ------------------------------------------------------------------ the embedded data


class _Table:
    """Distinct values numbered in first-seen order; ``key`` says what makes two the same."""

    def __init__(self, encode: Callable[[Any], Any] = lambda v: v) -> None:
        self.items: list[Any] = []
        self._index: dict[Hashable, int] = {}
        self._encode = encode

    def add(self, key: Hashable, value: Any = None) -> int:
        idx = self._index.get(key)
        if idx is None:
            idx = self._index[key] = len(self.items)
            self.items.append(self._encode(key if value is None else value))
        return idx


_text = functools.lru_cache(maxsize=1 << 16)(printable)  # thread names, hosts: few, repeated


def _frame(frame: Frame) -> list[Any]:
    """``[function, location, file, line, origin, native, code]``."""
    return [
        printable(frame.function),
        printable(frame.location),
        printable(frame.filename),
        frame.line,
        frame.origin.kind.value,
        int(frame.native),
        printable(frame.code.strip()) if frame.code else None,
    ]


def _runs(values: Iterable[int]) -> list[int]:
    """Run-length encoding, flat: ``[value, count, value, count, ...]``."""
    out: list[int] = []
    for v in values:
        if out and out[-2] == v:
            out[-1] += 1
        else:
            out += [v, 1]
    return out


def report_data(diagnosis: Diagnosis, snapshot: JobSnapshot) -> dict[str, Any]:
    """The object the page's script reads (layout ``DATA_VERSION``; see the module doc).

    Keys: ``frames`` (``[function, location, file, line, origin, native, code]``),
    ``stacks`` (frame numbers, outermost first), ``rsets`` (range strings), ``tree``
    (columns over node ids: ``frame``, ``parent``, ``ranks``; lists ``outliers`` and
    ``culprit``: nodes all of whose ranks are culprits), ``classes`` (``[ranks, op, leaf
    node]``), ``ranks`` (``ids``: a range string; ``pid``; run-length ``host``, ``info``,
    ``view`` columns), ``hosts``, ``info`` (``[state, op, thread, detail, working]``),
    ``samples`` (``[[thread, stack, flags], ...]`` or ``{"error": text}``), ``views``
    (sample numbers per sample), ``culprits`` (a rank set, -1 for none), ``verdict``.
    """
    stacks = StackTable()  # frames and stacks numbered for the page, as in a bundle
    rsets = _Table(lambda ranks: ranges_text(ranks))
    culprits = frozenset(diagnosis.culprit_ranks)
    tree = _tree(diagnosis.tree, stacks, rsets, culprits) if diagnosis.tree is not None else None
    tables = _RankTables()
    ranks = _ranks(diagnosis.ranks, snapshot, stacks, tables, diagnosis.verdict)
    return {
        "version": DATA_VERSION,
        "verdict": diagnosis.verdict.value,
        "culprits": rsets.add(tuple(sorted(culprits))) if culprits else -1,
        "tree": tree,
        "classes": _classes(diagnosis, rsets),
        "ranks": ranks,
        "hosts": tables.hosts.items,
        "info": tables.info.items,
        "samples": tables.samples.items,
        "views": tables.views.items,
        "frames": [_frame(f) for f in stacks.frames],
        "stacks": [[stacks.frame_id(f) for f in s] for s in stacks.stacks],
        "rsets": rsets.items,
    }


def _tree(tree: CallTree, stacks: StackTable, rsets: _Table, culprits: frozenset[int]) -> dict[str, Any]:
    parent = [-1] * len(tree.nodes)
    for node in tree.nodes:
        for kid in node.children:
            parent[kid] = node.node_id
    return {
        "frame": [-1 if n.frame is None else stacks.frame_id(n.frame) for n in tree.nodes],
        "parent": parent,
        "ranks": [rsets.add(n.ranks) for n in tree.nodes],
        "outliers": sorted(tree.outliers),
        "culprit": [
            n.node_id
            for n in tree.nodes
            if n.node_id != ROOT and n.ranks and len(n.ranks) <= len(culprits) and culprits.issuperset(n.ranks)
        ],
        "divergence": list(tree.divergence),
    }


def _classes(diagnosis: Diagnosis, rsets: _Table) -> list[list[Any]]:
    """``[ranks, op, leaf node]`` per equivalence class (``Diagnosis.groups``); the leaf is
    where the class's stack ends in the tree, -1 when it is not there."""
    tree = diagnosis.tree
    child: dict[tuple[int, Frame], int] = {}
    if tree is not None:
        for node in tree.nodes:
            for kid in node.children:
                frame = tree.nodes[kid].frame
                if frame is not None:
                    child[(node.node_id, frame)] = kid
    out = []
    for group in diagnosis.groups:
        leaf = ROOT if tree is not None else -1
        for frame in group.stack:
            leaf = child.get((leaf, frame), -1)
            if leaf < 0:
                break
        op = printable(group.op.describe()) if group.op else ""
        out.append([rsets.add(tuple(sorted(set(group.ranks)))), op, leaf if leaf != ROOT else -1])
    return out


class _RankTables:
    def __init__(self) -> None:
        self.hosts = _Table(_text)
        self.info = _Table()
        self.samples = _Table(
            lambda key: key if isinstance(key, dict) else [[_text(name), stack, flags] for name, stack, flags in key]
        )
        self.quick: dict[tuple[Any, ...], int] = {}
        self.views = _Table()


def _ranks(
    analyses: Sequence[RankAnalysis], snapshot: JobSnapshot, stacks: StackTable, tables: _RankTables, verdict: Verdict
) -> dict[str, Any]:
    """The per-rank columns, in rank order (one entry per rank number); states in the
    terminal's words (``rows.state_word``: a job that is not hung has no rank ``blocked``)."""
    state_words = {state: state_word(state, verdict) for state in RankState}
    by_rank: dict[int, RankAnalysis] = {}
    for ra in analyses:
        if ra.rank is not None:
            by_rank.setdefault(ra.rank, ra)
    snaps: dict[int, RankSnapshot] = {}
    for rs in snapshot.ranks:
        if rs.rank is not None:
            snaps.setdefault(rs.rank, rs)
    order = sorted(by_rank)
    described: dict[int, str] = {}  # DistOp.describe() by the op's identity: ranks share ops
    info_of = []
    for rank in order:
        ra = by_rank[rank]
        op = ""
        if ra.op is not None:
            op = described.get(id(ra.op)) or described.setdefault(id(ra.op), printable(ra.op.describe()))
        key = (state_words[ra.state], op, printable(ra.thread or ""), printable(ra.detail), int(ra.working))
        info_of.append(tables.info.add(key, list(key)))
    views = [_view(snaps.get(rank), stacks, tables) for rank in order]
    return {
        "ids": ranges_text(order),
        "pid": [by_rank[rank].pid for rank in order],
        "host": _runs(tables.hosts.add(by_rank[rank].host) for rank in order),
        "info": _runs(info_of),
        "view": _runs(views),
    }


def _view(rank: RankSnapshot | None, stacks: StackTable, tables: _RankTables) -> int:
    """The number of the rank's series of samples, -1 when it has none."""
    if rank is None or not rank.samples:
        return -1
    return tables.views.add(tuple(_sample(s, stacks, tables) for s in rank.samples), None)


def _sample(sample: Sample, stacks: StackTable, tables: _RankTables) -> int:
    if sample.error is not None or not sample.threads:
        text = printable(sample.error.message if sample.error else "no threads")
        return tables.samples.add(("error", text), {"error": text})
    # first by the stacks' identity (the snapshot holds them: ids stay valid), which is
    # cheap for the millions of threads of a large job; then by value, once per new key
    quick = tuple((th.name, id(th.frames), th.active, th.owns_gil) for th in sample.threads)
    idx = tables.quick.get(quick)
    if idx is None:
        key = tuple(
            (th.name or "", stacks.stack_id(th.frames), int(th.active) | 2 * int(th.owns_gil)) for th in sample.threads
        )
        idx = tables.quick[quick] = tables.samples.add(key)
    return idx
