"""GPU state and NCCL's RAS report across nodes: the agent's ``Devices`` call over real gRPC
(a replaying agent serves what a snapshot holds), and the coordinator's gathering: RAS is
asked of one node only, a failing node costs a note, a CPU job on this GPU-less machine
gets no note at all."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from support.factories import make_snapshot
from support.paths import TESTS

from hangdoc.bundle import save_snapshot
from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.capture.read.ncclras import read_ras_report
from hangdoc.fleet.agent import AgentConfig, serve_in_thread
from hangdoc.fleet.client import AgentAuth, RemoteNode
from hangdoc.fleet.coordinator import Fleet
from hangdoc.fleet.devices import gather_devices
from hangdoc.fleet.node import LocalNode, NodeDevices
from hangdoc.fleet.v1 import agent_pb2 as pb
from hangdoc.fleet.wire import gpu_state_from_proto, gpu_state_to_proto
from hangdoc.model import GpuState, JobSnapshot, Note, RankProcess

TOKEN = "0123456789abcdef0123456789abcdef"
pytestmark = [pytest.mark.timeout(60)]
AR = ["train.py:main:10", "torch/distributed/distributed_c10d.py:all_reduce:2800"]
REPORT = read_ras_report(
    (TESTS / "data" / "gpu" / "ncclras_2.28.9_dead_rank.json").read_text(), source="ncclras on node0"
)
BUSY = GpuState(
    index=1,
    uuid="GPU-1",
    name="NVIDIA H100",
    utilization_percent=100,
    memory_used_bytes=2**34,
    memory_total_bytes=80 * 2**30,
    process_memory_bytes=2**33,
    xids=(79,),
    ecc_uncorrected=0,
    matched_by="pid 12 in its namespace",
)


def test_every_gpu_state_field_has_a_message_field() -> None:
    assert {f.name for f in dataclasses.fields(GpuState)} == set(pb.GpuState.DESCRIPTOR.fields_by_name)


def test_gpu_state_crosses_the_wire_exactly() -> None:
    for state in (BUSY, GpuState(index=0, uuid="", lost=True)):
        assert gpu_state_from_proto(gpu_state_to_proto(state)) == state
    odd = pb.GpuState(index=0, uuid="GPU-0", utilization_percent=300, memory_used_bytes=-5)
    assert gpu_state_from_proto(odd) == GpuState(index=0, uuid="GPU-0", matched_by="")


def _replayed(tmp_path: Path) -> JobSnapshot:
    snap = make_snapshot({0: AR, 1: AR})
    snap = dataclasses.replace(
        snap, ras=REPORT, ranks=(snap.ranks[0], dataclasses.replace(snap.ranks[1], gpus=(BUSY,)))
    )
    save_snapshot(snap, tmp_path / "snap.json")
    return snap


def test_the_devices_call_hands_over_found_ranks_gpus_and_ras(tmp_path: Path) -> None:
    _replayed(tmp_path)
    agent = serve_in_thread(AgentConfig(listen="127.0.0.1:0", token=TOKEN, replay=str(tmp_path / "snap.json")))
    node = RemoteNode(f"127.0.0.1:{agent.port}", AgentAuth(token=TOKEN))
    try:
        assert "devices" in node.info().features
        pids = [r.pid for r in node.find_ranks(parse_job_spec("127.0.0.1:29500")).ranks]
        got = node.devices([*pids, 999_999], listen=0.0, timeout=2.0, ras=True)
        assert got.gpus == {pids[1]: (BUSY,)}  # rank 0 on no GPU; 999999 not found: never asked
        assert got.ras is not None
        assert got.ras.communicators == REPORT.communicators
        assert got.ras.source.startswith(f"ncclras via 127.0.0.1:{agent.port}; ncclras on node0")
        assert node.devices(pids, listen=0.0, timeout=2.0, ras=False).ras is None
        with pytest.raises(Exception, match="listen_seconds"):
            node._call(node._stub.Devices, pb.DevicesRequest(pids=pids, listen_seconds=11, timeout_seconds=1), 5.0)
        with pytest.raises(Exception, match="timeout_seconds"):
            node._call(node._stub.Devices, pb.DevicesRequest(pids=pids, timeout_seconds=float("nan")), 5.0)
    finally:
        node.close()
        agent.stop()


def test_an_agent_that_does_not_answer_costs_a_reason_not_the_diagnosis() -> None:
    node = RemoteNode("127.0.0.1:9", connect_timeout=0.5)  # nothing listens on the discard port
    try:
        got = node.devices([1], listen=0.0, timeout=0.5, ras=True)
    finally:
        node.close()
    assert got.gpus == {} and got.ras is None
    assert got.gpu_reason.startswith("its agent gave none: agent 127.0.0.1:9")


def test_a_cpu_job_here_gets_no_gpu_state_and_no_note() -> None:
    me = RankProcess(pid=os.getpid(), host="here", rank=0, world_size=1)
    fleet = Fleet(((LocalNode("here"), me),), 1)
    found = gather_devices(fleet, {0}, listen=0.1, timeout=5.0)
    assert found.gpus == {} and found.ras is None and found.notes == ()
    snap = make_snapshot({0: AR})
    assert found.apply(snap) is snap


class _Node:
    """A node that answers ``devices`` from a table, recording what it was asked."""

    def __init__(self, name: str, answer: NodeDevices | Exception) -> None:
        self.name, self.answer, self.asked = name, answer, []

    def devices(self, pids: Sequence[int], *, listen: float, timeout: float, ras: bool) -> NodeDevices:
        self.asked.append((tuple(pids), ras))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_ras_is_asked_of_the_first_node_only_and_failures_become_notes() -> None:
    a = _Node("a:7420", NodeDevices({10: (BUSY,)}, "", REPORT, ""))
    b = _Node("b:7420", RuntimeError("agent b:7420 unavailable"))
    c = _Node("c:7420", NodeDevices({}, "no NVIDIA driver on this node (libnvidia-ml.so.1 not found)"))
    silent = type("Older", (), {"name": "d:7420"})()  # a node kind that offers no device state
    procs = [RankProcess(pid=10 + r, host="h", rank=r, world_size=5) for r in range(5)]
    fleet = Fleet(((a, procs[0]), (a, procs[1]), (b, procs[2]), (c, procs[3]), (silent, procs[4])), 5)
    found = gather_devices(fleet, {0, 1, 2, 3, 4}, lost={"nowhere"}, listen=0.0, timeout=1.0)
    assert a.asked == [((10, 11), True)] and b.asked == [((12,), False)] and c.asked == [((13,), False)]
    assert found.gpus == {0: (BUSY,)} and found.ras == REPORT
    assert found.notes == (
        Note("GPU state (NVML) of 1 of 5 ranks"),
        Note("GPU state on b:7420: agent b:7420 unavailable"),
        Note("GPU state on c:7420: no NVIDIA driver on this node (libnvidia-ml.so.1 not found)"),
        Note(
            "NCCL RAS report (ncclras on node0; malformed NCCL 2.28 JSON repaired: a missing rank's comma "
            "after nvml_dev): 2 communicators"
        ),
    )
    snap = found.apply(make_snapshot({r: AR for r in range(5)}))
    assert snap.ranks[0].gpus == (BUSY,) and snap.ranks[1].gpus == () and snap.ras == REPORT
    assert snap.notes[-4:] == found.notes


def test_a_lost_node_is_not_asked() -> None:
    a = _Node("a:7420", NodeDevices())
    fleet = Fleet(((a, RankProcess(pid=10, host="h", rank=0)),), 1)
    assert gather_devices(fleet, {0}, lost={"a:7420"}).notes == () and a.asked == []
