"""Accuracy of hangdoc's verdicts on the corpus of real hung jobs: a confusion matrix.

``--live`` (what ``make bench-accuracy`` runs) launches every job of ``tests/jobs/`` (real
torch.distributed jobs on gloo, hung the way the job's header says; ``netns`` jobs only as
root), diagnoses it with ``python -m hangdoc diagnose JOB --json`` as a user would, and
times it. ``--recorded`` replays the snapshots recorded from those jobs
(``tests/snapshots/``), each also as if the job lived in a directory whose name contains
``torch`` (``/home/u/nanotorch``): the verdict must not depend on where a job is checked out.

Per verdict: precision and recall over the jobs; a job counts as right only when its
verdict and its culprit ranks are both right. Results go to stdout, or with ``--write`` into
``docs/benchmarks.md`` with the command that produced them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from support.harness import JOBS_DIR, corpus, launch, load_meta
from support.relocate import moved_under

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot

HEADING = "## Accuracy on the corpus (issue 11)"


@dataclasses.dataclass
class Outcome:
    job: str
    expected: str
    culprits: tuple[int, ...]
    got: str
    got_culprits: tuple[int, ...]
    seconds: float | None = None

    @property
    def right(self) -> bool:
        return self.expected == self.got and self.culprits == self.got_culprits


def recorded() -> list[Outcome]:
    out = []
    for path in sorted((ROOT / "tests" / "snapshots").glob("*.json.gz")):
        name = path.name.removesuffix(".json.gz")
        meta = load_meta(JOBS_DIR / f"{name}.py")
        snapshot = load_snapshot(path)
        for label, snap in ((name, snapshot), (f"{name} (in ~/nanotorch)", moved_under(snapshot, "/home/u/nanotorch"))):
            t0 = time.perf_counter()
            d = analyse(snap)
            out.append(Outcome(label, meta.verdict, tuple(sorted(meta.culprits)), d.verdict.value,
                               d.culprit_ranks, time.perf_counter() - t0))
    return out


def live() -> list[Outcome]:
    out = []
    for meta in corpus():
        if meta.mode == "netns" and os.geteuid() != 0:
            print(f"skipped {meta.name}: netns jobs need root", file=sys.stderr)
            continue
        with tempfile.TemporaryDirectory() as tmp, launch(meta, Path(tmp) / "job") as job:
            job.wait_ready()
            t0 = time.monotonic()
            result = subprocess.run([sys.executable, "-m", "hangdoc", "diagnose", job.job_spec(), "--json"],
                                    capture_output=True, text=True, timeout=180, cwd=ROOT,
                                    stdin=subprocess.DEVNULL, check=False)
            seconds = time.monotonic() - t0
        try:
            report = json.loads(result.stdout)
            got, culprits = report["verdict"], tuple(report["culprit_ranks"])
        except (json.JSONDecodeError, KeyError, TypeError):
            got, culprits = f"error (exit {result.returncode})", ()
        outcome = Outcome(meta.name, meta.verdict, tuple(sorted(meta.culprits)), got, culprits, seconds)
        print(f"{meta.name}: {got} {list(culprits)} {'ok' if outcome.right else 'WRONG'} ({seconds:.1f} s)",
              file=sys.stderr)
        out.append(outcome)
    return out


def table(outcomes: list[Outcome], timed: str = "Time to verdict", scale: float = 1.0, unit: str = "s") -> str:
    verdicts = sorted({o.expected for o in outcomes} | {o.got for o in outcomes})
    counts = Counter((o.expected, o.got) for o in outcomes)
    lines = ["| expected \\ got | " + " | ".join(f"`{v}`" for v in verdicts) + " |",
             "|---|" + "---|" * len(verdicts)]
    for e in verdicts:
        if any(o.expected == e for o in outcomes):
            lines.append(f"| `{e}` | " + " | ".join(str(counts[(e, g)] or "") for g in verdicts) + " |")
    lines += ["", "| verdict | jobs | precision | recall | right culprits |", "|---|---|---|---|---|"]
    for v in verdicts:
        expected = [o for o in outcomes if o.expected == v]
        said = [o for o in outcomes if o.got == v]
        if not expected and not said:
            continue
        hits = sum(1 for o in said if o.expected == v)
        precision = f"{hits / len(said):.2f}" if said else "-"
        recall = f"{hits / len(expected):.2f}" if expected else "-"
        right = sum(1 for o in expected if o.right)
        lines.append(f"| `{v}` | {len(expected)} | {precision} | {recall} | {right}/{len(expected)} |")
    wrong = [o for o in outcomes if not o.right]
    lines += ["", f"Right verdict and culprits: {len(outcomes) - len(wrong)} of {len(outcomes)}."]
    times = [o.seconds for o in outcomes if o.seconds is not None]
    if times:
        lines.append(f"{timed}: median {statistics.median(times) * scale:.1f} {unit}, "
                     f"max {max(times) * scale:.1f} {unit}.")
    for o in wrong:
        lines.append(f"- wrong: `{o.job}`: expected `{o.expected}` {list(o.culprits)}, got `{o.got}` "
                     f"{list(o.got_culprits)}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--live", action="store_true", help="launch and diagnose every corpus job")
    parser.add_argument("--recorded", action="store_true", help="replay the recorded snapshots")
    parser.add_argument("--write", type=Path, help="write the section into this markdown file")
    args = parser.parse_args()
    parts = []
    if args.recorded or not args.live:
        outcomes = recorded()
        parts.append(f"### Recorded snapshots, as recorded and moved under ~/nanotorch ({len(outcomes)} analyses)\n\n"
                     + table(outcomes, "Analysis time", 1000.0, "ms"))
    if args.live:
        outcomes = live()
        parts.append(f"### Live jobs ({len(outcomes)} real hung or healthy jobs, gloo on CPU)\n\n" + table(outcomes))
    command = "python bench/bench_accuracy.py " + " ".join(
        a for a in ("--live" if args.live else "", "--recorded" if args.recorded else "") if a)
    when = datetime.date.today().isoformat()
    text = (f"{HEADING}\n\nProduced by `{command.strip()}` on {platform.node()} "
            f"({os.cpu_count()} cores, shared), {when}. A job is right when both its verdict and its "
            "culprit ranks match its header in `tests/jobs/`. This is hangdoc's own test corpus, not "
            "a held-out set: these figures show what regresses, not accuracy on jobs it has never "
            "seen.\n\n" + "\n\n".join(parts))
    print(text)
    if args.write:
        sys.path.insert(0, str(ROOT / "bench"))
        from docs_section import write_section

        write_section(args.write, HEADING, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
