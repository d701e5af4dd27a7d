"""The agent gRPC API (``hangdoc.fleet``): exact model <-> proto round trips, over the wire.

Every value goes model -> message -> bytes -> message -> model and must come back equal,
so a snapshot merged from agents equals one built locally. Also: recorded snapshots of
real jobs survive the trip, interning keeps a 1000-rank response small, the committed
generated code is what ``make proto`` produces, and the generated service works over a
real gRPC channel.
"""

from __future__ import annotations

import dataclasses
import filecmp
import shutil
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import pytest
from support.factories import make_frame, make_rank, make_snapshot
from support.paths import REPO

from hangdoc.bundle import load_snapshot
from hangdoc.capture.find.discover import Discovery
from hangdoc.capture.find.wholejob import Elsewhere
from hangdoc.fleet import wire
from hangdoc.fleet.v1 import agent_pb2 as pb
from hangdoc.fleet.wire import AgentApiError
from hangdoc.model import (
    CaptureError,
    CaptureErrorKind,
    Frame,
    Note,
    NoteKind,
    ProcessState,
    RankProcess,
    RankSource,
    Sample,
    SourceFile,
    ThreadStack,
    ThreadWait,
    WaitKind,
)

SNAPSHOTS = sorted((REPO / "tests" / "snapshots").glob("*.json.gz"))
GENERATED = ("agent_pb2.py", "agent_pb2.pyi", "agent_pb2_grpc.py")


def over_the_wire(msg):
    """``msg`` serialised and parsed back, as the other end of a channel would see it."""
    return type(msg).FromString(msg.SerializeToString())


def round_trip_samples(samples, discovery=None):
    return wire.samples_from_proto(over_the_wire(wire.samples_to_proto(samples, discovery)))


# ------------------------------------------------------------------ hand-built values


@pytest.mark.parametrize(
    "proc",
    [
        RankProcess(
            pid=10,
            host="node0",
            rank=0,
            rank_source=RankSource.ENV,
            rank_evidence="RANK=0",
            world_size=0,
            local_rank=0,
            launcher_pid=0,
        ),
        RankProcess(pid=11, host="node1", rank=None),
        RankProcess(
            pid=12,
            host="n",
            rank=2,
            rank_source=RankSource.INFERRED,
            rank_evidence="spawn index 2 among the launcher's children",
            world_size=4,
            local_rank=None,
            cmdline=("python", "-c", ""),
            env=(("RANK", "2"), ("A", ""), ("RANK", "dup")),
            launcher_pid=9,
        ),
    ],
    ids=["zeros", "nones", "inferred"],
)
def test_rank_process_round_trip_keeps_none_apart_from_zero(proc):
    msg = over_the_wire(wire.rank_process_to_proto(proc))
    assert wire.rank_process_from_proto(msg) == proc
    assert msg.HasField("rank") is (proc.rank is not None)


def test_discovery_round_trip():
    snap = make_snapshot({0: ["train.py:main:1"], 1: ["train.py:main:2"]}, launcher_pid=5)
    found = Discovery(
        ranks=tuple(r.process for r in snap.ranks),
        world_size=None,
        notes=(Note("rank 3 has no process"), Note("")),
        searched="pid 5 and its descendants",
    )
    assert wire.discovery_from_proto(over_the_wire(wire.discovery_to_proto(found))) == found
    zero = dataclasses.replace(found, world_size=0, ranks=(), notes=())
    assert wire.discovery_from_proto(over_the_wire(wire.discovery_to_proto(zero))) == zero


WORKERS = "not counted as ranks (DataLoader/compile/multiprocessing workers)"
LISTED = "pid 4242 (child of rank 0 (pid 4100)), 4243 (child of rank 0 (pid 4100))"


