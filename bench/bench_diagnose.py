"""Time to verdict on N real hung ranks, side by side with the py-spy loops it replaces.

For each N it starts the demo job (``examples/demo_train.py``: a real collective mismatch,
gloo on CPU) under torchrun with N ranks, waits until every rank is hung, then measures in
one run, interleaved, ``--repeat`` times each (median reported):

- ``manual loop``: the seed guide's procedure, ``py-spy dump --pid PID`` per rank in sequence;
- ``raw parallel``: ``py-spy dump --json --pid PID`` for every rank at once (the capture limit);
- ``hangdoc round``: one hangdoc capture round (stacks + process counters + source lines);
- ``hangdoc diagnose``: the CLI as a user runs it (interpreter start, discovery, the whole
  sampling window, analysis, JSON out), to the verdict.

Usage: ``python bench/bench_diagnose.py [--sizes 4,8,16,32] [--write docs/benchmarks.md]``.
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

from run_demo import free_port, kill_all, tagged

from hangdoc.capture.find.discover import discover
from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.capture.read.pyspy import find_pyspy
from hangdoc.capture.read.sample import sample_round
from hangdoc.pipeline import CaptureOptions


def start_job(n: int, tag: str, ready: Path) -> subprocess.Popen:
    env = dict(os.environ, HANGDOC_DEMO_TAG=tag, HANGDOC_READY_DIR=str(ready), OMP_NUM_THREADS="1")
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [
        str(torchrun),
        "--nproc-per-node",
        str(n),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(ROOT / "examples" / "demo_train.py"),
    ]
    log = open(ready / "job.log", "w")  # noqa: SIM115 - the child writes to it for its whole life
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60 + 10 * n
    while len(list(ready.glob("ready.*"))) < n:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"job with {n} ranks did not hang: {(ready / 'job.log').read_text()[-2000:]}")
        time.sleep(0.5)
    time.sleep(2.0)
    return proc


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def manual_loop(pyspy: str, pids: list[int]) -> None:
    for pid in pids:
        subprocess.run(
            [pyspy, "dump", "--pid", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
        )


def raw_parallel(pyspy: str, pids: list[int]) -> None:
    procs = [
        subprocess.Popen(
            [pyspy, "dump", "--json", "--pid", str(pid)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        for pid in pids
    ]
    for p in procs:
        p.communicate()


def bench_size(n: int, repeat: int, options: CaptureOptions) -> dict[str, object]:
    tag = os.urandom(8).hex()
    ready = Path(tempfile.mkdtemp(prefix="hangdoc-bench-"))
    launcher = start_job(n, tag, ready)
    try:
        spec = f"pid:{launcher.pid}"
        found = discover(parse_job_spec(spec))
        procs = list(found.ranks)
        pids = [p.pid for p in procs]
        assert len(pids) == n, f"discovered {len(pids)} ranks, expected {n}"
        pyspy = find_pyspy()
        times: dict[str, list[float]] = {"manual": [], "raw": [], "round": [], "diagnose": []}
        verdicts = set()
        for _ in range(repeat):
            times["manual"].append(timed(lambda: manual_loop(pyspy, pids)))
            times["raw"].append(timed(lambda: raw_parallel(pyspy, pids)))
            times["round"].append(timed(lambda: sample_round(procs, 0.0)))
            t0 = time.perf_counter()
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "hangdoc",
                    "diagnose",
                    spec,
                    "--json",
                    "-q",
                    "--window",
                    str(options.window),
                    "--interval",
                    str(options.interval),
                ],
                capture_output=True,
                text=True,
                check=True,
                cwd=ROOT,
            )
            times["diagnose"].append(time.perf_counter() - t0)
            report = json.loads(out.stdout)
            verdicts.add((report["verdict"], tuple(report["culprit_ranks"]), report.get("observed_seconds")))
        med = {k: statistics.median(v) for k, v in times.items()}
        return {"n": n, **med, "verdicts": sorted(verdicts)}
    finally:
        kill_all(launcher, tag)
        assert not tagged(tag), "bench job survived"


def render(rows: list[dict[str, object]], options: CaptureOptions, repeat: int, cmd: str) -> str:
    lines = [
        "# Benchmarks",
        "",
        "## Time to verdict on real hung ranks (issue 3)",
        "",
        (
            f"Produced by `{cmd}` on {platform.node()} ({os.cpu_count()} cores), "
            f"{time.strftime('%Y-%m-%d')}. Job: `examples/demo_train.py` under torchrun, gloo on "
            f"CPU, N ranks hung in a collective mismatch. Median of {repeat} interleaved runs."
        ),
        f"hangdoc window {options.window:.1f} s, interval {options.interval:.1f} s.",
        "",
        (
            "| ranks | manual py-spy loop (s) | raw parallel py-spy --json (s) | hangdoc capture round (s) "
            "| round / raw | hangdoc diagnose, to verdict (s) | beyond the window (s) "
            "| verdict (culprits, observed s) |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        beyond = float(r["diagnose"]) - options.window  # type: ignore[arg-type]
        lines.append(
            f"| {r['n']} | {r['manual']:.2f} | {r['raw']:.3f} | {r['round']:.3f} | "
            f"{float(r['round']) / float(r['raw']):.2f}x | {r['diagnose']:.2f} | {beyond:.2f} | "
            f"{'; '.join(f'{v} {list(c)} {o}' for v, c, o in r['verdicts'])} |"  # type: ignore[union-attr]
        )
    lines += [
        "",
        "The bar: one capture round costs at most 1.3x raw parallel py-spy of the same pids; time",
        "to verdict for 32 hung ranks is the sampling window plus at most 2 s.",
        "",
        "Reading the table: the manual loop is only the dumps, in sequence, with nobody reading",
        "them; hangdoc's round adds process counters and source lines to the same parallel dumps.",
        '"beyond the window" is everything but the sampling window: interpreter start and',
        "imports, discovery, the round still running when the window closes, analysis and output.",
        "The window itself is a choice (`--window`, default 2 s): it is what tells a hang from a",
        "slow step, which no single dump can.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,8,16,32")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--write", metavar="FILE", help="write the markdown table here")
    args = parser.parse_args()
    options = CaptureOptions()
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        print(f"benchmarking {n} ranks ...", file=sys.stderr, flush=True)
        rows.append(bench_size(n, args.repeat, options))
        print(rows[-1], file=sys.stderr, flush=True)
    cmd = "python bench/bench_diagnose.py " + " ".join(sys.argv[1:])
    text = render(rows, options, args.repeat, cmd.strip())
    print(text)
    if args.write:
        from docs_section import write_section

        section = text.split("\n", 2)[2]  # without the "# Benchmarks" title
        write_section(Path(args.write), "## Time to verdict on real hung ranks (issue 3)", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
