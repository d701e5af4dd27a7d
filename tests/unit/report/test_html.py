"""The --html report: self-contained, safe with hostile names, compact at scale, and its
embedded data says for every rank what the diagnosis and the snapshot say.

The page's behaviour in a real browser is tested in tests/live/test_html_browser.py.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from support.factories import make_diagnosis, make_op, make_rank, make_snapshot
from support.paths import REPO

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot
from hangdoc.cli import main
from hangdoc.model import Evidence, Frame, Note, NoteKind, RankState, ThreadStack, Verdict
from hangdoc.report.html import render_html, report_data
from hangdoc.watch.incident import HTML, write_incident
from hangdoc.watch.stall import Signal, Trigger

sys.path.insert(0, str(REPO / "bench"))
from synthetic import expected, synthetic_snapshot

CORPUS = REPO / "tests" / "snapshots" / "mismatch_ddp_uneven_epoch_end.json.gz"
TRUNK = ["train.py:<module>:60", "train.py:main:55"]
AR = [*TRUNK, "train.py:step:30", "torch/distributed/distributed_c10d.py:all_reduce:2800"]
BAR = [*TRUNK, "train.py:evaluate:48", "torch/distributed/distributed_c10d.py:barrier:4100"]


def _payload(page: str) -> dict[str, Any]:
    match = re.search(r'<script type="application/json" id="hangdoc-data">(.*?)</script>', page, re.DOTALL)
    assert match is not None
    return json.loads(match.group(1))  # type: ignore[no-any-return]


def _ranks_of(text: str) -> list[int]:
    out: list[int] = []
    for part in filter(None, text.split(",")):
        a, _, b = part.partition("-")
        out += range(int(a), int(b or a) + 1)
    return out


def _unruns(runs: list[int]) -> list[int]:
    return [v for v, n in zip(runs[::2], runs[1::2], strict=True) for _ in range(n)]


def _mismatch() -> tuple[Any, Any]:
    snap = make_snapshot(
        {0: AR, 1: AR, 2: BAR, 3: AR, 5: AR},
        world_size=6,
        threads={"pin_memory": ["threading.py:run:975", "queue.py:get:171"]},
    )
    diag = make_diagnosis(
        snap,
        verdict=Verdict.COLLECTIVE_MISMATCH,
        culprits=[2],
        summary="rank 2 is in barrier",
        evidence=[Evidence("ranks 0,1,3,5 wait in all_reduce")],
        next_steps=["look at evaluate"],
        ops={r: make_op("barrier" if r == 2 else "all_reduce") for r in (0, 1, 2, 3, 5)},
    )
    return snap, diag


# ------------------------------------------------------------------ the page


def test_the_page_is_self_contained_and_says_the_verdict() -> None:
    snap, diag = _mismatch()
    page = render_html(diag, snap)
    assert page.startswith("<!DOCTYPE html>")
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    # nothing to fetch: no external script, style, image or link
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page, re.IGNORECASE)
    assert "http://" not in page and "https://" not in page
    assert 'id="verdict">collective_mismatch<' in page
    assert 'culprit: <span class="culprits" id="culprits">rank 2<' in page
    assert "(1)" not in _header(page)  # no "2 (1)": the words say how many
    assert "rank 2 is in barrier" in page and "ranks 0,1,3,5 wait in all_reduce" in page
    assert "look at evaluate" in page and "observed for" in page
    assert page.count("<script") == 2  # the data and the page's own code, nothing else


def test_hostile_names_are_data_not_markup() -> None:
    evil = "</script><script>alert(1)</script><!--"
    stack = (Frame("<module>", "/job/train.py", 1), Frame(evil, "/job/x\u202e.py", 2))
    note = Note(f"note {evil}", NoteKind.NOT_RANKS, node="node7", pids=(7,), listed=f"pid 7 ({evil})")
    snap = make_snapshot({0: list(stack), 1: list(stack)}, spec="<b>job</b>", notes=[note])
    diag = make_diagnosis(snap, verdict=Verdict.NCCL_TIMEOUT, summary=f"summary {evil}")
    page = render_html(diag, snap)
    head, _, tail = page.partition('<script type="application/json"')
    assert "<script>alert(1)" not in page and "<b>job</b>" not in page
    assert "&lt;/script&gt;&lt;script&gt;alert(1)" in head  # escaped in the static part
    escaped = "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;!--"
    assert f"node7: note {escaped}: pid 7 ({escaped})" in head  # the note's words: node, text, list
    data = tail.split(">", 1)[1].split("</script>", 1)[0]
    assert "<" not in data  # the embedded JSON cannot end its script element early
    frames = _payload(page)["frames"]
    assert any(f[0] == evil for f in frames)  # and reads back exactly (the page sets textContent)
    assert any("\\u202e" in f[2] for f in frames)  # a bidi override is shown, not obeyed


def test_the_data_says_what_the_diagnosis_and_snapshot_say() -> None:
    snap, diag = _mismatch()
    data = report_data(diag, snap)
    tree, rsets = data["tree"], data["rsets"]
    assert len(tree["frame"]) == len(diag.tree) == len(tree["parent"]) == len(tree["ranks"])
    for node in diag.tree.nodes:
        assert _ranks_of(rsets[tree["ranks"][node.node_id]]) == list(node.ranks)
        if node.frame is not None:
            assert data["frames"][tree["frame"][node.node_id]][0] == node.frame.function
        for kid in node.children:
            assert tree["parent"][kid] == node.node_id
    assert sorted(tree["outliers"]) == sorted(diag.tree.outliers)
    assert _ranks_of(rsets[data["culprits"]]) == [2]
    # culprit nodes: the barrier branch, whose only rank is the culprit
    assert {data["frames"][tree["frame"][n]][0] for n in tree["culprit"]} >= {"barrier", "evaluate"}

    ids = _ranks_of(data["ranks"]["ids"])
    assert ids == [0, 1, 2, 3, 5]
    hosts, infos, views = (_unruns(data["ranks"][k]) for k in ("host", "info", "view"))
    by_rank = {ra.rank: ra for ra in diag.ranks}
    snaps = snap.by_rank()
    for i, rank in enumerate(ids):
        state, op, thread, _detail, _ = data["info"][infos[i]]
        assert state == by_rank[rank].state.value and thread == "MainThread"
        assert op.startswith("barrier" if rank == 2 else "all_reduce")
        assert data["hosts"][hosts[i]] == snaps[rank].process.host
        assert data["ranks"]["pid"][i] == snaps[rank].process.pid
        samples = [data["samples"][s] for s in data["views"][views[i]]]
        assert len(samples) == len(snaps[rank].samples)
        for shown, taken in zip(samples, snaps[rank].samples, strict=True):
            assert [name for name, _, _ in shown] == [th.name for th in taken.threads]
            for (_, stack, _), th in zip(shown, taken.threads, strict=True):
                assert [data["frames"][f][0] for f in data["stacks"][stack]] == [f.function for f in th.frames]
    leaf_of = {tuple(_ranks_of(rsets[r])): leaf for r, _, leaf in data["classes"]}
    assert data["frames"][tree["frame"][leaf_of[(2,)]]][0] == "barrier"


def test_a_rank_that_could_not_be_read_shows_why() -> None:
    from hangdoc.model import CaptureErrorKind

    snap = make_snapshot([make_rank(0, AR), make_rank(1, AR, error=CaptureErrorKind.PTRACE_DENIED)])
    diag = make_diagnosis(snap, verdict=Verdict.UNKNOWN, states={1: RankState.UNREADABLE})
    data = report_data(diag, snap)
    view = data["views"][_unruns(data["ranks"]["view"])[1]]
    assert all("ptrace_denied" in data["samples"][s]["error"] for s in view)


def test_no_tree_and_no_ranks_still_make_a_page() -> None:
    snap = make_snapshot({})
    diag = make_diagnosis(snap, verdict=Verdict.UNKNOWN, tree=False)
    data = report_data(diag, snap)
    assert data["tree"] is None and data["ranks"]["ids"] == "" and data["culprits"] == -1
    assert 'id="verdict">unknown<' in render_html(diag, snap)


def test_a_recorded_snapshot() -> None:
    snap = load_snapshot(CORPUS)
    diag = analyse(snap)
    data = report_data(diag, snap)
    assert data["verdict"] == "collective_mismatch"
    assert _ranks_of(data["rsets"][data["culprits"]]) == list(diag.culprit_ranks)
    # every thread of every sample of every rank, each distinct stack stored once
    threads = {th.frames for r in snap.ranks for s in r.samples for th in s.threads}
    assert len(data["stacks"]) == len(threads)


def test_large_jobs_cost_little_per_rank() -> None:
    world = 4_000
    snap = synthetic_snapshot(world, "collective_mismatch")
    diag = analyse(snap)
    assert (diag.verdict, tuple(diag.culprit_ranks)) == expected(world, "collective_mismatch")
    data = _payload(render_html(diag, snap))
    # what grows with the distinct stacks, not with ranks: each stored once
    threads = {th.frames for r in snap.ranks for s in r.samples for th in s.threads}
    assert len(data["stacks"]) == len(threads) < 400
    assert len(data["rsets"]) < 10 and len(data["info"]) < 10
    assert len(data["views"]) == len(data["samples"])  # a waiting rank's samples are one sample
    # what grows with ranks: the rank columns, a few bytes a rank (pids, views, one host a node)
    columns = len(json.dumps([data["ranks"], data["hosts"]], separators=(",", ":")))
    assert columns / world < 25, f"{columns / world:.1f} bytes a rank"
    assert len(data["ranks"]["host"]) == 2 * (world // 8)  # one run a node


# ------------------------------------------------------------------ layout, rank table, picture


def _header(page: str) -> str:
    return page[page.index("<header>") : page.index("</header>")]


def _section(page: str, ident: str) -> str:
    start = page.index(f'<section id="{ident}"')
    return page[start : page.index("</section>", start)]


def _rows(table: str) -> list[list[str]]:
    body = table.split("<tbody>", 1)[1]
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body)]


def test_the_tree_comes_right_below_a_short_header() -> None:
    snap, diag = _mismatch()
    diag = dataclasses.replace(diag, basis=("stacks of all 5 ranks", "rank 2 named by its stack"))
    page = render_html(diag, snap)
    header = _header(page)
    assert header.count("<p") == 2  # the summary and the job's line, below the verdict's
    assert "basis" not in header and "Evidence" not in header
    order = [
        page.index(f'id="{ident}"')
        for ident in ("tree-section", "ranks-section", "evidence", "next-steps", "picture-section", "basis", "notes")
    ]
    assert order == sorted(order)
    assert "<li>rank 2 named by its stack</li>" in _section(page, "basis")  # one item a reason


@pytest.mark.parametrize(
    ("culprits", "said"),
    [([2], "culprit: <span"), ([0, 1, 3], "culprits: <span"), ([], "no culprit named")],
)
def test_the_culprit_line_says_the_ranks_in_words(culprits: list[int], said: str) -> None:
    snap, diag = _mismatch()
    diag = dataclasses.replace(diag, culprit_ranks=tuple(culprits))
    header = _header(render_html(diag, snap))
    assert said in header
    if culprits == [0, 1, 3]:
        assert 'id="culprits">ranks 0-1, 3<' in header
    not_hung = dataclasses.replace(diag, verdict=Verdict.NOT_HUNG, culprit_ranks=())
    assert "culprit" not in _header(render_html(not_hung, snap))


def test_the_rank_table_has_a_row_per_rank_as_the_terminal() -> None:
    snap, diag = _mismatch()
    table = _section(render_html(diag, snap), "ranks-section")
    rows = _rows(table)
    assert [re.sub(r"<.*", "", r[0]).strip() for r in rows] == ["0", "1", "2", "3", "5"]
    by_rank = {ra.rank: ra for ra in diag.ranks}
    hosts = {rs.rank: rs.process for rs in snap.ranks}
    for row in rows:
        rank = int(re.sub(r"<.*", "", row[0]))
        assert row[1] == hosts[rank].host and row[2] == str(hosts[rank].pid)
        assert row[3] == by_rank[rank].state.value
        assert row[4] == ("barrier" if rank == 2 else "all_reduce")
    # the culprit's row is marked, and only it
    assert [("culprit" in r[0]) for r in rows] == [False, False, True, False, False]
    assert table.count('class="culprit" data-rank="2"') == 1
    assert "<th>rank</th><th>host</th><th>pid</th><th>state</th><th>op</th><th>call site</th>" in table


def test_a_job_that_is_not_hung_has_no_rank_blocked() -> None:
    snap, diag = _mismatch()
    states = {r: RankState.BLOCKED if r == 1 else RankState.PROGRESSING for r in (0, 1, 2, 3, 5)}
    calm = make_diagnosis(snap, verdict=Verdict.NOT_HUNG, states=states)
    page = render_html(calm, snap)
    rows = _rows(_section(page, "ranks-section"))
    assert [r[3] for r in rows] == ["progressing", "waiting", "progressing", "progressing", "progressing"]
    assert "blocked" not in _section(page, "ranks-section")
    assert "blocked" not in {info[0] for info in report_data(calm, snap)["info"]}  # nor in the panel
    hung = make_diagnosis(snap, verdict=Verdict.STRAGGLER, culprits=[1], states=states)
    assert [r[3] for r in _rows(_section(render_html(hung, snap), "ranks-section"))][1] == "blocked"


def test_past_32_ranks_the_table_has_a_row_per_class() -> None:
    world = 200
    snap = synthetic_snapshot(world, "straggler")
    diag = analyse(snap)
    table = _section(render_html(diag, snap), "ranks-section")
    rows = _rows(table)
    assert 1 < len(rows) < 10
    counts = [int(r[1].replace(",", "")) for r in rows]
    assert sum(counts) == world
    culprits = set(diag.culprit_ranks)
    assert "culprit" in rows[0][0]  # culprits first
    assert _ranks_of(re.sub(r"[\[\]]|<.*", "", rows[0][0]).strip()) == sorted(culprits)
    assert counts[1:] == sorted(counts[1:], reverse=True)  # then the largest
    assert f"{world} ranks in {len(rows)} classes" in table


def test_the_picture_is_inline_and_folds_library_frames() -> None:
    snap = load_snapshot(CORPUS)
    diag = analyse(snap)
    page = render_html(diag, snap)
    picture = _section(page, "picture-section")
    assert '<svg class="hangdoc-tree"' in picture
    assert "<?xml" not in page and "xlink:href" not in picture and "<image" not in picture
    assert "frames folded" in picture  # torch's own frames, one box a run
    assert 'class="legend culprit"' in picture and 'class="legend outlier"' not in picture
    # the picture's styles apply to it only: they cannot restyle the tree's rows
    style = re.search(r"<svg[^>]*>.*?<style>(.*?)</style>", picture, re.DOTALL)
    assert style is not None
    assert all(rule.startswith(".hangdoc-tree ") for rule in style.group(1).split("}") if rule)


def test_a_huge_tree_leaves_the_picture_to_svg() -> None:
    stacks = {r: ["train.py:<module>:1", f"train.py:leaf{r}:{r + 10}"] for r in range(2_100)}
    snap = make_snapshot(stacks)
    page = render_html(make_diagnosis(snap, verdict=Verdict.UNKNOWN), snap)
    picture = _section(page, "picture-section")
    assert "<svg" not in picture and "--svg FILE" in picture


# ------------------------------------------------------------------ CLI and watch


def test_analyze_writes_the_html_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.html"
    assert main(["analyze", str(CORPUS), "--json", "--html", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "collective_mismatch"
    page = out.read_text()
    assert 'id="verdict">collective_mismatch<' in page
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("where", ["missing/report.html", "."])
def test_a_report_path_that_cannot_be_written_fails_first(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    # checked before the input is even read: the bundle does not exist either
    assert main(["analyze", "nothing.json.gz", "--html", where]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hangdoc: error: --html ") and "Traceback" not in err
    assert "does not exist" in err or "is a directory" in err


def test_watch_writes_report_html_beside_report_json(tmp_path: Path) -> None:
    snap, diag = _mismatch()
    trigger = Trigger(
        Signal.OUTPUT, 2.0, 1.0, "--stall-after", 1.0, 3, None, datetime.datetime.now(datetime.UTC).isoformat()
    )
    where = write_incident(
        tmp_path, snap, diag, trigger, "confirmed by diagnosis", warn=lambda _level, text: print(text)
    )
    assert where is not None
    assert (where / "report.json").exists()
    page = (where / HTML).read_text()
    assert HTML == "report.html" and 'id="verdict">collective_mismatch<' in page


def test_threads_without_names_and_flags() -> None:
    stack = (Frame("<module>", "/job/train.py", 1),)
    snap = make_snapshot({0: list(stack)})
    rank = snap.ranks[0]
    odd = ThreadStack(7, None, stack, None, active=True, owns_gil=True)
    samples = tuple(dataclasses.replace(s, threads=(odd,)) for s in rank.samples)
    snap = dataclasses.replace(snap, ranks=(dataclasses.replace(rank, samples=samples),))
    data = report_data(make_diagnosis(snap, verdict=Verdict.UNKNOWN), snap)
    (entry,) = data["samples"]
    assert entry == [["", 0, 3]]  # no name; active and holding the GIL