def test_notes_as_values_round_trip_beside_their_words():
    notes = (
        Note("ranks disagree on the world size: 4, 8"),
        Note(WORKERS, NoteKind.NOT_RANKS, pids=(4242, 4243), listed=LISTED),
        Note("pid 12 is one rank; to see the whole job name it by 127.0.0.1:29500", NoteKind.WIDENED),
        Note("rank 1 is claimed by 2 processes (pids 80, 83)", NoteKind.RANK_CLAIMED, pids=(80, 83)),
    )
    found = Discovery(ranks=(), world_size=4, notes=notes, searched="x")
    msg = over_the_wire(wire.discovery_to_proto(found))
    back = wire.discovery_from_proto(msg)
    assert back == found and back.notes == notes
    assert back.notes[1].kind is NoteKind.NOT_RANKS and back.notes[1].pids == (4242, 4243)
    assert list(msg.notes) == [n.words() for n in notes]  # what a coordinator before values reads
    assert msg.notes[1] == f"{WORKERS}: {LISTED}"
    assert [(n.kind, list(n.pids), n.listed) for n in msg.noted][1] == ("not_ranks", [4242, 4243], LISTED)


def test_an_older_agent_s_notes_of_words_alone_are_notes_of_those_words():
    old = pb.Discovery(notes=["ranks disagree on the world size: 4, 8", f"{WORKERS}: {LISTED}"], searched="x")
    found = wire.discovery_from_proto(over_the_wire(old))
    assert found.notes == (Note("ranks disagree on the world size: 4, 8"), Note(f"{WORKERS}: {LISTED}"))
    assert all(n.kind is NoteKind.OTHER and n.pids == () and n.listed == "" for n in found.notes)


def test_a_newer_agent_s_kind_is_other_and_impossible_pids_are_left_out():
    newer = pb.Discovery(
        notes=[f"{WORKERS}: {LISTED}"],
        noted=[
            pb.Note(text=WORKERS, kind="kind_of_a_later_hangdoc", pids=[4242, 0, -1, 2**22 + 1, 2**22], listed=LISTED)
        ],
        searched="x",
    )
    (note,) = wire.discovery_from_proto(over_the_wire(newer)).notes
    assert note == Note(WORKERS, NoteKind.OTHER, pids=(4242, 0, 2**22), listed=LISTED)  # 0..PID_MAX, as a bundle
    assert note.words() == f"{WORKERS}: {LISTED}"


def test_samples_round_trip_threads_states_and_every_error_kind():
    stack = ["train.py:main:10", "torch/distributed/distributed_c10d.py:all_reduce:2800"]
    ranks = [
        make_rank(
            0,
            stack,
            threads={"loader": ["threading.py:run:5", "queue.py:get:180"]},
            active=True,
            io_per_sample=7,
            cpu_per_sample=0.25,
        ),
        make_rank(1, stacks=[["train.py:main:10"], ["train.py:main:11"], stack]),
        make_rank(2, stack, gone_after=1),
    ]
    ranks += [make_rank(10 + i, error=kind) for i, kind in enumerate(CaptureErrorKind)]
    for i in range(3):
        by_pid = {r.process.pid: r.samples[i] for r in ranks}
        back = round_trip_samples(by_pid)
        assert back == by_pid
        assert list(back) == list(by_pid)  # the agent's order is kept


def test_frames_and_threads_with_unusual_values():
    frames = (
        Frame("main", "/job/train.py", 0),  # line 0 is not None
        Frame("ncclKernel", "libnccl.so", None, native=True),
        make_frame("train.py:step:7", code="dist.all_reduce(t)  # ünïcode"),
        Frame("", "", None, code=""),  # empty code is not None
    )
    threads = (
        ThreadStack(2**64 - 1, None, frames, native_id=0, active=True, owns_gil=True),
        ThreadStack(0, "", (), native_id=None),
    )
    sample = Sample(
        t=0.1 + 0.2,  # a float that prints badly must still come back bit for bit
        threads=threads,
        state=ProcessState("disk-sleep", 1e-9, 0, read_chars=0, write_chars=None, ctx_switches=0, rss_bytes=None),
        error=CaptureError(CaptureErrorKind.PYSPY_FAILED, ""),
    )
    assert round_trip_samples({1: sample, 2: Sample(t=0.0)}) == {1: sample, 2: Sample(t=0.0)}


