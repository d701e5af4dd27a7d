"""``pid:`` of one rank gives the whole job's diagnosis (issue 24, item 2), on real 3-rank
gloo jobs started directly, by torchrun, by ``mp.spawn`` and by a launcher that is itself
rank 0 (``tests/jobs/widen/launcher_rank0.py``).

Every job runs at once; each is diagnosed by its endpoint and then by the pid of its rank 1
(``python -m hangdoc diagnose pid:PID --json``, as a user would), two jobs at a time, and
the jobs are killed before any assertion runs; the tests compare the two reports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pytest
from support.harness import JobMeta, launch, load_meta
from support.jobs import job_meta, ready_pids
from support.paths import REPO, TESTS

LAUNCHER_RANK0 = TESTS / "jobs" / "widen" / "launcher_rank0.py"
DIAGNOSE_TIMEOUT = 90


@dataclass(frozen=True)
class Diagnosed:
    """One job diagnosed by its endpoint and by the pid of its rank 1."""

    port: int
    pids: dict[int, int]  # rank -> pid, as each rank wrote it
    launcher: int
    whole: dict[str, Any]
    by_pid: dict[str, Any]


def _shapes() -> dict[str, JobMeta]:
    return {
        "direct": job_meta("direct", 3),
        "torchrun": job_meta("torchrun", 3),
        "spawn": job_meta("spawn", 3),
        "launcher_rank0": load_meta(LAUNCHER_RANK0),
    }


def _diagnose(spec: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "hangdoc", "diagnose", spec, "--json", "--max-window", "4"]
    result = subprocess.run(
        argv, check=False, capture_output=True, text=True, cwd=REPO, timeout=DIAGNOSE_TIMEOUT, stdin=subprocess.DEVNULL
    )
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(
            f"hangdoc diagnose {spec} exited {result.returncode} without JSON\n--- stderr ---\n{result.stderr[-3000:]}"
        )
    assert isinstance(report, dict)
    return report


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Diagnosed]]:
    found: dict[str, Diagnosed] = {}
    with ExitStack() as stack:  # every job killed, with all its processes, on the way out
        jobs = {
            name: stack.enter_context(launch(meta, tmp_path_factory.mktemp(name))) for name, meta in _shapes().items()
        }
        for job in jobs.values():
            job.wait_ready(150)
        pids = {name: ready_pids(job) for name, job in jobs.items()}

        def both(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
            # one job's two diagnoses one after the other: two py-spys pausing the same ranks
            # at once would look like wake-ups, as if operations completed
            return (_diagnose(f"127.0.0.1:{jobs[name].port}"), _diagnose(f"pid:{pids[name][1]}"))

        with ThreadPoolExecutor(2) as pool:
            reports = dict(zip(jobs, pool.map(both, jobs), strict=False))
        for name, job in jobs.items():
            found[name] = Diagnosed(job.port, pids[name], job.launcher.pid, *reports[name])
    yield found


def _ranks(report: dict[str, Any]) -> list[tuple[int, int]]:
    return sorted((r["rank"], r["pid"]) for r in report["ranks"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shape", ["direct", "torchrun", "spawn", "launcher_rank0"])
def test_the_pid_of_one_rank_gives_the_whole_jobs_verdict(diagnosed: dict[str, Diagnosed], shape: str) -> None:
    job = diagnosed[shape]
    whole, by_pid = job.whole, job.by_pid
    assert _ranks(whole) == _ranks(by_pid) == sorted(job.pids.items())
    assert (by_pid["verdict"], by_pid["culprit_ranks"]) == (whole["verdict"], whole["culprit_ranks"]), (
        whole["summary"],
        by_pid["summary"],
    )
    assert whole["verdict"] != "rank_missing" and whole["world_size"] == by_pid["world_size"] == 3
    said = f"pid {job.pids[1]} is rank 1 of the job at 127.0.0.1:{job.port}; took in its 3 ranks on this node"
    assert said in by_pid["notes"], by_pid["notes"]


@pytest.mark.timeout(300)
def test_a_launcher_that_is_rank_0_is_found(diagnosed: dict[str, Diagnosed]) -> None:
    job = diagnosed["launcher_rank0"]
    for report in (job.whole, job.by_pid):
        ranks = {r["rank"]: r for r in report["ranks"]}
        assert ranks[0]["pid"] == job.launcher  # the launcher itself, not renumbered children
        assert {r["rank_source"] for r in ranks.values()} == {"inferred"}
        assert report["world_size"] == 3  # its children's WORLD_SIZE, not 2 counted
        assert report["verdict"] == "collective_mismatch", report["summary"]
