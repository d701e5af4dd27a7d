"""The --html report in a real headless Chromium (Debian's ``chromium``, driven over the
DevTools protocol by ``support.browser``): it loads without a console error, shows the
verdict, expands a branch, shows a rank's stacks, finds a function, is drawn (a screenshot
with many colours), keeps a hostile function name as text, opens a large report fast, and
is laid out so that the merged tree is on the first screen at 1280x800 and nothing runs
off the side at 1280x800 or 800x1000 (screenshots of both kept as test artefacts).

CI installs chromium (``.ci/run``); elsewhere these tests are skipped when it is absent.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.browser import Browser, find_chromium, png_pixels
from support.factories import make_diagnosis, make_snapshot
from support.paths import REPO

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot
from hangdoc.model import Frame, Verdict
from hangdoc.report.html import render_html

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="needs Debian's chromium for the headless browser tests (apt-get install chromium; CI installs it)",
)

CORPUS = REPO / "tests" / "snapshots" / "mismatch_ddp_uneven_epoch_end.json.gz"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with Browser(timeout=60) as b:
        yield b


@pytest.fixture(scope="module")
def corpus_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    snapshot = load_snapshot(CORPUS)
    path = tmp_path_factory.mktemp("html") / "report.html"
    path.write_text(render_html(analyse(snapshot), snapshot))
    return path


def _js(browser: Browser, code: str) -> object:
    return browser.evaluate(f"(() => {{ {code} }})()")


def test_a_recorded_report_in_chromium(browser: Browser, corpus_report: Path, tmp_path: Path) -> None:
    browser.open(corpus_report.as_uri())
    assert browser.errors == []
    # the verdict, as a person sees it
    assert browser.evaluate("document.getElementById('verdict').innerText") == "collective_mismatch"
    assert "culprit: rank 1" in browser.evaluate("document.querySelector('header').innerText")
    assert browser.evaluate("document.title").startswith("hangdoc: collective_mismatch")

    # expand a branch: collapse everything, then open the first branch by a click
    before = _js(
        browser,
        """
        document.getElementById('collapse-all').click();
        return document.querySelectorAll('#tree .ln:not([hidden])').length;""",
    )
    visible = "[...document.querySelectorAll('#tree .ln')].filter(e => e.offsetParent !== null).length"
    assert browser.evaluate(visible) == 0, before
    _js(browser, "document.querySelector('#tree .edge').click();")
    opened = browser.evaluate(visible)
    assert opened > 0
    # and a branch below it, drawn only now
    kids_before = browser.evaluate("document.querySelectorAll('#tree .blk').length")
    _js(browser, "document.querySelector('#tree .blk .blk:not(.open) > .edge').click();")
    assert browser.evaluate(visible) > opened
    assert browser.evaluate("document.querySelectorAll('#tree .blk').length") >= kids_before

    # click a rank: the culprit's rank set on its edge lists it and shows its stacks
    _js(browser, "document.querySelector('#tree .blk.culprit .rs, #culprits').click();")
    panel = browser.evaluate("document.getElementById('rank-view').innerText")
    assert "rank 1" in panel and "MainThread" in panel and "barrier" in panel
    assert "save_checkpoint" in panel  # the culprit's whole stack, outermost first
    # another rank, by its number: all its threads
    _js(
        browser,
        """
        const input = document.getElementById('rank-input');
        input.value = '2';
        document.getElementById('rank-go').click();""",
    )
    panel = browser.evaluate("document.getElementById('rank-view').innerText")
    assert "rank 2" in panel and "all_reduce" in panel
    assert browser.evaluate("document.querySelectorAll('#rank-view details.th').length") >= 2

    # search a function: results listed, the first one revealed and highlighted
    _js(
        browser,
        """
        const box = document.getElementById('search');
        box.value = 'save_checkpoint';
        box.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'}));""",
    )
    results = browser.evaluate("document.getElementById('search-results').innerText")
    assert "1 place in the tree" in results and "save_checkpoint" in results
    assert "in the threads of 1 rank" in results  # every thread of every rank is searched too
    flashed = browser.evaluate("document.querySelector('#tree .ln.flash').innerText")
    assert flashed.startswith("save_checkpoint")
    assert browser.evaluate("document.querySelectorAll('#tree .ln.hit').length") >= 1

    # drawn, not blank: many colours, and much of the page is not background
    png = browser.screenshot()
    (tmp_path / "report.png").write_bytes(png)
    width, height, pixels = png_pixels(browser.screenshot(scale=0.5))
    assert width > 300 and height > 200
    counted = Counter(pixels)
    colours = set(counted)
    drawn = 1 - counted.most_common(1)[0][1] / len(pixels)  # not the background
    assert len(colours) > 50 and drawn > 0.05, (len(colours), drawn)
    assert browser.errors == []


def test_a_hostile_function_name_stays_text(browser: Browser, tmp_path: Path) -> None:
    evil = '<img src=x onerror="window.pwned=1">'
    stack = [Frame("<module>", "/job/train.py", 1), Frame(evil, "/job/x.py", 2)]
    snapshot = make_snapshot({0: stack, 1: stack[:1]})
    diagnosis = make_diagnosis(snapshot, verdict=Verdict.STRAGGLER, culprits=[0], summary=evil)
    path = tmp_path / "evil.html"
    path.write_text(render_html(diagnosis, snapshot))
    browser.open(path.as_uri())
    _js(
        browser,
        """
        document.querySelector('#search').value = 'onerror';
        document.querySelector('#search').dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'}));
        document.getElementById('culprits').click();""",
    )
    assert browser.evaluate("window.pwned === undefined")
    assert browser.evaluate("document.querySelectorAll('img').length") == 0
    assert evil in browser.evaluate("document.getElementById('rank-view').innerText")
    # the page fetches nothing: its policy forbids it, and no request was refused either
    assert browser.errors == []


