"""The merged tree as a picture: ``--dot FILE`` (Graphviz source) and ``--svg FILE``.

``tree_graph`` turns ``Diagnosis.tree`` (as the analysis built it) into a ``TreeGraph``
the way LLNL STAT draws its trees: one node per frame, one edge per call,
each edge labelled with the number of ranks that made it and their ranges, nodes on
outlier branches filled orange and nodes whose ranks are all culprits red. Both outputs
are written from that one graph:

- ``render_dot``: DOT text for Graphviz (``dot -Tpdf``), xdot, networkx's
  ``nx_pydot.read_dot`` (the tests read it back so) or any DOT reader. It is written here,
  not through networkx's pydot/pygraphviz writers: networkx stays in ``analysis/`` (the
  import rules), and the output is the same whether pydot is installed or not.
- ``render_svg``: an SVG drawn here, without Graphviz. The graph is a tree, so a layered
  layout is exact and short to write: leaves side by side, each parent centred over its
  children, one row per depth. That keeps ``--svg`` working on a cluster's login node
  where ``dot`` is not installed, and the picture the same on every machine. In the SVG
  an edge is labelled where its rank set changes (below the root and at divergence
  points): inside an unbranched stretch every edge would repeat the same label. Runs of
  library frames from one package are folded into one box, by the terminal report's rule
  and in its words (``frames.fold``), so that the picture shows the job's own calls;
  the DOT keeps every frame, for the tools that read it. ``svg_element`` is the same
  picture without its title, for the ``--html`` page to embed; its legend names only the
  marks the picture uses.

Strings from the job pass through ``errors.printable`` and are escaped for DOT or XML.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import escape

from ..errors import printable
from ..model import ROOT, CallTree, Diagnosis, Frame, TreeNode, Verdict
from ..rankranges import ranges_text, short_ranges
from ..waitwords import counted
from .frames import fold
from .rows import culprit_words

OUTLIER_FILL, OUTLIER_LINE = "#fff3d6", "#f79009"
CULPRIT_FILL, CULPRIT_LINE = "#ffe4e1", "#d92d20"
PLAIN_FILL, PLAIN_LINE = "#ffffff", "#667085"
_LABEL_RANGES = 40  # characters of rank ranges on an edge label


@dataclass(frozen=True, slots=True)
class TreeGraph:
    """The merged tree as a picture's graph: ``nodes`` (name -> attributes) and ``edges``
    (parent, child, attributes), both in the tree's node order, parents first."""

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    edges: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    def kids(self) -> dict[str, list[str]]:
        """Each node's children, in order."""
        out: dict[str, list[str]] = {name: [] for name in self.nodes}
        for parent, kid, _ in self.edges:
            out[parent].append(kid)
        return out

    def __len__(self) -> int:
        return len(self.nodes)


