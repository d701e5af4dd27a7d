"""--dot and --svg: the merged tree read back from the DOT by networkx (pydot), and an SVG
that is well-formed XML showing the verdict's frames, library frames folded as in the
terminal, with a legend of the marks it uses only."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import networkx as nx
import pytest
from support.factories import make_diagnosis, make_op, make_snapshot
from support.paths import REPO

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot
from hangdoc.cli import main
from hangdoc.model import Frame, Verdict
from hangdoc.report.frames import fold
from hangdoc.report.graph import render_dot, render_svg, svg_element, tree_graph

pytest.importorskip("pydot", reason="the DOT is read back with networkx's pydot reader (pip install pydot)")
# pydot's parser calls pyparsing's old names, which pyparsing 3.3 warns about
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

sys.path.insert(0, str(REPO / "bench"))
from synthetic import synthetic_snapshot

CORPUS = REPO / "tests" / "snapshots" / "mismatch_ddp_uneven_epoch_end.json.gz"
TRUNK = ["train.py:<module>:60", "train.py:main:55"]
AR = [*TRUNK, "train.py:step:30", "torch/distributed/distributed_c10d.py:all_reduce:2800"]
BAR = [*TRUNK, "train.py:evaluate:48", "torch/distributed/distributed_c10d.py:barrier:4100"]
SVG = "{http://www.w3.org/2000/svg}"


def _mismatch():
    snap = make_snapshot({0: AR, 1: AR, 2: BAR, 3: AR, 5: AR}, world_size=6)
    return make_diagnosis(
        snap,
        verdict=Verdict.COLLECTIVE_MISMATCH,
        culprits=[2],
        ops={r: make_op("barrier" if r == 2 else "all_reduce") for r in (0, 1, 2, 3, 5)},
    )


def _read_dot(text: str, tmp_path: Path) -> nx.MultiDiGraph:
    path = tmp_path / "tree.dot"
    path.write_text(text)
    return nx.nx_pydot.read_dot(path)


def _unquote(value: str) -> str:
    """A DOT string attribute as pydot hands it over (quoted, escapes kept), as shown."""
    if value.startswith('"') and value.endswith('"'):
        value = value[1:-1]
    return value.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


def _expand(text: str) -> list[int]:
    out: list[int] = []
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out


def test_the_dot_reads_back_as_the_tree(tmp_path: Path) -> None:
    diag = _mismatch()
    graph = _read_dot(render_dot(diag), tmp_path)
    tree = diag.tree
    assert graph.number_of_nodes() == len(tree)
    assert graph.number_of_edges() == len(tree) - 1
    assert {(f"n{n.node_id}", f"n{k}") for n in tree.nodes for k in n.children} == {
        (a, b) for a, b, _ in graph.edges(keys=True)
    }
    for node in tree.nodes:
        attrs = graph.nodes[f"n{node.node_id}"]
        label = _unquote(attrs["label"])
        if node.frame is not None:
            assert label == f"{node.frame.function}\n{node.frame.location}"
        assert _expand(_unquote(attrs["ranks"])) == list(node.ranks)
    # the outlier (and culprit) branch is coloured, the majority's is not
    kinds = {_unquote(graph.nodes[n]["label"]).split("\n")[0]: _unquote(graph.nodes[n]["kind"]) for n in graph.nodes}
    assert kinds["barrier"] == kinds["evaluate"] == "culprit"
    assert kinds["all_reduce"] == "frame" and kinds["<module>"] == "frame"
    culprit = next(n for n in graph.nodes if _unquote(graph.nodes[n]["label"]).startswith("barrier"))
    assert _unquote(graph.nodes[culprit]["fillcolor"]) == "#ffe4e1"
    labels = {_unquote(d["label"]) for _, _, d in graph.edges(data=True)}
    assert "4 ranks\n[0-1,3,5]" in labels and "1 rank\n[2]" in labels and "5 ranks\n[0-3,5]" in labels


def test_outliers_without_culprits_are_orange(tmp_path: Path) -> None:
    snap = make_snapshot({0: AR, 1: AR, 2: BAR})
    diag = make_diagnosis(snap, verdict=Verdict.UNKNOWN)
    graph = _read_dot(render_dot(diag), tmp_path)
    kinds = {_unquote(graph.nodes[n]["label"]).split("\n")[0]: _unquote(graph.nodes[n]["kind"]) for n in graph.nodes}
    assert kinds["evaluate"] == kinds["barrier"] == "outlier"
    assert kinds["step"] == "frame"


def test_names_that_need_quoting_read_back_exactly(tmp_path: Path) -> None:
    odd = 'say "hi" \\ {x} -> [y]; <z>'
    stack = [Frame("<module>", "/job/train.py", 1), Frame(odd, "/job/a b.py", 2)]
    diag = make_diagnosis(make_snapshot({0: stack, 1: stack}), verdict=Verdict.NCCL_TIMEOUT)
    graph = _read_dot(render_dot(diag), tmp_path)
    labels = {_unquote(graph.nodes[n]["label"]) for n in graph.nodes}
    assert f"{odd}\na b.py:2" in labels


def test_the_svg_is_xml_with_the_verdicts_frames() -> None:
    diag = _mismatch()
    root = ET.fromstring(render_svg(diag))
    assert root.tag == f"{SVG}svg"
    texts = [part for t in root.iter(f"{SVG}text") for part in t.itertext()]
    assert any("collective_mismatch" in t and "culprit: rank 2" in t for t in texts)
    for name in ("barrier", "evaluate", "all_reduce", "<module>"):
        assert name in texts
    nodes = [g for g in root.iter(f"{SVG}g") if "node" in (g.get("class") or "")]
    assert len(nodes) == len(diag.tree)
    culprits = [g for g in nodes if "culprit" in (g.get("class") or "")]
    assert {g.find(f"{SVG}text").text for g in culprits} == {"evaluate", "barrier"}  # type: ignore[union-attr]
    # rank sets label the edges where they change
    assert "[0-1,3,5]" in texts and "[2]" in texts


def test_a_recorded_snapshot_as_svg_and_dot(tmp_path: Path) -> None:
    snap = load_snapshot(CORPUS)
    diag = analyse(snap)
    svg = ET.fromstring(render_svg(diag))
    assert float(svg.get("width", 0)) > 100 and float(svg.get("height", 0)) > 100
    graph = _read_dot(render_dot(diag), tmp_path)
    assert graph.number_of_nodes() == len(diag.tree)


def test_without_a_tree() -> None:
    diag = make_diagnosis(make_snapshot({}), verdict=Verdict.UNKNOWN, tree=False)
    assert len(tree_graph(diag)) == 0
    assert "no stacks were merged" in render_svg(diag)
    assert render_dot(diag).startswith("digraph hangdoc {")
    ET.fromstring(render_svg(diag))


def test_size_follows_the_tree_not_the_ranks() -> None:
    sizes = {}
    for world in (1_000, 4_000):
        diag = analyse(synthetic_snapshot(world, "straggler"))
        sizes[world] = (len(render_dot(diag)), len(render_svg(diag)), len(diag.tree))
    (dot1, svg1, n1), (dot4, svg4, n4) = sizes[1_000], sizes[4_000]
    assert n1 == n4
    # the same tree: only the rank ranges have more digits
    assert abs(dot4 - dot1) < dot1 * 0.03 and abs(svg4 - svg1) < svg1 * 0.03


def test_cli_writes_dot_and_svg(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dot, svg = tmp_path / "t.dot", tmp_path / "t.svg"
    assert main(["analyze", str(CORPUS), "--dot", str(dot), "--svg", str(svg), "--width", "100"]) == 0
    assert "collective_mismatch" in capsys.readouterr().out
    assert _read_dot(dot.read_text(), tmp_path).number_of_nodes() > 3
    ET.parse(svg)


def test_cli_refuses_a_directory_as_the_svg(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(CORPUS), "--svg", str(tmp_path)]) == 2
    assert "--svg" in capsys.readouterr().err


# ------------------------------------------------------------------ folding and the legend

TORCH_RUN = [
    "train.py:<module>:1",
    "train.py:main:9",
    "torch/distributed/c10d_logger.py:wrapper:83",
    "torch/distributed/distributed_c10d.py:all_reduce:2800",
]


def _parse(svg: str) -> ET.Element:
    """The SVG, an inline one (no namespace: the HTML parser knows ``<svg>``) as a file's."""
    if "xmlns=" not in svg.split("<svg ", 1)[1].split(">", 1)[0]:
        svg = svg.replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" ', 1)
    return ET.fromstring(svg)


