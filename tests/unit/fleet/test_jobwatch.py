"""The agent's look at its node's jobs (``jobwatch``), over real processes: ranks grouped by
rendezvous, a rank that stays put grows still, one that moves does not, a caller sees only
the ranks it may read, and the look travels (JSON to the server, protobuf to a poll) intact."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from hangdoc.errors import UsageError
from hangdoc.fleet import jobreport, wire
from hangdoc.fleet.agent import AgentConfig, AgentService
from hangdoc.fleet.callers import Caller
from hangdoc.fleet.jobwatch import JobWatch, NodeJobs, WatchedJob, WatchedRank

pytestmark = [pytest.mark.timeout(90)]

STILL = "import time\nwhile True:\n    time.sleep(3600)\n"
# in one of two functions, chosen at random for a random while: two samples differ half the time
MOVING = (
    "import random, time\n"
    "def a():\n    time.sleep(random.random() / 50)\n"
    "def b():\n    time.sleep(random.random() / 50)\n"
    "while True:\n    random.choice((a, b))()\n"
)


def _rank(code: str, port: int, rank: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update({"MASTER_ADDR": "10.9.8.7", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": "2"})
    return subprocess.Popen([sys.executable, "-c", code], env=env)


@pytest.fixture
def two_jobs() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [_rank(STILL, 39401, 0), _rank(STILL, 39401, 1), _rank(MOVING, 39402, 0), _rank(MOVING, 39402, 1)]
    try:
        time.sleep(1.0)  # each interpreter started and in its loop
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _mine(node: NodeJobs) -> dict[str, WatchedJob]:
    return {j.job: j for j in node.jobs if j.job.startswith("10.9.8.7:")}


def test_still_ranks_grow_still_and_moving_ones_do_not(two_jobs: list[subprocess.Popen[bytes]]) -> None:
    watch = JobWatch("here")
    first = _mine(watch.look())
    assert sorted(first) == ["10.9.8.7:39401", "10.9.8.7:39402"]
    assert [(r.pid, r.rank) for r in first["10.9.8.7:39401"].ranks] == [(two_jobs[0].pid, 0), (two_jobs[1].pid, 1)]
    assert first["10.9.8.7:39401"].world_size == 2
    assert all(r.still_seconds == 0.0 for j in first.values() for r in j.ranks)  # first seen now
    stills: list[float] = []
    moved = 0
    for _ in range(7):
        time.sleep(0.2)
        now = _mine(watch.look())
        stills.append(min(r.still_seconds for r in now["10.9.8.7:39401"].ranks))
        moved += sum(r.still_seconds == 0.0 for r in now["10.9.8.7:39402"].ranks)
    assert stills == sorted(stills) and stills[-1] >= 1.0
    assert moved >= 1  # of 14 looks at the moving ranks, each with an even chance of a move


def test_a_caller_sees_only_the_ranks_it_may_read(two_jobs: list[subprocess.Popen[bytes]]) -> None:
    class OnlyOne(Caller):
        def __init__(self) -> None:
            super().__init__(operator=False, uid=12345, how="test")

        def may_read(self, pid: int) -> bool:
            return pid == two_jobs[0].pid

    service = AgentService(AgentConfig(listen="127.0.0.1:0"))
    seen = _mine(service._jobs(OnlyOne()))
    assert list(seen) == ["10.9.8.7:39401"] and [r.pid for r in seen["10.9.8.7:39401"].ranks] == [two_jobs[0].pid]


def test_a_look_travels_intact() -> None:
    node = NodeJobs("node-a", (WatchedJob("h:1", 4, (WatchedRank(11, 0, 1.5), WatchedRank(12, None, 0.0))),), 2)
    assert jobreport.from_json(jobreport.to_json(node, 7420)) == (node, 7420, None)
    assert jobreport.from_json(jobreport.to_json(node, 7420, "10.0.0.5:7420"))[2] == "10.0.0.5:7420"
    assert wire.node_jobs_from_proto(wire.node_jobs_to_proto(node)) == node


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"host": "n", "port": 0, "jobs": []}',
        b'{"host": "", "port": 1, "jobs": []}',
        b'{"host": "n", "port": 1, "jobs": {}}',
        b'{"host": "n", "port": 1, "jobs": [{"job": "j", "ranks": [{"pid": -1, "still_seconds": 1}]}]}',
        b'{"host": "n", "port": 1, "jobs": [{"job": "j", "ranks": [{"pid": 5, "still_seconds": NaN}]}]}',
        b'{"host": "n\\u0000", "port": 1, "jobs": []}',
        b'{"host": "n", "port": 1, "jobs": [' + b",".join([b'{"job": "j", "ranks": []}'] * 1025) + b"]}",
        b" " * (jobreport.MAX_REPORT_BYTES + 1),
    ],
)
def test_a_bad_report_is_one_line(body: bytes) -> None:
    with pytest.raises(UsageError) as err:
        jobreport.from_json(body)
    assert "\n" not in str(err.value)
