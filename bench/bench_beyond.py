"""The wait past the ranks (issue 27): root causes, and what following costs a plain job.

``--recorded`` replays the captures of the jobs that hang past the ranks
(``tests/snapshots/beyond/``): verdict, culprits and root cause against each job's header
(``# hangdoc-root: cmd=WORD thread=NAME``: the root's command line holds WORD, its thread
is NAME, it is no rank; ``none``: no root). It also asks, of every rank of every plain
corpus capture (``tests/snapshots/``), whether capture would follow its waits
(``analysis.beyond.needs_waits``), and how long that question takes.

``--live`` launches those jobs and diagnoses each as a user would (``python -m hangdoc
diagnose JOB --json``), timed. With ``--baseline DIR`` (a checkout of a hangdoc from
before waits were followed), it also diagnoses one plain hung job whose ranks all wait in
collectives (``--plain``), ``--repeat`` times with each hangdoc in turn: the cost of
following on a job where no rank waits outside torch.distributed.

With ``--write FILE`` the section goes into ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from support.harness import JOBS_DIR, corpus, launch, load_meta

from hangdoc.analysis.analyse import analyse
from hangdoc.analysis.beyond import needs_waits
from hangdoc.bundle import load_snapshot

HEADING = "## Past the ranks: root causes, and the cost of following (issue 27)"
BEYOND = ROOT / "tests" / "jobs" / "beyond"
_ROOT = "# hangdoc-root:"


def expected_root(path: Path) -> dict[str, str] | None:
    for line in path.read_text().splitlines()[:5]:
        if line.startswith(_ROOT):
            words = line[len(_ROOT) :].split()
            return None if words == ["none"] else dict(w.split("=", 1) for w in words)
    raise SystemExit(f"{path}: no {_ROOT} line")


def root_right(expected: dict[str, str] | None, root: dict | None, rank_pids: set[int]) -> bool:
    if expected is None:
        return root is None
    return (
        root is not None
        and root["pid"] not in rank_pids
        and expected["cmd"] in " ".join(root["command"])
        and root["thread"] == expected["thread"]
    )


def _row(name: str, meta, report: dict, rank_pids: set[int], seconds: float, unit: str) -> tuple[str, bool, bool]:
    verdict_ok = report["verdict"] == meta.verdict and report["culprit_ranks"] == sorted(meta.culprits)
    root = report["root_cause"]
    root_ok = root_right(expected_root(meta.path), root, rank_pids)
    said = f"pid {root['pid']} thread '{root['thread']}'" if root else "none"
    took = f"{seconds:.{1 if unit == 's' else 2}f} {unit}"
    line = (
        f"| {name} | {meta.verdict} {sorted(meta.culprits)} | {report['verdict']} {report['culprit_ranks']} | "
        f"{'yes' if verdict_ok else 'NO'} | {said} | {'yes' if root_ok else 'NO'} | {took} |"
    )
    return line, verdict_ok, root_ok


def _table(rows: list[tuple[str, bool, bool]], timed: str) -> str:
    head = (
        f"| job | expected | got | verdict right | root cause | root right | {timed} |\n|---|---|---|---|---|---|---|\n"
    )
    verdicts = sum(v for _, v, _ in rows)
    roots = sum(r for _, _, r in rows)
    total = f"\n\n**{verdicts}/{len(rows)} verdicts and culprits right, {roots}/{len(rows)} root causes right.**"
    return head + "\n".join(line for line, _, _ in rows) + total


def recorded() -> str:
    from hangdoc.report.json_report import to_json_dict

    rows = []
    for path in sorted((ROOT / "tests" / "snapshots" / "beyond").glob("*.json.gz")):
        name = path.name.removesuffix(".json.gz")
        meta = load_meta(BEYOND / f"{name}.py")
        snapshot = load_snapshot(path)
        t0 = time.perf_counter()
        diagnosis = analyse(snapshot)
        ms = (time.perf_counter() - t0) * 1000
        report = to_json_dict(diagnosis, snapshot)
        rows.append(_row(name, meta, report, {r.process.pid for r in snapshot.ranks}, ms, "ms"))
    plain_ranks = followed = jobs_followed = 0
    seconds = 0.0
    for path in sorted((ROOT / "tests" / "snapshots").glob("*.json.gz")):
        snapshot = load_snapshot(path)
        any_followed = False
        for rank in snapshot.ranks:
            # what capture asks after the window: the samples of the window itself
            window = [s for s in rank.samples if s.t <= snapshot.window_seconds]
            t0 = time.perf_counter()
            wanted = needs_waits(window, rank.process, lambda _frame: None)
            seconds += time.perf_counter() - t0
            plain_ranks += 1
            followed += bool(wanted)
            any_followed |= bool(wanted)
        jobs_followed += any_followed
    n_plain = len(list((ROOT / "tests" / "snapshots").glob("*.json.gz")))
    return (
        "### Recorded captures of the jobs past the ranks (analysis only)\n\n"
        + _table(rows, "analysis")
        + "\n\n### Which ranks of the plain corpus capture would follow\n\n"
        f"Of {plain_ranks} ranks in the {n_plain} recorded plain corpus captures, **{followed}** "
        f"(in {jobs_followed} jobs) are off CPU outside any distributed op with a stack that did not move, "
        "the only ranks whose waits capture reads and follows: the culprits of stragglers and of cleanup "
        "hangs, ranks blocked in a healthy job's data loading. A rank in a collective is never followed. "
        f"The question costs {seconds / max(plain_ranks, 1) * 1e6:.0f} µs a rank."
    )


def _diagnose(spec: str, cwd: Path) -> tuple[dict, float]:
    t0 = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "hangdoc", "diagnose", spec, "--json", "-q"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    seconds = time.monotonic() - t0
    try:
        return json.loads(result.stdout), seconds
    except json.JSONDecodeError:
        return {"verdict": f"error (exit {result.returncode})", "culprit_ranks": [], "root_cause": None}, seconds


def live() -> str:
    rows = []
    for meta in corpus(BEYOND):
        with tempfile.TemporaryDirectory() as tmp, launch(meta, Path(tmp) / "job") as job:
            job.wait_ready()
            report, seconds = _diagnose(job.job_spec(), ROOT)
            pids = {r["pid"] for r in report.get("ranks", []) if r.get("pid")}
        line = _row(meta.name, meta, report, pids, seconds, "s")
        print(line[0], file=sys.stderr)
        rows.append(line)
    return "### Live jobs past the ranks (gloo on CPU, real servers and workers)\n\n" + _table(rows, "time to verdict")


def plain_cost(baseline: Path, plain: str, repeat: int) -> str:
    meta = load_meta(JOBS_DIR / f"{plain}.py")
    times: dict[str, list[float]] = {"this hangdoc": [], "baseline": []}
    verdicts: dict[str, set[str]] = {k: set() for k in times}
    with tempfile.TemporaryDirectory() as tmp, launch(meta, Path(tmp) / "job") as job:
        job.wait_ready()
        for _ in range(repeat):
            for label, cwd in (("this hangdoc", ROOT), ("baseline", baseline)):
                report, seconds = _diagnose(job.job_spec(), cwd)
                times[label].append(seconds)
                verdicts[label].add(f"{report['verdict']} {report['culprit_ranks']}")
    rows = "\n".join(
        f"| {label} | {statistics.median(ts):.2f} s | {min(ts):.2f} s | {max(ts):.2f} s | "
        f"{', '.join(sorted(verdicts[label]))} |"
        for label, ts in times.items()
    )
    ratio = statistics.median(times["this hangdoc"]) / statistics.median(times["baseline"])
    return (
        f"### Cost on a plain job: `{plain}`, {repeat} diagnoses with each hangdoc, alternating\n\n"
        "| hangdoc | median | min | max | verdicts |\n|---|---|---|---|---|\n"
        f"{rows}\n\nMedian ratio this/baseline: **{ratio:.2f}** (its ranks all wait in collectives: none is followed)."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recorded", action="store_true", help="replay the recorded captures")
    parser.add_argument("--live", action="store_true", help="launch and diagnose every job past the ranks")
    parser.add_argument("--baseline", type=Path, help="a checkout of a hangdoc that does not follow waits")
    parser.add_argument("--plain", default="mismatch_ddp_uneven_epoch_end", help="the plain job for --baseline")
    parser.add_argument("--repeat", type=int, default=5, help="diagnoses of the plain job per hangdoc")
    parser.add_argument("--write", type=Path, help="write the section into this markdown file")
    args = parser.parse_args()
    parts = []
    if args.recorded or not args.live:
        parts.append(recorded())
    if args.live:
        parts.append(live())
    if args.baseline:
        parts.append(plain_cost(args.baseline.resolve(), args.plain, args.repeat))
    flags = " ".join(
        f
        for f in (
            "--recorded" if args.recorded else "",
            "--live" if args.live else "",
            f"--baseline DIR --plain {args.plain} --repeat {args.repeat}" if args.baseline else "",
        )
        if f
    )
    text = (
        f"{HEADING}\n\nProduced by `python bench/bench_beyond.py {flags}` on {platform.node()} "
        f"({os.cpu_count()} cores, shared), {datetime.date.today().isoformat()}. A root cause is right when "
        "its process is no rank, its command line holds the word the job's header names and its thread is the "
        "header's; a healthy job's is right when there is none. These are hangdoc's own jobs, not a held-out "
        "set.\n\n" + "\n\n".join(parts)
    )
    print(text)
    if args.write:
        sys.path.insert(0, str(ROOT / "bench"))
        from docs_section import write_section

        write_section(args.write, HEADING, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