def _nodes(svg: str) -> list[ET.Element]:
    return [g for g in _parse(svg).iter(f"{SVG}g") if "node" in (g.get("class") or "").split()]


def _lines(g: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in g.iter(f"{SVG}text")]


def _legend(svg: str) -> set[str]:
    marks = set()
    for g in _parse(svg).iter(f"{SVG}g"):
        classes = (g.get("class") or "").split()
        if "legend" in classes:
            marks |= set(classes) - {"legend"}
    return marks


def test_library_frames_fold_in_the_svg_as_in_the_terminal(tmp_path: Path) -> None:
    native = [Frame(f"c10d::Work{i}::wait", "/venv/lib/python3.11/site-packages/torch/lib/libtorch.so", native=True)
              for i in range(3)]  # fmt: skip
    stacks = {0: TORCH_RUN, 1: TORCH_RUN, 2: [*TORCH_RUN, *native]}
    diag = make_diagnosis(make_snapshot(stacks), verdict=Verdict.NCCL_TIMEOUT)
    nodes = _nodes(render_svg(diag))
    folded = [g for g in nodes if "folded" in (g.get("class") or "").split()]
    # the two torch frames are one box in the terminal's words (for the stretch all ranks
    # share, as the terminal folds it), the three native ones another
    shared = [n.frame for n in diag.tree.nodes if n.frame is not None and len(n.ranks) == 3]
    (row,) = [row for row in fold(shared) if row.frames > 1]
    assert row.frames == 2
    texts = [" ".join(_lines(g)) for g in folded]
    assert any(row.words in t and "2 frames folded" in t for t in texts), texts
    assert any("3 frames folded" in t for t in texts), texts
    assert len(nodes) == len(diag.tree) - 1 - 2  # 5 torch and native frames in 2 boxes
    # the user's own frames keep a box each
    assert {_lines(g)[0] for g in nodes} >= {"<module>", "main"}
    # every box's tooltip names the files it stands for
    assert "c10d_logger.py" in folded[0].find(f"{SVG}title").text  # type: ignore[union-attr,operator]
    # the DOT, read by tools, keeps every frame
    assert _read_dot(render_dot(diag), tmp_path).number_of_nodes() == len(diag.tree)
    assert len(tree_graph(diag)) == len(diag.tree) > len(tree_graph(diag, fold=True))


