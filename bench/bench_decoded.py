"""A live capture's snapshot, as the coordinator decodes it, with and without shared values.

A diagnosis analyses, and ``--save`` writes, the snapshot the coordinator decoded from its
agents' answers, not one read back from a bundle. Through the relay tree each answer is one
relay's table (64 nodes of 8 ranks) in one round, and its stacks and threads are new
objects; the analysis and the bundle writer work once per object (``hangdoc.memo``). This
bench builds a synthetic job (``bench/synthetic.py``, collective_mismatch), encodes each
round's samples as those tables (``wire.samples_to_proto``, 512 ranks each), decodes them
as the coordinator does (``wire.samples_from_proto``) with the capture's shared values
(``memo.share_values``, as ``pipeline.observe`` runs) and without (the code before them),
then times ``analyse`` and the save of what was decoded. gRPC is left out: this is the
coordinator's own work on the answers. Each mode runs in a process of its own; the verdict
and culprits must be the synthetic job's, and both modes must write the same bytes.

Usage: ``python bench/bench_decoded.py [--sizes 10000,100000] [--write docs/benchmarks.md]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HEADING = "## A live capture's snapshot: shared values (issue 30)"
SCENARIO = "collective_mismatch"
PER_TABLE = 512  # ranks in one relay's table: 64 nodes of 8 ranks
MODES = ("separate", "shared")


def worker(ranks: int, mode: str) -> dict[str, Any]:
    """In a process of its own: decode, analyse and save one capture's answers."""
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    from synthetic import expected, synthetic_snapshot

    from hangdoc import memo
    from hangdoc.analysis.analyse import analyse
    from hangdoc.bundle import snapshot_bytes
    from hangdoc.fleet import wire
    from hangdoc.fleet.v1 import agent_pb2 as pb
    from hangdoc.model import RankSnapshot

    job = synthetic_snapshot(ranks, SCENARIO)
    rounds = len(job.ranks[0].samples)
    answers = [
        [
            wire.samples_to_proto(
                [(j, r.samples[k]) for j, r in enumerate(job.ranks[i : i + PER_TABLE], start=i)]
            ).SerializeToString()
            for i in range(0, len(job.ranks), PER_TABLE)
        ]
        for k in range(rounds)
    ]
    taken: list[list[Any]] = [[] for _ in job.ranks]
    scope = memo.share_values() if mode == "shared" else contextlib.nullcontext()
    with scope:
        t0 = time.perf_counter()
        for answer in answers:
            for raw in answer:
                for j, sample in wire.samples_from_proto(pb.SampleResponse.FromString(raw)).items():
                    taken[j].append(sample)
        decode = time.perf_counter() - t0
        ranks_taken = tuple(RankSnapshot(r.process, tuple(s)) for r, s in zip(job.ranks, taken, strict=True))
        snapshot = dataclasses.replace(job, ranks=ranks_taken)
    del job, answers, taken, ranks_taken
    threads = [th for r in snapshot.ranks for s in r.samples for th in s.threads]
    t0 = time.perf_counter()
    diagnosis = analyse(snapshot)
    analysis = time.perf_counter() - t0
    t0 = time.perf_counter()
    data = snapshot_bytes(snapshot, compress=True)
    save = time.perf_counter() - t0
    verdict, culprits = expected(ranks, SCENARIO)
    if diagnosis.verdict is not verdict or diagnosis.culprit_ranks != culprits:
        raise SystemExit(f"bench_decoded: {mode} at {ranks:,}: {diagnosis.verdict.value} {diagnosis.culprit_ranks}")
    return {
        "decode_s": decode,
        "analysis_s": analysis,
        "save_s": save,
        "stacks": len({id(th.frames) for th in threads}),
        "threads": len({id(th) for th in threads}),
        "thread_uses": len(threads),
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def _run(ranks: int, mode: str) -> dict[str, Any]:
    code = f"import json, sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); from bench_decoded import worker; "
    code += f"print(json.dumps(worker({ranks}, {mode!r})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench_decoded: {mode} at {ranks:,} ranks failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| ranks | values | decode, 3 rounds | stacks | threads (of uses) | analysis | save | peak memory |",
        "|---:|:---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        for mode in MODES:
            r = row[mode]
            lines.append(
                f"| {row['ranks']:,} | {mode} | {r['decode_s']:.2f} s | {r['stacks']:,} | "
                f"{r['threads']:,} ({r['thread_uses']:,}) | {r['analysis_s']:.2f} s | {r['save_s']:.2f} s | "
                f"{r['peak_mb']:,.0f} MB |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--write", type=Path, help="replace this benchmark's section of the file")
    args = parser.parse_args(argv)
    rows = []
    for ranks in (int(s) for s in args.sizes.split(",")):
        print(f"{ranks:,} ranks ...", file=sys.stderr, flush=True)
        row: dict[str, Any] = {"ranks": ranks, **{mode: _run(ranks, mode) for mode in MODES}}
        if len({row[mode]["sha256"] for mode in MODES}) != 1:
            raise SystemExit(f"bench_decoded: at {ranks:,} ranks the two modes wrote different bytes")
        rows.append(row)
    table = _table(rows)
    print(table)
    if args.write:
        sys.path.insert(0, str(ROOT / "bench"))
        from docs_section import write_section

        text = (
            f"{HEADING}\n\n"
            "What a diagnosis analyses and saves is the snapshot the coordinator decoded from its "
            f"agents' answers. Here each answer is one relay's table of {PER_TABLE} ranks in one round, "
            "decoded with the values of the capture shared (`memo.share_values`, as `observe()` runs) "
            "and separate (before it); gRPC left out. Every verdict and culprit was right and both "
            "modes wrote the same bundle bytes. "
            f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} cores.\n\n"
            f"Command: `python bench/bench_decoded.py --sizes {args.sizes}`\n\n{table}\n"
        )
        write_section(args.write, HEADING, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
