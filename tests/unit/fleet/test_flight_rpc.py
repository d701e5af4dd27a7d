"""The agent's ``Flight`` call: what each found rank's probe tells crosses the wire unchanged
(the flight recorder dump in torch's JSON shape, parsed again as data on the coordinator's
side; the heartbeat; the live exceptions; whether there was a probe at all); pids the agent
did not find are left out; a bad timeout is refused. Served by a replaying agent and by a
real agent asking a real process's probe."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.factories import make_snapshot
from support.harness import free_port
from support.probes import remove_probe_files

from hangdoc.bundle import save_snapshot
from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.capture.read.flight_recorder import flight_record_to_json, read_flight_record
from hangdoc.fleet.agent import AgentConfig, serve_in_thread
from hangdoc.fleet.client import AgentAuth, RemoteNode
from hangdoc.fleet.v1 import agent_pb2 as pb
from hangdoc.model import (
    FlightEntry,
    FlightGroup,
    FlightRecord,
    Frame,
    Heartbeat,
    ProbeAnswer,
    ProbeStatus,
    ThreadException,
)

TOKEN = "0123456789abcdef0123456789abcdef"
pytestmark = [pytest.mark.timeout(60)]
STACK = ["train.py:main:10", "torch/distributed/distributed_c10d.py:all_reduce:2800"]
RECORD = FlightRecord(
    entries=(
        FlightEntry(
            "0",
            7,
            "all_reduce",
            ((1000,),),
            ("Float",),
            ((1000,),),
            ("Float",),
            group_desc="default_pg",
            state="scheduled",
            retired=True,
        ),
        FlightEntry("0", 8, "broadcast", ((1,),), ("Float",), group_desc="default_pg", state="scheduled"),
    ),
    groups=(FlightGroup("0", "default_pg", (0, 1)),),
    version="2.10",
)


def test_a_record_survives_torch_s_json_shape() -> None:
    assert read_flight_record(flight_record_to_json(RECORD).encode()) == RECORD


def test_the_flight_call_hands_over_found_ranks_answers_only(tmp_path: Path) -> None:
    snap = make_snapshot({0: STACK, 1: STACK})
    raised = Frame("step", "/job/train.py", 40)
    told = dataclasses.replace(
        snap.ranks[0],
        flight=RECORD,
        heartbeat=Heartbeat(snap.ranks[0].process.pid, 3, 7, True, 2.5),
        exceptions=(ThreadException(2**64 - 1, None, "RuntimeError", raised),),
    )
    snap = dataclasses.replace(snap, ranks=(told, snap.ranks[1]))
    saved = tmp_path / "snap.json"
    save_snapshot(snap, saved)
    agent = serve_in_thread(AgentConfig(listen="127.0.0.1:0", token=TOKEN, replay=str(saved)))
    node = RemoteNode(f"127.0.0.1:{agent.port}", AgentAuth(token=TOKEN))
    try:
        assert "probe-state" in node.info().features
        pids = [r.pid for r in node.find_ranks(parse_job_spec("127.0.0.1:29500")).ranks]
        got = node.probe([*pids, 999_999], 2.0)
        assert got[pids[0]] == ProbeAnswer(
            ProbeStatus.ANSWERED,
            "",
            dataclasses.replace(RECORD, source=f"probe via 127.0.0.1:{agent.port}"),
            told.heartbeat,
            told.exceptions,
        )
        assert got[pids[1]] == ProbeAnswer(ProbeStatus.NO_PROBE, "no probe answer in the snapshot")
        assert 999_999 not in got  # not found by this agent: never asked
        with pytest.raises(Exception, match="timeout_seconds"):
            node._call(node._stub.Flight, pb.FlightRequest(pids=pids, timeout_seconds=float("inf")), 5.0)
    finally:
        node.close()
        agent.stop()
    assert json.loads(flight_record_to_json(RECORD))["entries"][1]["collective_seq_id"] == 8


def test_an_agent_before_probe_state_still_reads() -> None:
    node = RemoteNode("127.0.0.1:1")
    try:
        old_dump = node._probe_answer(pb.RankFlight(pid=5, dump=flight_record_to_json(RECORD)))
        old_none = node._probe_answer(pb.RankFlight(pid=6, reason="no hangdoc probe"))
    finally:
        node.close()
    assert old_dump.status is ProbeStatus.ANSWERED and old_dump.flight is not None
    assert (old_none.status, old_none.reason) == (ProbeStatus.NO_PROBE, "no hangdoc probe")


RANK = textwrap.dedent("""\
    import os, threading, time
    import hangdoc

    hangdoc.heartbeat(12)
    try:
        raise TimeoutError("SECRET: the store at 10.0.0.7 did not answer")
    except TimeoutError:
        print(os.getpid(), threading.get_ident(), flush=True)
        time.sleep(60)
""")


def test_a_real_agent_carries_a_real_probe_s_answer(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGDOC_") and k != "PYTHONPATH"}
    env.update(
        HANGDOC_PROBE="1",
        HANGDOC_HEARTBEAT_DIR=str(tmp_path / "beats"),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK="0",
        WORLD_SIZE="1",
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    agent = serve_in_thread(AgentConfig(listen="127.0.0.1:0", token=TOKEN))
    node = RemoteNode(f"127.0.0.1:{agent.port}", AgentAuth(token=TOKEN))
    try:
        assert proc.stdout is not None
        pid, thread_id = map(int, proc.stdout.readline().split())
        assert [r.pid for r in node.find_ranks(parse_job_spec(f"127.0.0.1:{port}")).ranks] == [pid]
        got = node.probe([pid], 3.0)[pid]
        beats = node.heartbeats([pid])
        wire = node._call(node._stub.Flight, pb.FlightRequest(pids=[pid], timeout_seconds=3.0), 10.0)
    finally:
        node.close()
        agent.stop()
        proc.kill()
        proc.wait()
        proc.stdout.close()
        remove_probe_files([proc.pid])  # SIGKILL runs no atexit
    assert got.status is ProbeStatus.ANSWERED and got.flight is None
    assert got.reason == "its probe says: torch.distributed is not initialised in this process"
    assert got.exceptions == (
        ThreadException(thread_id, "MainThread", "TimeoutError", Frame("<module>", str(script), 6)),
    )
    assert got.heartbeat is not None and (got.heartbeat.pid, got.heartbeat.step, got.heartbeat.beats) == (pid, 12, 1)
    assert beats[pid].step == 12
    assert b"SECRET" not in wire.SerializeToString() and b"10.0.0.7" not in wire.SerializeToString()
