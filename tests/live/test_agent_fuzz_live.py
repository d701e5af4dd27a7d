"""Property-based fuzzing of a real agent's request handling (Hypothesis, bounded in time).

Whatever a caller sends, the agent answers with a status that says what was wrong (never
INTERNAL or UNKNOWN), stays up, and leaves no py-spy or other child process behind.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.agents import Agent, running_agent

grpc = pytest.importorskip("grpc")

from hangdoc.fleet.v1 import agent_pb2 as pb
from hangdoc.fleet.v1 import agent_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.timeout(300)]

ACCEPTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
}
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

jobs = st.one_of(
    st.text(max_size=300),
    st.text(max_size=3000).map(lambda s: "pid:" + s),
    st.sampled_from(
        [
            "pid:999999",
            "pid:²",
            "pid:-1",
            "pid:0",
            "127.0.0.1:²",
            "127.0.0.1:99999",
            "slurm:1.2",
            "slurm:",
            "ray:abc",
            ":",
            "",
            "\x1b[2J",
            "h" * 5000 + ":1",
        ]
    ),
)
floats = st.floats(allow_nan=True, allow_infinity=True)
pids = st.integers(min_value=-(2**63), max_value=2**63 - 1)
frames = st.builds(
    pb.Frame,
    function=st.text(max_size=50),
    filename=st.text(max_size=200),
    line=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    native=st.booleans(),
)


@pytest.fixture(scope="module")
def agent(tmp_path_factory) -> Iterator[Agent]:
    with running_agent(tmp_path_factory.mktemp("fuzz"), "--listen", "127.0.0.1:0") as a:
        yield a


@pytest.fixture(scope="module")
def stub(agent) -> Iterator[pb_grpc.AgentStub]:
    with grpc.insecure_channel(agent.address) as channel:
        yield pb_grpc.AgentStub(channel)


def _call(method, request) -> grpc.StatusCode:
    try:
        method(request, timeout=30)
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


@FUZZ
@given(job=jobs)
def test_find_ranks(stub, job: str) -> None:
    assert _call(stub.FindRanks, pb.FindRanksRequest(job=job)) in ACCEPTED


@FUZZ
@given(job=st.none() | jobs, targets=st.lists(pids, max_size=40), t=floats, timeout=st.none() | floats)
def test_sample(stub, job, targets, t, timeout) -> None:
    request = pb.SampleRequest(t=t)
    if job is not None:
        request.job = job
    else:
        request.processes.CopyFrom(pb.RankProcessList(processes=[pb.RankProcess(pid=p) for p in targets]))
    if timeout is not None:
        request.timeout_seconds = timeout
    assert _call(stub.Sample, request) in ACCEPTED


@FUZZ
@given(
    loose=st.lists(frames, max_size=20),
    queries=st.lists(st.builds(pb.SourceQuery, pid=pids, frames=st.lists(frames, max_size=5)), max_size=5),
)
def test_sample_sources(stub, loose, queries) -> None:
    request = pb.SampleSourcesRequest(frames=loose, queries=queries)
    assert _call(stub.SampleSources, request) in ACCEPTED


@FUZZ
@given(targets=st.lists(pids, max_size=50) | st.just(list(range(3000))))
def test_heartbeats(stub, targets) -> None:
    assert _call(stub.Heartbeats, pb.HeartbeatsRequest(pids=targets)) in ACCEPTED


def test_agent_is_up_and_left_nothing_running(agent, stub) -> None:
    assert _call(stub.GetInfo, pb.GetInfoRequest()) == grpc.StatusCode.OK
    deadline = time.monotonic() + 10
    while psutil.Process(agent.proc.pid).children(recursive=True) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert psutil.Process(agent.proc.pid).children(recursive=True) == []
    assert agent.proc.poll() is None
