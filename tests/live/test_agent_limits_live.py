"""A real agent under the two denial-of-service attacks of issue 23 (items 3 and 4).

- Idle connections: more TCP connections than the agent has descriptors, none sending a
  byte. The agent keeps descriptors for its work (a capped number of connections), the
  operator is answered, the idle ones are closed after the handshake timeout, SIGTERM
  stops it.
- Starvation: uid 65534 holds Flight calls on its own ranks, whose probes drip one byte a
  second. Its calls past its quota are refused at once, the operator (root over loopback)
  is answered at once, SIGTERM stops the agent within the grace period, and a second
  signal at once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest
from support.agents import Agent, start_agent
from support.attack import DripRanks, drip_ranks, flight_attack, idle_connections, open_count
from support.harness import free_port

from hangdoc.fleet import limits
from hangdoc.fleet.v1 import agent_pb2 as pb
from hangdoc.fleet.v1 import agent_pb2_grpc as pb_grpc

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(
        os.geteuid() != 0 or not (shutil.which("setpriv") and shutil.which("prlimit")),
        reason="needs root, setpriv and prlimit",
    ),
]

TOKEN = "0123456789abcdef0123456789abcdef"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
NOFILE = 256
ATTACK_CALLS = 6


def _stop(agent: Agent, *signals: signal.Signals) -> float:
    """Seconds from the first of ``signals`` (sent 0.1 s apart) until the agent exits."""
    t0 = time.monotonic()
    for i, sig in enumerate(signals):
        if i:
            time.sleep(0.1)
        agent.proc.send_signal(sig)
    try:
        agent.proc.wait(timeout=30)
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()
    return time.monotonic() - t0


def test_idle_connections_cost_no_more_than_their_cap_and_time_out(tmp_path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    agent = start_agent(
        tmp_path, "--listen", "127.0.0.1:0", "--token-file", str(token), wrapper=["prlimit", f"--nofile={NOFILE}", "--"]
    )
    try:
        before = grpc.insecure_channel(agent.address)  # the operator's, opened before the flood
        with before:
            stub = pb_grpc.AgentStub(before)
            stub.GetInfo(pb.GetInfoRequest(), timeout=10, metadata=AUTH)
            with idle_connections(agent.port, NOFILE + 100) as socks:
                assert len(socks) == NOFILE + 100  # the kernel accepted them all ...
                time.sleep(0.5)
                fds = psutil.Process(agent.proc.pid).num_fds()
                assert fds < NOFILE - 64, fds  # ... the agent kept its cap and closed the rest
                assert open_count(socks) <= limits.max_connections(NOFILE)
                t0 = time.monotonic()
                stub.GetInfo(pb.GetInfoRequest(), timeout=5, metadata=AUTH)
                stub.FindRanks(pb.FindRanksRequest(job="pid:1"), timeout=5, metadata=AUTH)
                assert time.monotonic() - t0 < 2
                # a new connection gets in once the handshake timeout has closed the idle ones
                fresh = grpc.insecure_channel(agent.address, options=[("grpc.use_local_subchannel_pool", 1)])
                with fresh:
                    t0 = time.monotonic()
                    pb_grpc.AgentStub(fresh).GetInfo(
                        pb.GetInfoRequest(), timeout=15, metadata=AUTH, wait_for_ready=True
                    )
                    assert time.monotonic() - t0 < limits.HANDSHAKE_TIMEOUT_MS / 1000 + 4
                assert open_count(socks) == 0
                assert _stop(agent, signal.SIGTERM) < 5
        assert agent.proc.returncode == 0
    finally:
        agent.close()


@pytest.fixture(scope="module")
def ranks() -> Iterator[DripRanks]:
    """Four "ranks" of nobody whose probes drip one byte a second (in a directory nobody
    can reach: pytest's own are root's alone)."""
    work = Path(tempfile.mkdtemp(prefix="hdlim-"))
    work.chmod(0o755)
    try:
        with drip_ranks(work / "ranks", 4, free_port()) as found:
            yield found
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _attack(agent: Agent, ranks: DripRanks) -> tuple[subprocess.Popen, list[dict]]:
    """nobody's Flight calls, held; returns once those past its quota were answered."""
    attacker = flight_attack(ranks.work, agent.address, ranks.job, ATTACK_CALLS, 30.0)
    assert attacker.stdout is not None
    lines: list[dict] = []
    deadline = time.monotonic() + 20
    while sum(x.get("code") == "RESOURCE_EXHAUSTED" for x in lines) < ATTACK_CALLS - limits.REQUESTS_PER_USER:
        assert time.monotonic() < deadline, lines
        line = attacker.stdout.readline()
        assert line, attacker.stderr.read() if attacker.stderr else ""
        lines.append(json.loads(line))
    return attacker, lines


def _end(attacker: subprocess.Popen) -> None:
    try:
        os.killpg(attacker.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    attacker.communicate(timeout=10)


def test_a_user_with_dripping_probes_starves_nobody(tmp_path, ranks) -> None:
    agent = start_agent(tmp_path, "--listen", "127.0.0.1:0")
    attacker = None
    try:
        idle_threads = psutil.Process(agent.proc.pid).num_threads()
        attacker, lines = _attack(agent, ranks)
        assert len(lines[0]["pids"]) == 4  # it found its own ranks
        refused = [x for x in lines if x.get("code") == "RESOURCE_EXHAUSTED"]
        assert all(x["s"] < 1 and "requests of this user are already in flight" in x["detail"] for x in refused)
        time.sleep(1)  # its two calls are reading its probes now
        with grpc.insecure_channel(agent.address) as channel:
            stub = pb_grpc.AgentStub(channel)
            for _ in range(3):
                t0 = time.monotonic()
                found = stub.FindRanks(pb.FindRanksRequest(job=ranks.job), timeout=10)
                assert time.monotonic() - t0 < 2
            assert len(found.ranks) == 4
        threads = psutil.Process(agent.proc.pid).num_threads() - idle_threads
        # the attacker's request and probe threads, and one of the operator's
        assert threads <= limits.REQUESTS_PER_USER + limits.PROBE_READS_PER_USER + 1, threads
        assert _stop(agent, signal.SIGTERM) < limits.STOP_GRACE_S + 3
        log = "".join(p.read_text() for p in tmp_path.glob("agent-*.log"))
        assert log.count("method=Flight") >= ATTACK_CALLS - limits.REQUESTS_PER_USER
        assert "outcome=refused: " in log
    finally:
        agent.close()
        if attacker is not None:
            _end(attacker)


def test_a_second_signal_stops_the_agent_at_once(tmp_path, ranks) -> None:
    agent = start_agent(tmp_path, "--listen", "127.0.0.1:0")
    attacker = None
    try:
        attacker, _ = _attack(agent, ranks)
        time.sleep(0.5)
        assert _stop(agent, signal.SIGTERM, signal.SIGINT) < 1.5
        assert agent.proc.returncode == 128 + signal.SIGINT
    finally:
        agent.close()
        if attacker is not None:
            _end(attacker)


def test_probe_answers_held_at_once_are_bounded() -> None:
    from hangdoc.capture.read.probe_client import PEAK_ANSWER_BYTES

    assert limits.answer_memory_bound() == (limits.OPERATOR_PROBE_READS + limits.USER_PROBE_READS) * PEAK_ANSWER_BYTES
    assert limits.answer_memory_bound() < 2**30  # the unit's MemoryMax
