"""The service with a polled agent (``--agents``), in this process over real gRPC: a real
agent process on loopback, real processes with a rendezvous in their environment, real py-spy. The
agent is asked for its node's jobs at each tick; a job whose ranks stay put past the
timeout is diagnosed through that agent and stored; once its processes are gone, the
incident ends. An agent that does not answer is named, and its last look kept."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hangdoc.pipeline import CaptureOptions
from hangdoc.service.loop import HangService, ServiceConfig
from hangdoc.service.records import IncidentState, JobState
from hangdoc.service.store import Store

pytestmark = [pytest.mark.timeout(120)]

STILL = "import time\ndef wait_for_peer():\n    time.sleep(3600)\nwait_for_peer()\n"
JOB = "10.9.7.5:39511"


@pytest.fixture
def ranks() -> Iterator[list[subprocess.Popen[bytes]]]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", STILL],
            env=dict(env, MASTER_ADDR="10.9.7.5", MASTER_PORT="39511", RANK=str(r), WORLD_SIZE="2"),
        )
        for r in range(2)
    ]
    try:
        time.sleep(0.5)
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _wait(what: str, check, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (got := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(0.2)
    return got


def test_a_polled_agent_is_watched_diagnosed_and_closed(ranks: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    # the agent is a process of its own, as on a node
    agent = subprocess.Popen(
        [sys.executable, "-m", "hangdoc", "agent", "--listen", "127.0.0.1:0", "--node-name", "polled-node"],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert agent.stderr is not None
    port = next(int(line.split()[-1]) for line in agent.stderr if "listening on port" in line)
    threading.Thread(target=agent.stderr.read, daemon=True).start()  # its audit log, read on: the pipe never fills
    store = Store.open(str(tmp_path / "incidents.db"))
    config = ServiceConfig(
        stall_after=2.0,
        check_interval=1.0,  # an agent is stale after 3 s without an answer: under load, a look takes ~1 s
        agents=(f"127.0.0.1:{port}", "127.0.0.1:1"),
        capture=CaptureOptions(window=0.5, interval=0.25, max_window=1.0),
    )
    service = HangService(config, store)
    try:

        def watched():  # type: ignore[no-untyped-def]
            service.tick()
            return [j for j in service.jobs() if j.job == JOB]

        (job,) = _wait("the job watched", watched, 20)
        assert job.state is JobState.RUNNING and job.world_size == 2
        assert [(n.node, n.ranks, n.pids) for n in job.nodes] == [("polled-node", (0, 1), tuple(p.pid for p in ranks))]
        dead = [a for a in service.agents() if a.address == "127.0.0.1:1"][0]
        assert dead.last_report is None and dead.error and not dead.registered

        def stored():  # type: ignore[no-untyped-def]
            service.tick()
            return store.list(job=JOB)

        (incident,) = _wait("an incident", stored)
        assert incident.nodes == ("polled-node",) and incident.state is IncidentState.HUNG
        assert incident.detected_at <= incident.diagnosed_at
        assert '"verdict"' in (store.report_json(incident.id) or "")
        assert (store.bundle(incident.id) or b"")[:2] == b"\x1f\x8b"  # the snapshot, gzip
        _wait("the job hung", lambda: any(j.job == JOB and j.state is JobState.HUNG for j in service.jobs()))
        for _ in range(3):  # still hung: no second diagnosis
            service.tick()
        assert len(store.list(job=JOB)) == 1

        for p in ranks:
            p.kill()
            p.wait()

        def ended():  # type: ignore[no-untyped-def]
            service.tick()
            return store.get(incident.id).state is IncidentState.ENDED  # type: ignore[union-attr]

        _wait("the incident ended", ended)
    finally:
        service.stop(5.0)
        store.close()
        agent.terminate()
        agent.wait(timeout=30)
        agent.stderr.close()