def test_sample_response_can_carry_the_discovery():
    rs = make_rank(0, ["train.py:main:1"])
    found = Discovery(
        ranks=(rs.process,),
        world_size=1,
        notes=(Note(WORKERS, NoteKind.NOT_RANKS, pids=(7,), listed="pid 7"),),
        searched="x",
    )
    msg = over_the_wire(wire.samples_to_proto({rs.process.pid: rs.samples[0]}, found))
    assert wire.discovery_from_proto(msg.discovery) == found
    assert not over_the_wire(wire.samples_to_proto({})).HasField("discovery")


@pytest.mark.parametrize("job", ["10.0.0.1:29500", None])
def test_what_a_node_says_of_the_job_s_other_nodes_round_trips(job):
    rs = make_rank(0, ["train.py:main:1"])
    found = Discovery(
        ranks=(rs.process,), world_size=4, notes=(), searched="x", elsewhere=Elsewhere("n0", "NNODES=2", ("n1",), job)
    )
    assert wire.discovery_from_proto(over_the_wire(wire.discovery_to_proto(found))) == found


def test_source_file_and_frame_round_trip():
    src = SourceFile("/job/train.py", ((1, "def main():"), (2, ""), (10, "    finally:")))
    assert wire.source_file_from_proto(over_the_wire(wire.source_file_to_proto(src))) == src
    empty = SourceFile("<frozen runpy>", ())
    assert wire.source_file_from_proto(over_the_wire(wire.source_file_to_proto(empty))) == empty
    frame = make_frame("torch/nn/module.py:forward:3", native=True, code="x")
    assert wire.frame_from_proto(over_the_wire(wire.frame_to_proto(frame))) == frame


# ------------------------------------------------------------------ recorded real snapshots


@pytest.mark.parametrize("path", SNAPSHOTS, ids=[p.name.split(".")[0] for p in SNAPSHOTS])
def test_recorded_snapshot_round_trips_through_the_api(path):
    snap = load_snapshot(path)
    assert snap.ranks
    found = Discovery(
        ranks=tuple(r.process for r in snap.ranks), world_size=snap.world_size, notes=snap.notes, searched=snap.spec
    )
    assert wire.discovery_from_proto(over_the_wire(wire.discovery_to_proto(found))) == found
    rounds = max(len(r.samples) for r in snap.ranks)
    for i in range(rounds):
        by_pid = {r.process.pid: r.samples[i] for r in snap.ranks if i < len(r.samples)}
        assert round_trip_samples(by_pid) == by_pid
    for src in snap.sources:
        assert wire.source_file_from_proto(over_the_wire(wire.source_file_to_proto(src))) == src


def test_recorded_snapshots_exist():
    assert len(SNAPSHOTS) >= 10


# ------------------------------------------------------------------ coverage of the model


@pytest.mark.parametrize(
    ("model", "message", "renamed"),
    [
        (Frame, pb.Frame, {}),
        (ThreadStack, pb.ThreadStack, {"frames": "stack"}),
        (ProcessState, pb.ProcessState, {}),
        (CaptureError, pb.CaptureError, {}),
        (Sample, pb.Sample, {}),
        (RankProcess, pb.RankProcess, {}),
        (SourceFile, pb.SourceFile, {}),
        (Discovery, pb.Discovery, {}),
    ],
)
def test_every_model_field_has_a_message_field(model, message, renamed):
    """A field added to the model must be added to the proto too (additively)."""
    names = {renamed.get(f.name, f.name) for f in dataclasses.fields(model)}
    assert names <= set(message.DESCRIPTOR.fields_by_name), names - set(message.DESCRIPTOR.fields_by_name)


