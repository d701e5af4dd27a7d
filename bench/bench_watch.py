"""``hangdoc watch`` against its issue-5 bars: detection latency and false alarms.

Runs the real training job of the tests (``tests/watchjobs/ddp_train.py``: DDP over gloo
on CPU under torchrun) wrapped in ``hangdoc watch``:

- hangs: ``--repeat`` runs of each of two hangs (a collective mismatch watched through
  output silence with ``--stall-after 3``, a lock straggler watched through
  ``hangdoc.step()`` heartbeats with a learned timeout), ``--on-hang kill``. For each:
  how far past the timeout the stall was detected (bar: at most one check interval), how
  long the diagnosis took, and whether the verdict and culprits were right.
- healthy: one run of ``--steps`` jittery steps (5-40 ms, a 250 ms spike every 37 steps)
  with a learned timeout (floor 2 s): how many silences were checked, how many alarms (bar:
  zero).

Usage: ``python bench/bench_watch.py [--repeat 3] [--steps 1000] [--write docs/benchmarks.md]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hangdoc.model import counted

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "tests" / "watchjobs" / "ddp_train.py"
BIN = Path(sys.executable).parent
HEADING = "## Watchdog detection latency and false alarms (issue 5)"

HANGS = {
    "mismatch, output silence, --stall-after 3": (
        ["--stall-after", "3"],
        3,
        ["--hang", "mismatch", "--at", "8"],
        "collective_mismatch",
        [2],
    ),
    "lock straggler, heartbeats, learned timeout": (
        ["--warmup-steps", "3", "--min-stall", "2", "--warmup-timeout", "60", "--max-window", "4"],
        2,
        ["--hang", "lock", "--at", "40", "--steps", "100", "--heartbeat"],
        "straggler",
        [1],
    ),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def watch(workdir: Path, watch_args: list[str], nproc: int, job_args: list[str], timeout: float) -> tuple[int, str]:
    argv = [
        sys.executable,
        "-m",
        "hangdoc",
        "watch",
        "--out",
        str(workdir / "hangs"),
        *watch_args,
        "--",
        str(BIN / "torchrun"),
        "--nproc-per-node",
        str(nproc),
        "--master-port",
        str(free_port()),
        str(TRAIN),
        *job_args,
    ]
    proc = subprocess.run(
        argv, check=False, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1")
    )
    return proc.returncode, proc.stderr


def hang_run(name: str) -> dict:
    watch_args, nproc, job_args, verdict, culprits = HANGS[name]
    with tempfile.TemporaryDirectory(prefix="bench-watch-") as tmp:
        code, err = watch(Path(tmp), [*watch_args, "--on-hang", "kill", "--kill-grace", "3"], nproc, job_args, 240)
        reports = list(Path(tmp, "hangs").glob("hang-*/report.json"))
        if code != 124 or len(reports) != 1:
            return {"ok": False, "why": f"exit {code}, {len(reports)} report(s): {err[-500:]}"}
        report = json.loads(reports[0].read_text())
    w = report["watch"]
    return {
        "ok": report["verdict"] == verdict and report["culprit_ranks"] == culprits,
        "verdict": f"{report['verdict']} {report['culprit_ranks']}",
        "timeout": w["timeout_seconds"],
        "overshoot": w["silence_seconds"] - w["timeout_seconds"],
        "interval": w["check_interval"],
        "diagnosis": w["diagnosis_seconds"],
    }


def healthy_run(steps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-watch-") as tmp:
        t0 = time.monotonic()
        code, err = watch(
            Path(tmp),
            ["--step-regex", r"step (\d+) loss", "--warmup-steps", "5", "--min-stall", "2"],
            2,
            ["--jitter", "--steps", str(steps)],
            60 + steps,
        )
        seconds = time.monotonic() - t0
        alarms = len(list(Path(tmp, "hangs").glob("hang-*")))
    return {
        "exit": code,
        "seconds": seconds,
        "alarms": alarms,
        "suspected": err.count("stall suspected"),
        "dismissed": err.count("not a hang") + err.count("not yet"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--write", metavar="FILE")
    args = parser.parse_args()
    rows = []
    for name in HANGS:
        for i in range(args.repeat):
            result = hang_run(name)
            print(name, i, result, file=sys.stderr, flush=True)
            rows.append((name, result))
    healthy = healthy_run(args.steps)
    print("healthy", healthy, file=sys.stderr)
    cmd = "python bench/bench_watch.py " + " ".join(sys.argv[1:])
    lines = [
        HEADING,
        "",
        (
            f"Produced by `{cmd.strip()}`, {time.strftime('%Y-%m-%d')}: real torchrun/gloo DDP jobs wrapped in "
            "`hangdoc watch --on-hang kill` (2 cores, shared). *Overshoot* is the silence at detection minus "
            "the stall timeout (bar: at most one check interval, 1 s); *diagnosis* is the time from detection "
            "to the report on disk (sampling window 2 s, longer when the evidence is ambiguous)."
        ),
        "",
        "| hang | run | verdict (culprits) | right | timeout (s) | overshoot (s) | diagnosis (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, (name, r) in enumerate(rows):
        if "timeout" not in r:
            lines.append(f"| {name} | {i % args.repeat + 1} | failed: {r['why'][:80]} | no | | | |")
            continue
        lines.append(
            f"| {name} | {i % args.repeat + 1} | {r['verdict']} | {'yes' if r['ok'] else 'NO'} | "
            f"{r['timeout']:.2f} | {r['overshoot']:.2f} | {r['diagnosis']:.2f} |"
        )
    lines += [
        "",
        (
            f"Healthy run: {args.steps} jittery steps in {healthy['seconds']:.0f} s, learned timeout (floor 2 s): "
            f"exit status {healthy['exit']}, **{counted(healthy['alarms'], 'alarm')}**; "
            f"{counted(healthy['suspected'], 'silence')} "
            f"checked by a diagnosis, {healthy['dismissed']} dismissed as progress."
        ),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        sys.path.insert(0, str(Path(__file__).parent))
        from docs_section import write_section

        write_section(Path(args.write), HEADING, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
