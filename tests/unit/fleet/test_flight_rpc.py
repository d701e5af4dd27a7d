"""The agent's ``Flight`` call: each found rank's flight recorder dump crosses the wire
unchanged (torch's JSON shape, parsed again as data on the coordinator's side); pids the
agent did not find are left out; a bad timeout is refused."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from support.factories import make_snapshot

from hangdoc.bundle import save_snapshot
from hangdoc.capture.flight_recorder import flight_record_to_json, read_flight_record
from hangdoc.capture.jobspec import parse_job_spec
from hangdoc.fleet.agent import AgentConfig, serve_in_thread
from hangdoc.fleet.client import AgentAuth, RemoteNode
from hangdoc.fleet.v1 import agent_pb2 as pb
from hangdoc.model import FlightEntry, FlightGroup, FlightRecord

TOKEN = "0123456789abcdef0123456789abcdef"
pytestmark = [pytest.mark.timeout(60)]
STACK = ["train.py:main:10", "torch/distributed/distributed_c10d.py:all_reduce:2800"]
RECORD = FlightRecord(
    entries=(FlightEntry("0", 7, "all_reduce", ((1000,),), ("Float",), ((1000,),), ("Float",), group_desc="default_pg",
                         state="scheduled", retired=True),
             FlightEntry("0", 8, "broadcast", ((1,),), ("Float",), group_desc="default_pg", state="scheduled")),
    groups=(FlightGroup("0", "default_pg", (0, 1)),), version="2.10")


def test_a_record_survives_torch_s_json_shape() -> None:
    assert read_flight_record(flight_record_to_json(RECORD).encode()) == RECORD


def test_the_flight_call_hands_over_found_ranks_dumps_only(tmp_path: Path) -> None:
    snap = make_snapshot({0: STACK, 1: STACK})
    snap = dataclasses.replace(snap, ranks=(dataclasses.replace(snap.ranks[0], flight=RECORD), snap.ranks[1]))
    saved = tmp_path / "snap.json"
    save_snapshot(snap, saved)
    agent = serve_in_thread(AgentConfig(listen="127.0.0.1:0", token=TOKEN, replay=str(saved)))
    node = RemoteNode(f"127.0.0.1:{agent.port}", AgentAuth(token=TOKEN))
    try:
        pids = [r.pid for r in node.find_ranks(parse_job_spec("127.0.0.1:29500")).ranks]
        got = node.flight([*pids, 999_999], 2.0)
        assert got[pids[0]] == (dataclasses.replace(RECORD, source=f"probe via 127.0.0.1:{agent.port}"), "")
        assert got[pids[1]] == (None, "no hangdoc probe dump in the snapshot")
        assert 999_999 not in got  # not found by this agent: never asked
        with pytest.raises(Exception, match="timeout_seconds"):
            node._call(node._stub.Flight, pb.FlightRequest(pids=pids, timeout_seconds=float("inf")), 5.0)
    finally:
        node.close()
        agent.stop()
    assert json.loads(flight_record_to_json(RECORD))["entries"][1]["collective_seq_id"] == 8