def test_every_enum_member_is_mapped_both_ways():
    for kind in CaptureErrorKind:
        sample = Sample(t=1.0, error=CaptureError(kind, kind.value))
        assert round_trip_samples({1: sample})[1] == sample
    assert len(pb.CaptureErrorKind.values()) == len(CaptureErrorKind) + 1  # + UNSPECIFIED
    assert len(pb.RankSource.values()) == len(RankSource) + 1


# ------------------------------------------------------------------ bad messages


def test_unknown_enum_values_are_clear_errors():
    msg = wire.samples_to_proto({1: Sample(t=0, error=CaptureError(CaptureErrorKind.TIMEOUT, "slow"))})
    msg.samples[0].sample.error.kind = 99  # a kind from a newer agent
    with pytest.raises(AgentApiError, match="unknown CaptureErrorKind value 99"):
        wire.samples_from_proto(over_the_wire(msg))
    msg.samples[0].sample.error.kind = pb.CAPTURE_ERROR_KIND_UNSPECIFIED
    with pytest.raises(AgentApiError, match="CaptureErrorKind value 0"):
        wire.samples_from_proto(over_the_wire(msg))
    proc = wire.rank_process_to_proto(RankProcess(pid=1, host="h", rank=0))
    proc.rank_source = 7
    with pytest.raises(AgentApiError, match="unknown RankSource value 7"):
        wire.rank_process_from_proto(over_the_wire(proc))


def test_dangling_indices_and_duplicate_pids_are_clear_errors():
    rs = make_rank(0, ["train.py:main:1", "train.py:step:2"])
    msg = wire.samples_to_proto({1: rs.samples[0]})
    bad_stack = over_the_wire(msg)
    bad_stack.samples[0].sample.threads[0].stack = 5
    with pytest.raises(AgentApiError, match="stack 5"):
        wire.samples_from_proto(bad_stack)
    bad_frame = over_the_wire(msg)
    bad_frame.stacks[0].frames.append(40)
    with pytest.raises(AgentApiError, match="outside the frame table"):
        wire.samples_from_proto(bad_frame)
    twice = over_the_wire(msg)
    twice.samples.add().CopyFrom(twice.samples[0])
    with pytest.raises(AgentApiError, match="two samples for pid 1"):
        wire.samples_from_proto(twice)


# ------------------------------------------------------------------ interning


def test_thousand_identical_ranks_send_one_stack():
    stack = [f"pkg/mod{i}.py:function_with_a_long_name_{i}:{100 + i}" for i in range(40)]
    snap = make_snapshot({r: stack for r in range(1000)}, samples=1)
    by_pid = {r.process.pid: r.samples[0] for r in snap.ranks}
    msg = wire.samples_to_proto(by_pid)
    assert (len(msg.frames), len(msg.stacks)) == (40, 1)
    one_stack = sum(wire.frame_to_proto(make_frame(f)).ByteSize() for f in stack)
    size = len(msg.SerializeToString())
    assert one_stack > 2_000
    assert size < 150_000, size  # ~70 bytes per rank: pid, t, one thread, counters
    assert size < one_stack * 1000 / 20  # the stacks themselves would be > 2 MB
    assert wire.samples_from_proto(over_the_wire(msg)) == by_pid


# ------------------------------------------------------------------ generated code