def tree_graph(diagnosis: Diagnosis, *, fold: bool = False) -> TreeGraph:
    """The merged tree as a ``TreeGraph``: node ``n<id>`` per tree node, with ``label``
    (function and location; the root: the job's rank count), ``kind`` (root, frame,
    outlier, culprit), ``ranks`` (a range string), ``count``, ``depth``, ``tooltip``,
    ``native`` and ``folded`` (the frames a box stands for); an edge per call with
    ``label`` (rank count and ranges), ``count`` and ``changes`` (its rank set differs
    from the parent's). With ``fold``, a run of library frames of one package in an
    unbranched stretch is one node (named after its first tree node), as in the terminal."""
    graph = TreeGraph()
    tree = diagnosis.tree
    if tree is None:
        return graph
    culprits = frozenset(diagnosis.culprit_ranks)
    boxes = _folded_runs(tree) if fold else [([node], "") for node in tree.nodes]
    box_of = {box[-1].node_id: box for box, _ in boxes}  # the box a child hangs below
    depth: dict[int, int] = {}
    parent_of = {kid: node for node in tree.nodes for kid in node.children}
    for box, words in boxes:
        head = box[0]
        count, ranks = len(head.ranks), ranges_text(head.ranks)
        above = parent_of.get(head.node_id)
        depth[head.node_id] = 0 if above is None else depth[box_of[above.node_id][0].node_id] + 1
        if head.node_id == ROOT:
            kind = "root"
        elif count and count <= len(culprits) and culprits.issuperset(head.ranks):
            kind = "culprit"
        else:
            kind = "outlier" if head.node_id in tree.outliers else "frame"
        frames = [n.frame for n in box if n.frame is not None]
        graph.nodes[_name(head.node_id)] = {
            "label": _label(head.frame, count) if len(box) == 1 else _folded_label(words, len(frames)),
            "kind": kind,
            "ranks": ranks,
            "count": count,
            "depth": depth[head.node_id],
            "tooltip": _tooltip(frames, count, ranks),
            "native": bool(frames) and all(f.native for f in frames),
            "folded": len(frames) if len(box) > 1 else 0,
        }
    for box, _ in boxes:
        last = box[-1]
        for kid in last.children:
            kid_ranks = tree.nodes[kid].ranks
            graph.edges.append(
                (
                    _name(box[0].node_id),
                    _name(kid),
                    {
                        "count": len(kid_ranks),
                        "label": f"{counted(len(kid_ranks), 'rank')}\n[{short_ranges(kid_ranks, _LABEL_RANGES)}]",
                        "changes": kid_ranks != last.ranks or last.node_id == ROOT,
                    },
                )
            )
    return graph


def _folded_runs(tree: CallTree) -> list[tuple[list[TreeNode], str]]:
    """The tree's nodes in runs, parents' runs first, each with the terminal's line for it:
    each unbranched stretch of one rank set cut where the terminal's ``fold`` cuts it (the
    stretch whole, as the terminal folds it: a run's words may name it by its caller's
    call), the root alone."""
    runs: list[tuple[list[TreeNode], str]] = []
    todo = [tree.nodes[ROOT]]
    while todo:
        start = todo.pop()
        stretch = [start]
        below = tree.children(start.node_id)
        while start.node_id != ROOT and len(below) == 1 and below[0].ranks == start.ranks:
            stretch.append(below[0])
            below = tree.children(below[0].node_id)
        if start.node_id == ROOT:
            runs.append((stretch, ""))
        else:
            i = 0
            for row in fold([node.frame for node in stretch if node.frame is not None]):
                runs.append((stretch[i : i + row.frames], row.words))
                i += row.frames
        todo += reversed(below)
    return sorted(runs, key=lambda run: run[0][0].node_id)


def _name(node_id: int) -> str:
    return f"n{node_id}"


def _label(frame: Frame | None, count: int) -> str:
    if frame is None:
        return counted(count, "rank")
    return f"{printable(frame.function)}\n{printable(frame.location)}"


def _folded_label(words: str, count: int) -> str:
    """A folded run's box: the terminal's line for it (wrapped), and how many frames it
    holds."""
    lines = textwrap.wrap(words, _BOX_CHARS, max_lines=3, placeholder=" …")
    return "\n".join([*lines, f"{count} frames folded"])


def _tooltip(frames: list[Frame], count: int, ranks: str) -> str:
    where = (
        "\n".join(printable(f.filename) + (f":{f.line}" if f.line else "") for f in frames) if frames else "all ranks"
    )
    return f"{where}\n{counted(count, 'rank')} [{ranks}]"


def _title(diagnosis: Diagnosis) -> str:
    who = culprit_words(diagnosis.culprit_ranks)
    if not who and diagnosis.verdict is not Verdict.NOT_HUNG:
        who = "no culprit"
    return (
        f"hangdoc: {diagnosis.verdict.value}"
        + (f" · {who}" if who else "")
        + (f" · confidence {diagnosis.confidence.value}")
    )


# ------------------------------------------------------------------------- DOT

