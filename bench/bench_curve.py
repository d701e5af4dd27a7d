"""The cost curve: time and memory of each stage of a diagnosis from 1k to 1M ranks.

Stages, each measured here in the same run:

- **find_ranks**, **one round**, **observe()**: the coordinator's fan-out through the relay
  tree (``bench_fanout.bench_modes``, mode "tree" above ``fleet.tree.TREE_AT`` agents, flat
  below), over ranks/8 agents (8 GPUs a node) hosted ``--per-process`` to a process on this
  machine's cores; the agents replay a 3-rank snapshot, so a node's capture costs ~0 and the
  figures are the fan-out's (a real node's py-spy look at 8 ranks adds its own 0.1 s or so,
  in parallel on every node: ``bench/bench_service.py``). Memory: the coordinator's peak RSS.
- **save**, **load**, **analysis**, **JSON report**, **terminal report**: a synthetic job of
  ``bench/synthetic.py`` (``collective_mismatch``), saved as a bundle, then in a fresh
  process loaded, analysed and reported, each stage timed, the process's resident memory
  read after each (and its peak); the verdict and culprits are checked.

Fan-out sizes stop at ``--fanout-up-to`` ranks: past ~12,500 agents one machine runs out of
loopback ports and tasks before the coordinator does (docs/scale.md).

Usage: ``python bench/bench_curve.py [--ranks 1000,10000,100000,1000000]
[--fanout-up-to 100000] [--per-process 625] [--write docs/benchmarks.md --plot docs/cost-curve.svg]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_scale import _rss_mb  # noqa: E402 - bench/ is on the path only from here

HEADING = "## The cost curve, 1k to 1M ranks (issue 30)"
RANKS = (1_000, 10_000, 100_000, 1_000_000)
GPUS_PER_NODE = 8
SCENARIO = "collective_mismatch"
ABOUT = (
    "find_ranks, one sample round and one whole observe() (a 2 s window at 0.5 s, source lines, "
    "analysis) are the coordinator's, over ranks/8 agents (8 GPUs a node) hosted on this machine's "
    "cores with the coordinator, through the relay tree above 400 agents; the agents replay a 3-rank "
    "snapshot, so a node's own capture (a real py-spy look at 8 ranks: about 0.1 s, in parallel on every "
    "node, `bench/bench_service.py`) is not in these figures, and their CPU shares the 2 cores. save, load, "
    "analysis and the reports are those of a synthetic `collective_mismatch` job of `bench/synthetic.py`, "
    "each stage timed in a fresh process."
)
STAGES = ("find_ranks", "one round", "observe()", "save", "load", "analysis", "JSON report", "terminal report")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def analysis_worker(ranks: int, bundle: str) -> dict[str, Any]:
    """In a process of its own: load ``bundle``, analyse, report; each stage's seconds and
    the resident MB after it."""
    from rich.console import Console
    from synthetic import expected

    from hangdoc.analysis.analyse import analyse
    from hangdoc.bundle import load_snapshot
    from hangdoc.report.json_report import render_json
    from hangdoc.report.terminal import render

    out: dict[str, Any] = {"ranks": ranks}
    t0 = time.perf_counter()
    snapshot = load_snapshot(bundle)
    out["load"] = (time.perf_counter() - t0, _rss_mb())
    t0 = time.perf_counter()
    diagnosis = analyse(snapshot)
    out["analysis"] = (time.perf_counter() - t0, _rss_mb())
    t0 = time.perf_counter()
    text = render_json(diagnosis, snapshot)
    out["JSON report"] = (time.perf_counter() - t0, _rss_mb())
    out["json_mb"] = len(text) / 1e6
    del text
    sink = io.StringIO()
    t0 = time.perf_counter()
    render(diagnosis, snapshot, Console(file=sink, width=120, color_system=None, force_terminal=False))
    out["terminal report"] = (time.perf_counter() - t0, _rss_mb())
    out["terminal_lines"] = sink.getvalue().count("\n")
    out["peak"] = _peak_mb()
    verdict, culprits = expected(ranks, SCENARIO)
    out["right"] = diagnosis.verdict is verdict and tuple(diagnosis.culprit_ranks) == culprits
    return out


def save_worker(ranks: int, bundle: str) -> dict[str, Any]:
    """In a process of its own: build the synthetic job, then time saving it."""
    from synthetic import synthetic_snapshot

    from hangdoc.bundle import save_snapshot

    snapshot = synthetic_snapshot(ranks, SCENARIO)
    before = _rss_mb()
    t0 = time.perf_counter()
    save_snapshot(snapshot, bundle)
    return {
        "save": (time.perf_counter() - t0, _rss_mb()),
        "built_mb": before,
        "bundle_mb": os.path.getsize(bundle) / 1e6,
    }


def _child(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"bench_curve {' '.join(args)} failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def analysis_stages(ranks: int, tmp: Path) -> dict[str, Any]:
    bundle = str(tmp / f"curve-{ranks}.json.gz")
    saved = _child("--save-worker", str(ranks), bundle)
    row = _child("--analysis-worker", str(ranks), bundle)
    os.unlink(bundle)
    if not row["right"]:
        raise SystemExit(f"{ranks} ranks: the analysis named the wrong verdict or culprits")
    return {**saved, **row}


def fanout_stages(ranks: int, per: int) -> dict[str, Any]:
    """find_ranks, one round and one observe() over ranks/8 agents, as ``diagnose`` would
    make them (through relays above ``fleet.tree.TREE_AT``)."""
    from bench_fanout import bench_modes, why_cell

    from hangdoc.fleet import tree
    from hangdoc.pipeline import CaptureOptions

    nodes = max(ranks // GPUS_PER_NODE, 2)
    mode = "tree" if nodes > tree.TREE_AT else "flat"
    (row,) = bench_modes(nodes, min(per, nodes), 3, CaptureOptions(window=2.0, interval=0.5), [mode])
    if not row["verdict_ok"]:
        raise SystemExit(
            f"{nodes} agents: the diagnosis named the wrong verdict or culprits "
            f"(nodes lost: {why_cell(row['why_lost'])})"
        )
    peak = _peak_mb()
    return {
        "nodes": nodes,
        "mode": mode,
        "find_ranks": (row["find"], peak),
        "one round": (row["round"], peak),
        "observe()": (row["watch"], peak),
        "cpu_round": row["cpu"],
        "agents_cpu_round": row["agents_cpu"],
        "lost": row["unreachable_find"] + row["unreachable_watch"] + row["lost"],
        "why_lost": row["why_lost"],
    }


def _cell(value: tuple[float, float] | None) -> str:
    if value is None:
        return "—"
    seconds, mb = value
    shown = f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"
    return f"{shown}, {mb:,.0f} MB"


def _lost_cell(row: dict[str, Any]) -> str:
    from bench_fanout import why_cell

    return f"{row['lost']:,}" + (f" ({why_cell(row['why_lost'])})" if row["lost"] else "")


def table(rows: dict[int, dict[str, Any]]) -> str:
    sizes = sorted(rows)
    lines = [
        "| stage | " + " | ".join(f"{n:,} ranks" for n in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for stage in STAGES:
        lines.append(f"| {stage} | " + " | ".join(_cell(rows[n].get(stage)) for n in sizes) + " |")
    lines.append(
        "| nodes asked (mode) | "
        + " | ".join(f"{rows[n]['nodes']:,} ({rows[n]['mode']})" if "nodes" in rows[n] else "—" for n in sizes)
        + " |"
    )
    lines.append(
        "| nodes lost (why) | " + " | ".join(_lost_cell(rows[n]) if "nodes" in rows[n] else "—" for n in sizes) + " |"
    )
    lines.append("| bundle | " + " | ".join(f"{rows[n]['bundle_mb']:.2f} MB" for n in sizes) + " |")
    lines.append("| terminal report lines | " + " | ".join(str(rows[n]["terminal_lines"]) for n in sizes) + " |")
    lines.append("| peak of the analysis process | " + " | ".join(f"{rows[n]['peak']:,.0f} MB" for n in sizes) + " |")
    return "\n".join(lines)


def dominant(rows: dict[int, dict[str, Any]]) -> list[str]:
    out = []
    for n in sorted(rows):
        timed = {s: rows[n][s][0] for s in STAGES if s in rows[n] and s != "observe()"}
        top = max(timed, key=lambda s: timed[s])
        out.append(f"{n:,} ranks: {top} ({timed[top]:.2f} s of {sum(timed.values()):.2f} s in these stages)")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default=",".join(map(str, RANKS)), help="comma-separated")
    parser.add_argument("--fanout-up-to", type=int, default=100_000, help="largest job whose fan-out is measured")
    parser.add_argument("--per-process", type=int, default=625, help="agents hosted in one process")
    parser.add_argument("--write", type=Path, help="write the section into this markdown file")
    parser.add_argument("--plot", type=Path, help="write the chart (SVG) here")
    parser.add_argument("--analysis-worker", nargs=2, metavar=("RANKS", "BUNDLE"), help=argparse.SUPPRESS)
    parser.add_argument("--save-worker", nargs=2, metavar=("RANKS", "BUNDLE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.analysis_worker:
        print(json.dumps(analysis_worker(int(args.analysis_worker[0]), args.analysis_worker[1])))
        return 0
    if args.save_worker:
        print(json.dumps(save_worker(int(args.save_worker[0]), args.save_worker[1])))
        return 0
    load_before = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    rows: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="hangdoc-curve-") as tmp:
        for ranks in sorted(int(r) for r in args.ranks.split(",")):
            print(f"{ranks:,} ranks: save, load, analysis, reports ...", file=sys.stderr, flush=True)
            rows[ranks] = analysis_stages(ranks, Path(tmp))
            if ranks <= args.fanout_up_to:
                print(f"{ranks:,} ranks: fan-out ...", file=sys.stderr, flush=True)
                rows[ranks].update(fanout_stages(ranks, args.per_process))
            print({k: v for k, v in rows[ranks].items()}, file=sys.stderr, flush=True)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    cmd = "python bench/bench_curve.py " + " ".join(sys.argv[1:])
    text = "\n".join(
        [
            HEADING,
            "",
            f"Produced by `{cmd.strip()}` on {platform.node()} ({os.cpu_count()} cores, shared: load average "
            f"{load_before} before, {load} after), Python {platform.python_version()}, "
            f"{time.strftime('%Y-%m-%d')}. {ABOUT}",
            "",
            "Each cell: wall seconds, and resident MB (the coordinator's peak for the fan-out stages; the "
            "analysis process's after the stage for the others). Every verdict and culprit was right.",
            "",
            table(rows),
            "",
            "Which stage dominates: " + "; ".join(dominant(rows)) + ".",
        ]
    )
    if args.plot:
        from svgplot import loglog

        series = {s: [(float(n), rows[n][s][0]) for n in sorted(rows) if s in rows[n]] for s in STAGES}
        args.plot.write_text(
            loglog(
                series,
                title="hangdoc: seconds per stage",
                x_label="ranks of the job",
                y_label="seconds",
                guide=(5.0, "5 s"),
            )
        )
        text += f"\n\n![seconds per stage]({args.plot.name})"
    print(text)
    if args.write:
        from docs_section import write_section

        write_section(args.write, HEADING, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
