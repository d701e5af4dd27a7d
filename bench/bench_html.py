"""The shareable reports at scale: ``--html`` built and opened in headless Chromium, ``--dot``
and ``--svg`` built, for synthetic jobs of 1k to 100k ranks (``bench/synthetic.py``).

For each size it builds the snapshot, analyses it (the report needs the diagnosis), then
times ``render_html``, ``render_dot`` and ``render_svg`` and measures their sizes. The HTML
file is then opened ``--loads`` times in one headless Chromium (Debian's ``chromium``,
driven over the DevTools protocol by ``tests/support/browser.py``): the load time is the
wall time from ``Page.navigate`` until the page's script has drawn the tree and the first
culprit's stacks (it sets ``document.body.dataset.ready``); the first load is counted
with the rest. The issue's bar is a 100k-rank report opening in under 2 s. Page errors
(console, uncaught exceptions) fail the run.

Usage: ``python bench/bench_html.py [--sizes 1000,10000,100000] [--loads 5]
[--scenario collective_mismatch] [--keep DIR] [--write docs/benchmarks.md]``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

HEADING = "## HTML, DOT and SVG reports at scale (issue 14)"


def _measure(size: int, scenario: str, loads: int, out: Path, browser, executable: str) -> dict[str, object]:
    from synthetic import expected, synthetic_snapshot

    from hangdoc.analysis.analyse import analyse
    from hangdoc.report.graph import render_dot, render_svg
    from hangdoc.report.html import render_html

    snapshot = synthetic_snapshot(size, scenario)
    t0 = time.perf_counter()
    diagnosis = analyse(snapshot)
    analysed = time.perf_counter() - t0
    verdict, culprits = expected(size, scenario)
    if diagnosis.verdict is not verdict or tuple(diagnosis.culprit_ranks) != culprits:
        raise SystemExit(
            f"{size} ranks: the analysis said {diagnosis.verdict.value} "
            f"{list(diagnosis.culprit_ranks)[:8]}, expected {verdict.value}"
        )
    row: dict[str, object] = {"ranks": size, "analyse_s": analysed}
    for kind, render in (
        ("html", lambda: render_html(diagnosis, snapshot)),
        ("dot", lambda: render_dot(diagnosis)),
        ("svg", lambda: render_svg(diagnosis)),
    ):
        t0 = time.perf_counter()
        text = render()
        row[f"{kind}_s"] = time.perf_counter() - t0
        row[f"{kind}_bytes"] = len(text.encode())
        (out / f"report-{size}.{kind}").write_text(text)
    url = (out / f"report-{size}.html").resolve().as_uri()
    from support.browser import Browser

    with Browser(executable, timeout=60) as fresh:  # the first page a new browser opens
        row["fresh_s"] = fresh.open(url, timeout=60)
    times, ready = [], []
    for _ in range(loads):
        times.append(browser.open(url, timeout=60))
        ready.append(float(browser.evaluate("document.body.dataset.ready")) / 1000)
        if browser.errors:
            raise SystemExit(f"{size} ranks: the page reported errors: {browser.errors}")
    row.update(
        load_median_s=statistics.median(times),
        load_max_s=max(times),
        script_ready_s=statistics.median(ready),
        tree_nodes=len(diagnosis.tree or ()),
    )
    return row


def _table(rows: list[dict[str, object]]) -> str:
    lines = [
        (
            "| ranks | tree nodes | analyse | `--html` build | HTML size | load, median (max) "
            "| load in a fresh browser | `--dot` build, size | `--svg` build, size |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['ranks']:,} | {r['tree_nodes']} | {r['analyse_s']:.1f} s | {r['html_s']:.2f} s "
            f"| {_mb(r['html_bytes'])} | **{r['load_median_s']:.2f} s** ({r['load_max_s']:.2f} s) "
            f"| {r['fresh_s']:.2f} s "
            f"| {r['dot_s']:.3f} s, {_kb(r['dot_bytes'])} | {r['svg_s']:.3f} s, {_kb(r['svg_bytes'])} |"
        )
    return "\n".join(lines)


def _mb(n: object) -> str:
    return f"{int(n) / 1e6:.2f} MB"  # type: ignore[call-overload]


def _kb(n: object) -> str:
    return f"{int(n) / 1e3:.1f} kB"  # type: ignore[call-overload]


def _chromium_version(executable: str) -> str:
    try:
        out = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "chromium"
    return out.strip().splitlines()[-1] if out.strip() else "chromium"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="rank counts (default 1000,10000,100000)")
    parser.add_argument("--loads", type=int, default=5, help="page loads per size (default 5)")
    parser.add_argument("--scenario", default="collective_mismatch", help="a bench/synthetic.py scenario")
    parser.add_argument("--keep", metavar="DIR", help="keep the reports in DIR (default: a temporary directory)")
    parser.add_argument("--write", metavar="FILE", help="write the results into this markdown file's section")
    args = parser.parse_args(argv)
    from support.browser import Browser, find_chromium

    executable = find_chromium()
    if executable is None:
        raise SystemExit("bench_html: needs chromium (Debian: apt-get install chromium)")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    with tempfile.TemporaryDirectory(prefix="hangdoc-bench-html-") as tmp:
        out = Path(args.keep) if args.keep else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        rows = []
        with Browser(executable, timeout=60) as browser:
            for size in sizes:
                rows.append(_measure(size, args.scenario, args.loads, out, browser, executable))
                print(
                    f"{size:>7} ranks: html {rows[-1]['html_bytes']:,} bytes, load median "
                    f"{rows[-1]['load_median_s']:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
    table = _table(rows)
    print(table)
    if args.write:
        from docs_section import write_section

        command = (
            f"python bench/bench_html.py --sizes {args.sizes} --loads {args.loads} "
            f"--scenario {args.scenario} --write {args.write}"
        )
        text = "\n".join(
            [
                HEADING,
                "",
                (
                    f"`{command}` on {platform.node() or 'this machine'} ({platform.machine()}, "
                    f"{_cores()} cores, shared), {_chromium_version(executable)} headless, "
                    f"synthetic `{args.scenario}` jobs of `bench/synthetic.py` (36-67-frame main-thread "
                    "stacks, 4-12 threads a rank, a few hundred distinct stacks, 3 samples, 8 ranks a node). "
                    f"Load: wall time from `Page.navigate` until the page has drawn its tree and the first "
                    f"culprit's stacks, {args.loads} loads in one browser, the first one included; "
                    "and the first page a newly started browser opens. "
                    "The bar (issue 14): a 100k-rank report opens in under 2 s."
                ),
                "",
                table,
                "",
                (
                    "What the page holds does not grow with ranks x frames: each distinct frame, stack, "
                    "sample and rank set once, per-rank columns run-length encoded; only the pids are a "
                    "number a rank. The script draws a branch when it is first opened. DOT and SVG "
                    "grow with the merged tree's nodes, not with ranks (rank sets are range strings)."
                ),
            ]
        )
        write_section(Path(args.write), HEADING, text)
    return 0


def _cores() -> int:
    import os

    return os.cpu_count() or 1


if __name__ == "__main__":
    sys.exit(main())