_DOT_STYLE = {
    "root": {"shape": "ellipse", "fillcolor": "#eef1f5", "color": PLAIN_LINE},
    "frame": {"fillcolor": PLAIN_FILL, "color": PLAIN_LINE},
    "outlier": {"fillcolor": OUTLIER_FILL, "color": OUTLIER_LINE, "penwidth": "2"},
    "culprit": {"fillcolor": CULPRIT_FILL, "color": CULPRIT_LINE, "penwidth": "2"},
}


def _dot_string(text: str) -> str:
    """A DOT quoted string whose label shows ``text`` (newlines as line breaks)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _dot_attrs(attrs: dict[str, Any]) -> str:
    return ", ".join(f"{key}={_dot_string(str(value))}" for key, value in attrs.items())


def render_dot(diagnosis: Diagnosis) -> str:
    """The merged tree as Graphviz DOT text (``digraph hangdoc``)."""
    graph = tree_graph(diagnosis)
    lines = [
        "digraph hangdoc {",
        "  graph ["
        + _dot_attrs({"label": _title(diagnosis), "labelloc": "t", "rankdir": "TB", "fontname": "Helvetica"})
        + "];",
        '  node [shape="box", style="rounded,filled", fontname="Courier", fontsize="10"];',
        '  edge [fontname="Helvetica", fontsize="9", color="#667085"];',
    ]
    for name, data in graph.nodes.items():
        attrs = {
            "label": data["label"],
            "tooltip": data["tooltip"],
            "ranks": data["ranks"],
            "kind": data["kind"],
            **_DOT_STYLE[data["kind"]],
        }
        if data["native"]:
            attrs["style"] = "rounded,filled,dashed"
        lines.append(f"  {name} [{_dot_attrs(attrs)}];")
    for parent, kid, data in graph.edges:
        attrs = {"label": data["label"]}
        kind = graph.nodes[kid]["kind"]
        if kind in ("outlier", "culprit"):
            attrs["color"] = _DOT_STYLE[kind]["color"]
            attrs["penwidth"] = "2"
        lines.append(f"  {parent} -> {kid} [{_dot_attrs(attrs)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------- SVG

_CHAR_W = 6.6  # width of one character of 11 px monospace (0.6 em)
_LINE_H = 14
_PAD_X, _PAD_Y = 8, 5
_GAP_X = 18  # between sibling subtrees
_GAP_LABELLED, _GAP_PLAIN = 40, 14  # between rows, with and without edge labels
_MARGIN = 20
_BOX_CHARS = 64
_SVG_CLASS = "hangdoc-tree"  # the picture's styles apply below it only, also inside a page
_SVG_FILL = {
    "root": ("#eef1f5", PLAIN_LINE),
    "frame": (PLAIN_FILL, PLAIN_LINE),
    "outlier": (OUTLIER_FILL, OUTLIER_LINE),
    "culprit": (CULPRIT_FILL, CULPRIT_LINE),
}


def _svg_label(label: str) -> list[str]:
    """The lines of a node's box, each cut to ``_BOX_CHARS`` (the tooltip has it all)."""
    return [line if len(line) <= _BOX_CHARS else line[: _BOX_CHARS - 1] + "…" for line in label.split("\n")]


def _box(label: str) -> tuple[float, float]:
    lines = _svg_label(label)
    return (max(len(line) for line in lines) * _CHAR_W + 2 * _PAD_X, len(lines) * _LINE_H + 2 * _PAD_Y)