def test_folding_stops_at_a_divergence_point() -> None:
    a = [*TORCH_RUN[:3], "torch/distributed/distributed_c10d.py:all_reduce:2800"]
    b = [*TORCH_RUN[:3], "torch/distributed/distributed_c10d.py:barrier:4100"]
    diag = make_diagnosis(make_snapshot({0: a, 1: a, 2: b}), verdict=Verdict.COLLECTIVE_MISMATCH, culprits=[2])
    graph = tree_graph(diag, fold=True)
    assert not any(d["folded"] for d in graph.nodes.values())  # wrapper is above the split
    labels = {d["label"].split("\n")[0] for d in graph.nodes.values()}
    assert {"wrapper", "all_reduce", "barrier"} <= labels


def test_the_legend_names_only_the_marks_the_picture_uses() -> None:
    # an outlier, no culprit, no native frame: only the outlier entry
    diag = make_diagnosis(make_snapshot({0: AR, 1: AR, 2: BAR}), verdict=Verdict.UNKNOWN)
    assert _legend(render_svg(diag)) == {"outlier"}
    # a culprit branch (drawn red, not orange): the culprit entry only
    assert _legend(render_svg(_mismatch())) == {"culprit"}
    # nothing marked: no legend at all
    same = make_diagnosis(make_snapshot({0: AR, 1: AR}), verdict=Verdict.NCCL_TIMEOUT)
    assert _legend(render_svg(same)) == set()
    assert "outlier branch" not in render_svg(same)
    # native frames, dashed: their entry
    native = Frame("pthread_cond_wait", "/usr/lib/libc.so.6", native=True)
    with_native = make_diagnosis(make_snapshot({0: [*AR, native], 1: [*AR, native]}), verdict=Verdict.NCCL_TIMEOUT)
    assert _legend(render_svg(with_native)) == {"native"}


def test_the_corpus_picture_folds_torch_and_marks_the_culprit() -> None:
    diag = analyse(load_snapshot(CORPUS))
    svg = svg_element(diag)
    assert svg.startswith("<svg ") and "<?xml" not in svg
    assert "collective_mismatch" not in svg  # the page's header says it; no title line
    nodes = _nodes(svg)
    assert len(nodes) < len(diag.tree) - 5  # 21 frames, most of them torch's
    assert _legend(svg) == {"culprit", "native"}
    culprit_boxes = [g for g in nodes if "culprit" in (g.get("class") or "").split()]
    assert any("barrier" in " ".join(_lines(g)) and "folded" in (g.get("class") or "") for g in culprit_boxes)
