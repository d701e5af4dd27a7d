"""What ``hangdoc.probe`` costs the job, and how fast it answers (issue 13: it never slows
or blocks the job).

A child process runs a pure-Python loop (the GIL held but for the interpreter's switch
points, as in a training step's Python part) in rounds; the same process, with and without
the probe started, alternately, so the ratio comes from one run on this shared machine.
While the probe is started, a second series asks it for its answer once per round (``ping``
and ``flight``, this process has no torch.distributed: the error answer), so the cost of
being asked is measured too. Usage:
``python bench/bench_probe.py [--rounds 10] [--write docs/benchmarks.md]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hangdoc.capture.read.probe_client import _ask

HEADING = "## In-process probe cost (issue 13)"
CHILD = r"""
import sys, time
import hangdoc.probe
if sys.argv[1] == "probe":
    print(hangdoc.probe.start(), flush=True)
else:
    print("-", flush=True)
def work():  # a fixed amount of Python work, in a function: fast locals in both children
    t0 = time.perf_counter()
    total = 0
    for i in range(6_000_000):
        total += i & 7
    return time.perf_counter() - t0
for line in sys.stdin:  # one round per line
    print(f"{work():.6f}", flush=True)
"""


def _child(mode: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def _round(proc: subprocess.Popen[str], ask: str | None) -> tuple[float, list[float]]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    answers = []
    if ask:
        for request in (b"ping\n", b"flight\n"):
            t0 = time.perf_counter()
            _ask(ask, request, 5.0)
            answers.append(time.perf_counter() - t0)
    return float(proc.stdout.readline()), answers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--write", metavar="FILE")
    args = parser.parse_args()
    plain, _ = _child("plain")
    probed, path = _child("probe")
    times: dict[str, list[float]] = {"without": [], "idle": [], "asked": []}
    answers: list[float] = []
    try:
        for _ in range(args.rounds):  # interleaved
            times["without"].append(_round(plain, None)[0])
            times["idle"].append(_round(probed, None)[0])
            took, asked = _round(probed, path)
            times["asked"].append(took)
            answers += asked
    finally:
        for proc in (plain, probed):
            proc.kill()
            proc.wait()
    med = {k: statistics.median(v) for k, v in times.items()}
    cmd = "python bench/bench_probe.py " + " ".join(sys.argv[1:])
    text = "\n".join(
        [
            HEADING,
            "",
            (
                f"Produced by `{cmd.strip()}`, {time.strftime('%Y-%m-%d')}, Python {sys.version.split()[0]}, "
                f"{args.rounds} interleaved rounds of a fixed pure-Python loop (6,000,000 iterations) in a child "
                "process (median)."
            ),
            "",
            "| the child | seconds per round | vs. without the probe |",
            "|---|---|---|",
            f"| without the probe | {med['without']:.3f} | 1.00 |",
            f"| probe started, idle | {med['idle']:.3f} | {med['idle'] / med['without']:.2f} |",
            (
                f"| probe asked `ping` and `flight` during the round | {med['asked']:.3f} | "
                f"{med['asked'] / med['without']:.2f} |"
            ),
            "",
            (
                f"Time to an answer while the child's main thread runs Python: median "
                f"{statistics.median(answers) * 1000:.1f} ms, max {max(answers) * 1000:.1f} ms "
                f"({len(answers)} requests). A thread that never releases the GIL leaves the probe "
                "unanswered: the caller gives up after its timeout (3 s in `diagnose`; "
                "tests/unit/capture/read/test_probe.py)."
            ),
            "",
        ]
    )
    print(text)
    if args.write:
        sys.path.insert(0, str(Path(__file__).parent))
        from docs_section import write_section

        write_section(Path(args.write), HEADING, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