def _layout(graph: TreeGraph, root: str, top_y: float) -> dict[str, tuple[float, float, float, float]]:
    """``node -> (x centre, y top, width, height)``: a layered tree layout, its first row
    at ``top_y``."""
    size = {n: _box(d["label"]) for n, d in graph.nodes.items()}
    children = graph.kids()
    span: dict[str, float] = {}
    for n in reversed(graph.nodes):  # children before parents: the width each subtree needs
        kids = children[n]
        below = sum(span[k] for k in kids) + _GAP_X * (len(kids) - 1) if kids else 0.0
        span[n] = max(size[n][0], below)
    depth = {n: d["depth"] for n, d in graph.nodes.items()}
    rows = max(depth.values()) + 1
    row_h = [0.0] * rows
    labelled = [False] * rows
    for n, d in depth.items():
        row_h[d] = max(row_h[d], size[n][1])
    for _, kid, data in graph.edges:
        labelled[depth[kid]] = labelled[depth[kid]] or data["changes"]
    top = [0.0] * rows
    y = top_y
    for d in range(rows):
        if d:
            y += _GAP_LABELLED if labelled[d] else _GAP_PLAIN
        top[d] = y
        y += row_h[d]
    place: dict[str, tuple[float, float, float, float]] = {}
    todo = [(root, float(_MARGIN))]
    while todo:
        n, left = todo.pop()
        place[n] = (left + span[n] / 2, top[depth[n]], size[n][0], size[n][1])
        kids = children[n]
        below = sum(span[k] for k in kids) + _GAP_X * (len(kids) - 1) if kids else 0.0
        x = left + (span[n] - below) / 2
        for k in kids:
            todo.append((k, x))
            x += span[k] + _GAP_X
    return place


def render_svg(diagnosis: Diagnosis) -> str:
    """The merged tree as an SVG document (drawn here; Graphviz is not needed), library
    frames folded, with a title line that says the verdict."""
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + _svg(diagnosis, titled=True)


def svg_element(diagnosis: Diagnosis) -> str:
    """The picture of ``render_svg`` as one ``<svg>`` element for an HTML page to hold
    inline: no XML declaration, no namespace (the HTML parser knows ``<svg>``) and no
    title line (the page's header says the verdict)."""
    return _svg(diagnosis, titled=False)


def _svg(diagnosis: Diagnosis, *, titled: bool) -> str:
    graph = tree_graph(diagnosis, fold=True)
    parts: list[str] = []
    y = float(_MARGIN)
    if titled:
        parts.append(_text(_MARGIN, y + 16, printable(_title(diagnosis)), "title"))
        y += 24
    if not len(graph):
        parts.append(_text(_MARGIN, y + 20, "no stacks were merged", "sub"))
        return _svg_document(520, y + 40, parts, titled)
    legend = _legend(graph, y + 14)
    if legend:
        parts.append(legend)
        y += 24
    place = _layout(graph, _name(ROOT), y + 8)
    width = max(x + w / 2 for x, _, w, _ in place.values()) + _MARGIN
    height = max(yy + h for _, yy, _, h in place.values()) + _MARGIN
    for parent, kid, data in graph.edges:
        px, py, _, ph = place[parent]
        kx, ky, _, _ = place[kid]
        kind = graph.nodes[kid]["kind"]
        stroke = _SVG_FILL[kind][1] if kind in ("outlier", "culprit") else "#98a2b3"
        mid = (py + ph + ky) / 2
        parts.append(
            f'<path class="edge" d="M{px:.1f},{py + ph:.1f} C{px:.1f},{mid:.1f} '
            f'{kx:.1f},{mid:.1f} {kx:.1f},{ky:.1f}" stroke="{stroke}"/>'
        )
        if data["changes"]:  # beside the child, on the side away from the parent
            first, second = data["label"].split("\n", 1)
            lx, anchor = (kx - 6, "end") if kx < px - 1 else (kx + 6, "start")
            parts.append(
                f'<text class="elabel" x="{lx:.1f}" y="{ky - 22:.1f}" text-anchor="{anchor}">'
                f'<tspan>{escape(first)}</tspan><tspan x="{lx:.1f}" dy="11">'
                f"{escape(second)}</tspan></text>"
            )
    for name, data in graph.nodes.items():
        x, top, w, h = place[name]
        fill, line = _SVG_FILL[data["kind"]]
        dashed = ' stroke-dasharray="4 2"' if data["native"] else ""
        thick = "2" if data["kind"] in ("outlier", "culprit") else "1"
        folded = " folded" if data["folded"] else ""
        parts.append(
            f'<g class="node {data["kind"]}{folded}" id="{name}"><title>{escape(data["tooltip"])}</title>'
            f'<rect x="{x - w / 2:.1f}" y="{top:.1f}" width="{w:.1f}" height="{h:.1f}" rx="5" '
            f'fill="{fill}" stroke="{line}" stroke-width="{thick}"{dashed}/>'
        )
        for i, text in enumerate(_svg_label(data["label"])):
            cls = "lib" if data["folded"] else "fn" if i == 0 else "loc"
            parts.append(
                f'<text class="{cls}" x="{x:.1f}" y="{top + _PAD_Y + 11 + i * _LINE_H:.1f}" '
                f'text-anchor="middle">{escape(text)}</text>'
            )
        parts.append("</g>")
    return _svg_document(width, height, parts, titled)