def test_a_10k_rank_report_opens_fast(browser: Browser, tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    from synthetic import synthetic_snapshot

    snapshot = synthetic_snapshot(10_000, "straggler")
    path = tmp_path / "10k.html"
    path.write_text(render_html(analyse(snapshot), snapshot))
    seconds = min(browser.open(path.as_uri()) for _ in range(3))
    assert browser.errors == []
    assert seconds < 2.0, f"{seconds:.2f} s to open a 10k-rank report"
    assert browser.evaluate("document.getElementById('verdict').innerText") == "straggler"
    # the straggler's rank set (one rank) and its stacks: all its threads
    panel = browser.evaluate("document.getElementById('rank-view').innerText")
    assert "rank 5000" in panel and "forward" in panel
    print(json.dumps({"ranks": 10_000, "html_bytes": path.stat().st_size, "load_s": round(seconds, 3)}))


def test_a_thousand_branches_are_drawn_in_batches(browser: Browser, tmp_path: Path) -> None:
    stacks = {r: ["train.py:<module>:1", "train.py:main:2", f"train.py:leaf{r}:{r + 10}"] for r in range(1000)}
    snapshot = make_snapshot(stacks)
    path = tmp_path / "wide.html"
    path.write_text(render_html(make_diagnosis(snapshot, verdict=Verdict.UNKNOWN), snapshot))
    browser.open(path.as_uri())
    assert browser.evaluate("document.querySelectorAll('#tree .blk').length") == 1 + 200
    assert browser.evaluate("document.querySelector('#tree .more').innerText").startswith("⋯ 800 more branches")
    _js(
        browser,
        """
        const box = document.getElementById('search');
        box.value = 'leaf777';
        box.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'}));""",
    )
    assert browser.evaluate("document.querySelector('#tree .ln.flash').innerText").startswith("leaf777")
    assert browser.errors == []


_GEOMETRY = """(() => {
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const lines = [...document.querySelectorAll('#tree .ln')].filter((e) => e.offsetParent !== null);
  const svg = document.querySelector('#picture-section svg');
  return {
    view: [innerWidth, innerHeight],
    scroll: [document.documentElement.scrollWidth, document.body.scrollWidth],
    header: box(document.querySelector('header')),
    tree: box(document.getElementById('tree')),
    lines: lines.slice(0, 4).map(box),
    panel: box(document.getElementById('rank-panel')),
    content: box(document.getElementById('content')),
    rows: document.querySelectorAll('#ranks tbody tr').length,
    culpritRow: (document.querySelector('#ranks tr.culprit') || {}).innerText || '',
    svgBoxes: svg ? svg.querySelectorAll('g.node').length : 0,
    svgFolded: svg ? svg.querySelectorAll('g.node.folded').length : 0,
    legend: svg ? [...svg.querySelectorAll('g.legend')].map((g) => g.getAttribute('class')) : [],
    svgWidth: svg ? svg.getBoundingClientRect().width : 0,
    picture: box(document.querySelector('#picture-section .picture')),
    header_text: document.querySelector('header').innerText,
  };
})()"""


def test_the_layout_at_two_sizes(browser: Browser, corpus_report: Path, tmp_path: Path) -> None:
    """One page, two windows: the proof on the first screen, nothing off the side."""
    try:
        for width, height in ((1280, 800), (800, 1000)):
            browser.set_viewport(width, height)
            browser.open(corpus_report.as_uri())
            g = browser.evaluate(_GEOMETRY)
            (tmp_path / f"report-{width}x{height}.png").write_bytes(browser.screenshot())
            (tmp_path / f"report-{width}x{height}-full.png").write_bytes(browser.full_screenshot())
            assert g["view"] == [width, height]
            assert g["scroll"][0] <= width and g["scroll"][1] <= width, g["scroll"]  # no sideways scroll
            # a compact header, then the merged tree: its first rows whole on the first screen
            assert g["header"][3] < 130, g["header"]
            assert len(g["lines"]) == 4
            for left, top, right, bottom in g["lines"]:
                assert left >= 0 and right <= width and g["header"][3] < top and bottom <= height, g["lines"]
            assert "culprit: rank 1" in g["header_text"] and "(1)" not in g["header_text"]
            # the rank table (a row a rank, the culprit's marked) and the picture, inside the page
            assert g["rows"] == 3 and g["culpritRow"].startswith("1")
            assert g["svgBoxes"] >= 5 and g["svgFolded"] >= 2 and g["svgWidth"] > 300
            assert g["legend"] == ["legend culprit", "legend native"]
            assert g["picture"][2] <= width
            if width >= 1280:  # the rank panel beside the sections, from the top
                assert g["panel"][0] >= g["content"][2] and g["panel"][1] < g["tree"][1]
            else:  # one column: the panel below them
                assert g["panel"][1] >= g["content"][3]
            assert browser.errors == []
    finally:
        browser.reset_viewport()
    for name in ("report-1280x800.png", "report-800x1000.png"):
        w, h, pixels = png_pixels((tmp_path / name).read_bytes())
        assert (w, h) == tuple(int(x) for x in name[7:-4].split("x"))
        assert len(set(pixels[:: max(1, len(pixels) // 20_000)])) > 20  # drawn, not blank
