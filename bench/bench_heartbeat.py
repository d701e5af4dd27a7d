"""Cost per call of ``hangdoc.heartbeat(step)`` and ``with hangdoc.step():`` (issue 5 bar: < 1 us).

Measured in one run against an empty loop and an empty ``with`` on a no-op context manager,
so the numbers are the heartbeat's own cost, not the loop's. Usage:
``python bench/bench_heartbeat.py [--calls 1000000] [--write docs/benchmarks.md]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HANGDOC_HEARTBEAT_DIR", tempfile.mkdtemp(prefix="hangdoc-hb-"))

import hangdoc


class _Noop:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def per_call(fn, calls: int) -> float:
    t0 = time.perf_counter_ns()
    fn(calls)
    return (time.perf_counter_ns() - t0) / calls


def empty_loop(n: int) -> None:
    for _i in range(n):
        pass


def beat_loop(n: int) -> None:
    beat = hangdoc.heartbeat
    for i in range(n):
        beat(i)


def noop_with(n: int) -> None:
    for _ in range(n):
        with _Noop():
            pass


def step_loop(n: int) -> None:
    step = hangdoc.step
    for _ in range(n):
        with step():
            pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--write", metavar="FILE")
    args = parser.parse_args()
    hangdoc.heartbeat(0)  # open the record outside the timing
    rows = {"empty loop": [], "heartbeat(step)": [], "empty with": [], "with step()": []}
    for _ in range(args.repeat):  # interleaved, median kept
        rows["empty loop"].append(per_call(empty_loop, args.calls))
        rows["heartbeat(step)"].append(per_call(beat_loop, args.calls))
        rows["empty with"].append(per_call(noop_with, args.calls))
        rows["with step()"].append(per_call(step_loop, args.calls))
    med = {k: sorted(v)[len(v) // 2] for k, v in rows.items()}
    beat = med["heartbeat(step)"] - med["empty loop"]
    with_step = med["with step()"] - med["empty with"]
    cmd = "python bench/bench_heartbeat.py " + " ".join(sys.argv[1:])
    text = "\n".join(
        [
            "## Heartbeat cost (issue 5)",
            "",
            (
                f"Produced by `{cmd.strip()}`, {time.strftime('%Y-%m-%d')}, Python "
                f"{sys.version.split()[0]}, {args.calls:,} calls x {args.repeat} interleaved runs (median)."
            ),
            "",
            "| what | ns per call (loop included) | ns per call, the heartbeat alone |",
            "|---|---|---|",
            f"| empty `for` loop | {med['empty loop']:.0f} | - |",
            f"| `hangdoc.heartbeat(i)` | {med['heartbeat(step)']:.0f} | {beat:.0f} |",
            f"| empty `with` on a no-op context manager | {med['empty with']:.0f} | - |",
            f"| `with hangdoc.step():` (two beats) | {med['with step()']:.0f} | {with_step:.0f} |",
            "",
            "The bar: under 1 microsecond per call. A training step takes milliseconds to seconds.",
            "",
        ]
    )
    print(text)
    if args.write:
        sys.path.insert(0, str(Path(__file__).parent))
        from docs_section import write_section

        write_section(Path(args.write), "## Heartbeat cost (issue 5)", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