def test_generated_code_is_up_to_date(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the pinned generator) not installed")
    make = shutil.which("make")
    if make is None:
        pytest.skip("make not installed: cannot run `make proto`")
    out = tmp_path / "v1"
    out.mkdir()
    # -o: never (re)build the virtualenv from here; use this interpreter's environment
    run = subprocess.run(
        [
            make,
            "-s",
            "-C",
            str(REPO),
            "-o",
            ".venv/.installed",
            "proto",
            f"PROTO_OUT={out}",
            f"BIN={Path(sys.executable).parent}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    committed = REPO / "hangdoc" / "fleet" / "v1"
    for name in GENERATED:
        assert filecmp.cmp(out / name, committed / name, shallow=False), (
            f"hangdoc/fleet/v1/{name} is stale: run `make proto` and commit it"
        )
    assert sorted(p.name for p in out.iterdir()) == sorted(GENERATED)


def test_generated_grpc_code_imports_its_messages_relatively():
    text = (REPO / "hangdoc" / "fleet" / "v1" / "agent_pb2_grpc.py").read_text()
    assert "from . import agent_pb2 as" in text
    assert "from hangdoc.v1" not in text


def test_service_over_a_real_channel():
    """The generated stub and servicer talk over a real local gRPC channel."""
    grpc = pytest.importorskip("grpc")
    from hangdoc.fleet.v1 import agent_pb2_grpc

    rs = make_rank(4, ["train.py:main:1", "torch/distributed/distributed_c10d.py:barrier:9"])

    class Servicer(agent_pb2_grpc.AgentServicer):
        def Sample(self, request, context):
            procs = [wire.rank_process_from_proto(p) for p in request.processes.processes]
            return wire.samples_to_proto({p.pid: rs.samples[0] for p in procs})

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    agent_pb2_grpc.add_AgentServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            request = pb.SampleRequest(t=0.5, native=False)
            request.processes.processes.append(wire.rank_process_to_proto(rs.process))
            reply = stub.Sample(request, timeout=10)
            with pytest.raises(grpc.RpcError) as err:
                stub.GetInfo(pb.GetInfoRequest(), timeout=10)
    finally:
        server.stop(grace=None)
    assert wire.samples_from_proto(reply) == {rs.process.pid: rs.samples[0]}
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_rank_numbers_from_an_agent_are_bounded() -> None:
    from hangdoc.model import MAX_WORLD_SIZE

    msg = pb.RankProcess(pid=5, host="h", rank=2**40, world_size=2_000_000_000, local_rank=-3)
    proc = wire.rank_process_from_proto(msg)
    assert (proc.rank, proc.world_size, proc.local_rank) == (None, None, None)
    ok = wire.rank_process_from_proto(pb.RankProcess(pid=5, rank=MAX_WORLD_SIZE - 1, world_size=MAX_WORLD_SIZE))
    assert (ok.rank, ok.world_size) == (MAX_WORLD_SIZE - 1, MAX_WORLD_SIZE)
    found = wire.discovery_from_proto(pb.Discovery(world_size=MAX_WORLD_SIZE + 1))
    assert found.world_size is None


WAITS = (
    ThreadWait(812, "recvfrom", WaitKind.SOCKET, 5, "socket:[77]", (900, 901), ""),
    ThreadWait(813, "futex", WaitKind.THREAD),
    ThreadWait(814, "read", WaitKind.SOCKET, 0, "socket:[78]", (), "10.0.0.7:8000"),
)


def test_a_samples_waits_round_trip() -> None:
    sample = Sample(t=1.5, threads=(ThreadStack(1, "MainThread", (), 812),), waits=WAITS)
    assert round_trip_samples({812: sample}) == {812: sample}


def test_a_wait_naming_an_impossible_pid_is_a_clear_error() -> None:
    msg = wire.samples_to_proto({1: Sample(t=0, waits=(ThreadWait(1, "read", WaitKind.PIPE, 0, "pipe:[1]", (5,)),))})
    msg.samples[0].sample.waits[0].peers[0] = 2**40
    with pytest.raises(AgentApiError, match="outside 0"):
        wire.samples_from_proto(over_the_wire(msg))
    msg.samples[0].sample.waits[0].peers[0] = 5
    msg.samples[0].sample.waits[0].kind = 999
    with pytest.raises(AgentApiError, match="WaitKind"):
        wire.samples_from_proto(over_the_wire(msg))
