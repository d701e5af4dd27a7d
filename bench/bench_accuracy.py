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

``--partial`` (issue 24: a verdict speaks only for the ranks seen) replays every recording
(the corpus snapshots, the stack dumps and flight recorder dumps of ``tests/data/``) with
ranks taken out: each rank alone, the first half, every rank but one (each culprit among
them), every rank but all the culprits; the hidden ranks as if absent from the dumps, on a
node that stopped answering (its ranks known), or behind an agent that never answered
(``tests/support/partial_views.py`` builds the views). Each view's verdict is set beside
the verdict over the whole recording. A **confident contradiction** is a view whose
confidence is medium or high, whose verdict is not ``unknown``, and which the whole job
contradicts: another verdict (the whole job's ``unknown`` included), or a culprit the whole
job does not name. Fewer culprits than the whole job names, anything at low confidence, and
``unknown`` are never one. Also counted: a hidden rank named as a culprit at medium or high
confidence (a verdict resting on a rank nobody saw, even where the whole job agrees), and a
rank called missing without positive evidence. The goal for each is 0.
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
from support.partial_views import Hiding, Trial, recordings, trials
from support.relocate import moved_under

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot
from hangdoc.rankranges import compress_ranks

HEADING = "## Accuracy on the corpus (issue 11)"
PARTIAL_HEADING = "## Part of a job: verdicts over subsets of the ranks (issue 24)"


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
            out.append(
                Outcome(
                    label,
                    meta.verdict,
                    tuple(sorted(meta.culprits)),
                    d.verdict.value,
                    d.culprit_ranks,
                    time.perf_counter() - t0,
                )
            )
    return out


def live() -> list[Outcome]:
    out = []
    for meta in corpus():
        if meta.mode == "netns" and os.geteuid() != 0:
            print(f"skipped {meta.name}: netns jobs need root", file=sys.stderr)
            continue
        with tempfile.TemporaryDirectory() as tmp, launch(meta, Path(tmp) / "job") as job:
            try:
                job.wait_ready()
            except AssertionError as err:  # the harness's word for a job that did not start
                first = str(err).splitlines()[0] if str(err) else "not ready"
                print(f"{meta.name}: did not start: {first}", file=sys.stderr)
                out.append(Outcome(meta.name, meta.verdict, tuple(sorted(meta.culprits)), "did not start", (), None))
                continue
            t0 = time.monotonic()
            result = subprocess.run(
                [sys.executable, "-m", "hangdoc", "diagnose", job.job_spec(), "--json"],
                capture_output=True,
                text=True,
                timeout=180,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                check=False,
            )
            seconds = time.monotonic() - t0
        try:
            report = json.loads(result.stdout)
            got, culprits = report["verdict"], tuple(report["culprit_ranks"])
        except (json.JSONDecodeError, KeyError, TypeError):
            got, culprits = f"error (exit {result.returncode})", ()
        outcome = Outcome(meta.name, meta.verdict, tuple(sorted(meta.culprits)), got, culprits, seconds)
        print(
            f"{meta.name}: {got} {list(culprits)} {'ok' if outcome.right else 'WRONG'} ({seconds:.1f} s)",
            file=sys.stderr,
        )
        out.append(outcome)
    return out


def table(outcomes: list[Outcome], timed: str = "Time to verdict", scale: float = 1.0, unit: str = "s") -> str:
    verdicts = sorted({o.expected for o in outcomes} | {o.got for o in outcomes})
    counts = Counter((o.expected, o.got) for o in outcomes)
    lines = ["| expected \\ got | " + " | ".join(f"`{v}`" for v in verdicts) + " |", "|---|" + "---|" * len(verdicts)]
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
        lines.append(
            f"{timed}: median {statistics.median(times) * scale:.1f} {unit}, max {max(times) * scale:.1f} {unit}."
        )
    for o in wrong:
        lines.append(
            f"- wrong: `{o.job}`: expected `{o.expected}` {list(o.culprits)}, got `{o.got}` {list(o.got_culprits)}"
        )
    return "\n".join(lines)


def partial() -> tuple[list[Trial], dict[str, str], int, float]:
    """Every view of every recording: (trials, the whole job's verdict by recording,
    recordings, seconds)."""
    t0 = time.perf_counter()
    out: list[Trial] = []
    wholes: dict[str, str] = {}
    recs = recordings()
    for rec in recs:
        for trial in trials(rec):
            out.append(trial)
            wholes[rec.name] = trial.whole.verdict
    return out, wholes, len(recs), time.perf_counter() - t0


def partial_table(views: list[Trial], wholes: dict[str, str], n_recordings: int, seconds: float) -> str:
    def row(label: str, ts: list[Trial], recs: int) -> str:
        return (
            f"| {label} | {recs} | {len(ts)} | {sum(t.part.confident for t in ts)} | "
            f"{sum(t.contradiction for t in ts)} | {sum(t.claims_hidden for t in ts)} | "
            f"{sum(bool(t.missing_unproven) for t in ts)} |"
        )

    head = [
        (
            "| {} | recordings | views | confident views | confident contradictions | "
            "hidden rank blamed (confident) | rank called missing without evidence |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    lines = [head[0].format("hidden as"), head[1]]
    for hiding in Hiding:
        ts = [t for t in views if t.hiding is hiding]
        lines.append(row(f"{hiding.value}", ts, len({t.recording for t in ts})))
    lines.append(row("**all**", views, len(wholes)))
    lines += ["", head[0].format("whole recording's verdict"), head[1]]
    for verdict in sorted(set(wholes.values())):
        ts = [t for t in views if t.whole.verdict == verdict]
        lines.append(row(f"`{verdict}`", ts, sum(1 for v in wholes.values() if v == verdict)))
    bad = [t for t in views if t.faults]
    contradictions = sum(t.contradiction for t in views)
    recs = len({t.recording for t in views if t.contradiction})
    lines += [
        "",
        (
            f"Confident contradictions: **{contradictions}** of {len(views)} views ({recs} recordings; "
            f"goal 0). {n_recordings} recordings replayed, {n_recordings - len(wholes)} with one rank "
            f"and nothing to hide. Replay and analysis of every view: {seconds:.1f} s."
        ),
    ]
    lines += [
        (
            f"- {', '.join(t.faults)}: `{t.recording}`, {t.subset} (kept {compress_ranks(t.kept)}, "
            f"{t.hiding.value}): `{t.part.verdict}` {list(t.part.culprits)} ({t.part.confidence}); "
            f"whole job: `{t.whole.verdict}` {list(t.whole.culprits)} ({t.whole.confidence})"
        )
        for t in bad
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--live", action="store_true", help="launch and diagnose every corpus job")
    parser.add_argument("--recorded", action="store_true", help="replay the recorded snapshots")
    parser.add_argument(
        "--partial",
        action="store_true",
        help="replay every recording with ranks removed: confident verdicts the whole job contradicts",
    )
    parser.add_argument("--write", type=Path, help="write the section(s) into this markdown file")
    args = parser.parse_args()
    when = datetime.date.today().isoformat()
    sections: list[tuple[str, str]] = []
    if args.recorded or args.live or not args.partial:
        parts = []
        if args.recorded or not args.live:
            outcomes = recorded()
            parts.append(
                f"### Recorded snapshots, as recorded and moved under ~/nanotorch ({len(outcomes)} analyses)"
                "\n\n" + table(outcomes, "Analysis time", 1000.0, "ms")
            )
        if args.live:
            outcomes = live()
            parts.append(
                f"### Live jobs ({len(outcomes)} real hung or healthy jobs, gloo on CPU)\n\n" + table(outcomes)
            )
        command = "python bench/bench_accuracy.py " + " ".join(
            a for a in ("--live" if args.live else "", "--recorded" if args.recorded else "") if a
        )
        sections.append(
            (
                HEADING,
                (
                    f"{HEADING}\n\nProduced by `{command.strip()}` on {platform.node()} "
                    f"({os.cpu_count()} cores, shared), {when}. A job is right when both its verdict and its "
                    "culprit ranks match its header in `tests/jobs/`. This is hangdoc's own test corpus, not "
                    "a held-out set: these figures show what regresses, not accuracy on jobs it has never "
                    "seen.\n\n" + "\n\n".join(parts)
                ),
            )
        )
    if args.partial:
        views, wholes, n_recordings, seconds = partial()
        sections.append(
            (
                PARTIAL_HEADING,
                (
                    f"{PARTIAL_HEADING}\n\nProduced by `python bench/bench_accuracy.py --partial` on {platform.node()} "
                    f"({os.cpu_count()} cores, shared), {when}. Every recording (the corpus snapshots of "
                    "`tests/snapshots/`, the stack dumps of `tests/data/dumps/`, the flight recorder dumps of "
                    "`tests/data/flight/`) replayed with ranks hidden: each rank alone (at most 4), the first half, "
                    "every rank but one (each culprit among them), every rank but all the culprits. Hidden as "
                    "*dumps*: the rest read from dump files, nobody searched for the hidden ranks; *node lost*: a "
                    "live capture whose other node stopped answering, its ranks known; *node silent*: an agent that "
                    "never answered, its ranks unknown (dump recordings are cut as dumps only). A **confident "
                    "contradiction** is a view at medium or high confidence, its verdict not `unknown`, that the "
                    "verdict over the whole recording contradicts: another verdict (the whole's `unknown` "
                    "included), or a culprit the whole does not name; fewer culprits than the whole names, low "
                    "confidence and `unknown` never are. *Hidden rank blamed*: a hidden rank among the culprits at "
                    "medium or high confidence (the verdict rests on a rank nobody saw, even where the whole "
                    "agrees). *Called missing without evidence*: a hidden rank in the view's `scope.absent`, or any "
                    "rank there from dumps or with a silent node. The goal for the last three columns is 0; "
                    "`tests/unit/analysis/test_partial_views.py` checks the same views.\n\n"
                    + partial_table(views, wholes, n_recordings, seconds)
                ),
            )
        )
    for _, text in sections:
        print(text)
    if args.write:
        sys.path.insert(0, str(ROOT / "bench"))
        from docs_section import write_section

        for heading, text in sections:
            write_section(args.write, heading, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
