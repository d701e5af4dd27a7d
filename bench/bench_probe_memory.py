"""What reading one hostile probe answer costs the reader (issue 23, item 2).

A real process serves the probe's socket protocol with an attacker's answer
(``tests/support/fake_probe.py``); a fresh reader process asks it through the real client
(``probe_state``) and reports its peak resident memory (``ru_maxrss``) above what it held
before asking, how long the answer took, and what the client said. Usage:
``python bench/bench_probe_memory.py [--size 64000000] [--answers entries,exceptions,...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "support" / "fake_probe.py"
READER = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
from hangdoc.capture.read.probe_client import probe_state
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.monotonic()
answer = probe_state(int(sys.argv[1]), timeout=60.0)
took = time.monotonic() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"added_mb": (peak - before) / 1024, "seconds": round(took, 2),
                  "status": answer.status.value, "reason": answer.reason[:160]}))
"""


def measure(kind: str, size: int, directory: str, items: int = 0) -> dict[str, object]:
    server = subprocess.Popen(
        [sys.executable, str(FAKE), "--dir", directory, "--answer", kind, "--size", str(size), "--items", str(items)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()
        done = subprocess.run(
            [sys.executable, "-c", READER, str(server.pid), str(ROOT)],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        return {"answer": kind, "bytes": size, "items": items, **json.loads(done.stdout)}
    finally:
        server.kill()
        server.wait()
        Path(directory, f"{server.pid}.sock").unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=64_000_000)
    parser.add_argument(
        "--answers", default="entries,numbers,dump-lists,dump-strings,exceptions,lists,strings,astral,quiet"
    )
    parser.add_argument("--items", type=int, default=0, help="a dump's items, the rest of --size padding")
    parser.add_argument("--dir", help="where the fake probe listens (default: a fresh private directory)")
    args = parser.parse_args()
    directory = args.dir or tempfile.mkdtemp(prefix=f"hangdoc-probe-{os.geteuid()}-")
    try:
        for kind in args.answers.split(","):
            print(json.dumps(measure(kind, args.size, directory, args.items)), flush=True)
    finally:
        if not args.dir:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
