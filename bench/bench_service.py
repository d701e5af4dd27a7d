"""What `hangdoc server` costs (issue 28): on a node, and on the server.

**On a node**, an agent started with ``--server`` takes one look per report interval
(``hangdoc.fleet.jobwatch``): it reads the process table, and samples each rank once with
py-spy. ``--ranks N`` rank processes are started (real Python processes with torch imported,
a 40-frame stack and 4 threads, the rendezvous variables in their environment), and
``--looks`` looks are timed: wall time per look, CPU time of the agent and its py-spy
children per look and per rank, and the longest pause of one rank (one py-spy dump).

**On the server**, ``--reports`` agent reports (``POST /api/agents/report``, each a node
of 8 ranks) are sent to a real server over HTTP from 8 threads, and one check tick over
those reports is timed: the server's CPU per report and per tick.

With ``--write FILE`` the section goes into ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hangdoc.fleet import jobreport
from hangdoc.fleet.jobwatch import JobWatch, NodeJobs, WatchedJob, WatchedRank

HEADING = "## The service: what watching every job costs (issue 28)"
RANK = """
import threading, time
import torch  # noqa: F401  (a rank's interpreter holds torch)
def deep(n):
    if n == 0:
        time.sleep(3600)
    deep(n - 1)
for _ in range(3):
    threading.Thread(target=lambda: time.sleep(3600), daemon=True).start()
deep(40)
"""


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def node_cost(ranks: int, looks: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "MASTER_ADDR", "MASTER_PORT")}
    procs = []
    for rank in range(ranks):
        env_rank = dict(env, MASTER_ADDR="10.250.0.1", MASTER_PORT="29999", RANK=str(rank), WORLD_SIZE=str(ranks))
        procs.append(subprocess.Popen([sys.executable, "-c", RANK], env=env_rank))
    try:
        time.sleep(8.0)  # torch imported everywhere
        watch = JobWatch("bench")
        watch.look()  # the first look pays for imports
        walls, cpus = [], []
        for _ in range(looks):
            c0, t0 = _cpu(), time.monotonic()
            node = watch.look()
            walls.append(time.monotonic() - t0)
            cpus.append(_cpu() - c0)
            seen = sum(len(j.ranks) for j in node.jobs if j.job == "10.250.0.1:29999")
            assert seen == ranks, f"the look saw {seen} of {ranks} ranks"
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return {
        "wall": statistics.median(walls),
        "cpu": statistics.median(cpus),
        "cpu_per_rank": statistics.median(cpus) / ranks,
        "wall_max": max(walls),
    }


def server_cost(reports: int) -> dict[str, float]:
    from hangdoc.service.api import make_http_server
    from hangdoc.service.loop import HangService, ServiceConfig
    from hangdoc.service.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(str(Path(tmp) / "bench.db"))
        service = HangService(ServiceConfig(stall_after=600.0, check_interval=30.0), store)
        http = make_http_server("127.0.0.1:0", service, None, None)
        threading.Thread(target=http.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{http.server_address[1]}/api/agents/report"
        bodies = [
            jobreport.to_json(
                NodeJobs(
                    f"node{i}",
                    (
                        WatchedJob(
                            f"10.0.{i // 250}.1:29500",
                            8 * reports,
                            tuple(WatchedRank(100 + r, 8 * i + r, 12.5) for r in range(8)),
                        ),
                    ),
                ),
                7420,
                f"10.1.{i // 250}.{i % 250}:7420",
            )
            for i in range(reports)
        ]

        def post(chunk: list[bytes]) -> None:
            for body in chunk:
                req = urllib.request.Request(url, data=body, method="POST")
                with urllib.request.urlopen(req, timeout=30) as r:
                    r.read()

        c0 = time.process_time()
        t0 = time.monotonic()
        threads = [threading.Thread(target=post, args=(bodies[i::8],)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        c1 = time.process_time()
        service.tick()
        tick = time.process_time() - c1
        posted = time.process_time() - c0 - tick  # this process is both client and server
        jobs = len(service.jobs())
        http.shutdown()
        http.server_close()
        service.stop(1.0)
        store.close()
    return {"reports": reports, "wall": wall, "cpu_per_report_both": posted / reports, "tick": tick, "jobs": jobs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--looks", type=int, default=10)
    parser.add_argument("--reports", type=int, default=2000)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    node = node_cost(args.ranks, args.looks)
    server = server_cost(args.reports)
    interval = 30.0
    command = f"python bench/bench_service.py --ranks {args.ranks} --looks {args.looks} --reports {args.reports}"
    text = f"""{HEADING}

`{command} --write docs/benchmarks.md`
({datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; the
machine is shared, so read the figures as orders of magnitude)

**On a node** (an agent started with `--server`): one look at {args.ranks} ranks (torch imported, 4
threads, a 40-frame stack each) reads the process table and samples each rank once.

| per look | median of {args.looks} |
|---|---|
| wall time | {node["wall"] * 1000:.0f} ms (longest {node["wall_max"] * 1000:.0f} ms) |
| CPU (agent + py-spy) | {node["cpu"] * 1000:.0f} ms, {node["cpu_per_rank"] * 1000:.1f} ms/rank |
| share of one core at the default 30 s interval | {node["cpu"] / interval * 100:.2f} % |

Each rank is paused once per look, for one py-spy dump (a look samples its ranks side by
side, one py-spy process each, at most 256 ranks per look).

**On the server**: {server["reports"]} reports of 8 ranks each, posted from 8 threads of the
same process: {server["wall"]:.2f} s in all, {server["cpu_per_report_both"] * 1000:.2f} ms of CPU per report
(client and server together); one check tick over the {server["jobs"]} jobs they make:
{server["tick"] * 1000:.0f} ms of CPU. At the default 30 s interval, 2,000 nodes cost the server
about {server["cpu_per_report_both"] * 2000 / interval * 100:.0f} % of one core.
"""
    print(text)
    if args.write:
        sys.path.insert(0, str(ROOT / "bench"))
        from docs_section import write_section

        write_section(args.write, HEADING, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