def legend_marks(graph: TreeGraph) -> list[str]:
    """The marks the picture uses, in the legend's order: ``outlier``, ``culprit``,
    ``native``."""
    kinds = {data["kind"] for data in graph.nodes.values()}
    native = any(data["native"] for data in graph.nodes.values())
    return [mark for mark, used in (("outlier", "outlier" in kinds), ("culprit", "culprit" in kinds),
                                    ("native", native)) if used]  # fmt: skip


_LEGEND = {
    "outlier": ("outlier branch", OUTLIER_FILL, OUTLIER_LINE, ""),
    "culprit": ("culprits only", CULPRIT_FILL, CULPRIT_LINE, ""),
    "native": ("native frames", PLAIN_FILL, PLAIN_LINE, ' stroke-dasharray="4 2"'),
}


def _legend(graph: TreeGraph, y: float) -> str:
    """One entry per mark the picture uses; ``""`` when it uses none."""
    out, x = [], float(_MARGIN)
    for mark in legend_marks(graph):
        label, fill, line, dash = _LEGEND[mark]
        width = "1" if dash else "2"
        out.append(
            f'<g class="legend {mark}"><rect x="{x:.1f}" y="{y - 10:.1f}" width="14" height="12" rx="3" '
            f'fill="{fill}" stroke="{line}" stroke-width="{width}"{dash}/>{_text(x + 20, y, label, "sub")}</g>'
        )
        x += 40 + len(label) * 7
    return "".join(out)


def _text(x: float, y: float, text: str, cls: str) -> str:
    return f'<text class="{cls}" x="{x:.1f}" y="{y:.1f}">{escape(text)}</text>'


def _svg_document(width: float, height: float, parts: list[str], standalone: bool) -> str:
    rules = {
        ".title": "font:600 15px Helvetica,Arial,sans-serif;fill:#1d2330",
        ".sub": "font:12px Helvetica,Arial,sans-serif;fill:#475467",
        ".fn": "font:600 11px monospace;fill:#1d2330",
        ".loc": "font:11px monospace;fill:#475467",
        ".lib": "font:11px monospace;fill:#475467",
        ".elabel": "font:10px Helvetica,Arial,sans-serif;fill:#344054;paint-order:stroke;stroke:#fff;stroke-width:3px",
        ".edge": "fill:none;stroke-width:1.4",
    }
    style = "".join(f".{_SVG_CLASS} {sel}{{{rule}}}" for sel, rule in rules.items())
    head = (
        "<svg" + (' xmlns="http://www.w3.org/2000/svg"' if standalone else "") + f' class="{_SVG_CLASS}" '
        f'width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'font-family="monospace">\n<title>hangdoc merged stack tree</title>\n'
        f'<style>{style}</style>\n<rect width="100%" height="100%" fill="#fff"/>\n'
    )
    return head + "\n".join(parts) + "\n</svg>\n"
