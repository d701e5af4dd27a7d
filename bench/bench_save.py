"""Saving a bundle: ``save_snapshot`` of synthetic jobs, this tree against another revision.

For each size, a process of each revision builds the same synthetic snapshot
(``bench/synthetic.py``, ``collective_mismatch``), then saves it ``--repeat`` times as
``hangdoc diagnose --save`` does (version 2, gzip) and reports its fastest save, its peak
memory and the sha256 of the bytes. The two revisions' processes alternate, so drift on a
shared machine falls on both; the bytes must be equal (the run fails where they are not),
so the ratio is of the same work.

Usage: ``python bench/bench_save.py [--sizes 10000,100000] [--repeat 3] [--against REV]
[--write docs/benchmarks.md]``. ``--against`` (a git revision) is checked out in a
temporary worktree; without it, only this tree is timed.
"""

from __future__ import annotations

import argparse
import hashlib
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
HEADING = "## Saving a bundle (issue 30)"
SCENARIO = "collective_mismatch"


def worker(ranks: int, repeat: int, out: str) -> dict[str, Any]:
    """In a process of its own, with this revision's hangdoc first on the path."""
    from synthetic import synthetic_snapshot

    from hangdoc.bundle import save_snapshot

    snapshot = synthetic_snapshot(ranks, SCENARIO)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        save_snapshot(snapshot, out)
        times.append(time.perf_counter() - t0)
    data = Path(out).read_bytes()
    os.unlink(out)
    return {
        "save_s": min(times),
        "all_s": times,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def _run(tree: Path, ranks: int, repeat: int, tmp: Path) -> dict[str, Any]:
    """``worker`` in a fresh interpreter that imports hangdoc from ``tree``."""
    code = (
        "import json, sys\n"
        f"sys.path[:0] = [{str(tree)!r}, {str(tree / 'bench')!r}, {str(ROOT / 'bench')!r}]\n"
        # an editable install's finder would otherwise find this tree's hangdoc first
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
        "from bench_save import worker\n"
        f"print(json.dumps(worker({ranks}, {repeat}, {str(tmp / 'bundle.json.gz')!r})))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench_save: {tree} at {ranks} ranks failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _worktree(rev: str, tmp: Path) -> Path:
    path = tmp / "against"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(path), rev], check=True)
    return path


def _table(rows: list[dict[str, Any]], against: str | None) -> str:
    if against:
        lines = [
            f"| ranks | save, {against} | save, this tree | ratio | peak memory, this tree | bundle | same bytes |",
            "|---:|---:|---:|---:|---:|---:|:---:|",
        ]
        for r in rows:
            old, new = r["against"], r["this"]
            lines.append(
                f"| {r['ranks']:,} | {old['save_s']:.2f} s | {new['save_s']:.2f} s | "
                f"{old['save_s'] / new['save_s']:.2f}x | {new['peak_mb']:,.0f} MB | "
                f"{new['bytes'] / 1e6:.1f} MB | {'yes' if old['sha256'] == new['sha256'] else 'NO'} |"
            )
        return "\n".join(lines)
    lines = ["| ranks | save | peak memory | bundle |", "|---:|---:|---:|---:|"]
    for r in rows:
        new = r["this"]
        lines.append(
            f"| {r['ranks']:,} | {new['save_s']:.2f} s | {new['peak_mb']:,.0f} MB | {new['bytes'] / 1e6:.1f} MB |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--repeat", type=int, default=3, help="saves per process; the fastest is kept")
    parser.add_argument("--against", help="a git revision to time against (a temporary worktree)")
    parser.add_argument("--write", type=Path, help="replace this benchmark's section of the file")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="hangdoc-bench-save-") as name:
        tmp = Path(name)
        old_tree = _worktree(args.against, tmp) if args.against else None
        try:
            for ranks in sizes:
                print(f"{ranks:,} ranks ...", file=sys.stderr, flush=True)
                row: dict[str, Any] = {"ranks": ranks}
                if old_tree is not None:
                    row["against"] = _run(old_tree, ranks, args.repeat, tmp)
                row["this"] = _run(ROOT, ranks, args.repeat, tmp)
                if old_tree is not None and row["against"]["sha256"] != row["this"]["sha256"]:
                    raise SystemExit(f"bench_save: at {ranks:,} ranks the two revisions wrote different bytes")
                rows.append(row)
        finally:
            if old_tree is not None:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)], check=False)
    table = _table(rows, args.against)
    print(table)
    if args.write:
        sys.path.insert(0, str(ROOT / "bench"))
        from docs_section import write_section

        command = "python bench/bench_save.py --sizes " + args.sizes + f" --repeat {args.repeat}"
        if args.against:
            command += f" --against {args.against}"
        text = (
            f"{HEADING}\n\n"
            "`save_snapshot` of a synthetic job (`bench/synthetic.py`, collective_mismatch), as "
            "`hangdoc diagnose --save` writes it (format 2, gzip); the fastest of "
            f"{args.repeat} saves in one process, the snapshot built before. "
            f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} cores.\n\n"
            f"Command: `{command}`\n\n{table}\n"
        )
        write_section(args.write, HEADING, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
