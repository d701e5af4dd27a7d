"""Finding a job through relays is one call a node: its FindRanks answer carries what
GetInfo says (``Discovery.agent``), checked as GetInfo's answer is; an agent without it is
asked GetInfo. Asked directly, GetInfo still comes first (its short deadline tells a
stopped agent)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from google.protobuf.message import Message

from hangdoc import SCHEMA_VERSION
from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.fleet.client import AgentError, RemoteNode, planning
from hangdoc.fleet.v1 import agent_pb2 as pb
from hangdoc.fleet.v1 import agent_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.timeout(60)]
SPEC = parse_job_spec("127.0.0.1:29500")


class Agent(pb_grpc.AgentServicer):
    """An agent whose FindRanks answer carries ``info`` (or nothing of it: an older agent)."""

    def __init__(self, info: pb.AgentInfo | None) -> None:
        self.info = info
        self.calls: list[str] = []

    def GetInfo(self, request: pb.GetInfoRequest, context: object) -> pb.AgentInfo:
        self.calls.append("GetInfo")
        return self.info or pb.AgentInfo(schema_version=SCHEMA_VERSION, host="old")

    def FindRanks(self, request: pb.FindRanksRequest, context: object) -> pb.Discovery:
        self.calls.append("FindRanks")
        found = pb.Discovery(ranks=[pb.RankProcess(pid=7, host="n", rank=0, world_size=1)], world_size=1)
        if self.info is not None:
            found.agent.CopyFrom(self.info)
        return found


@pytest.fixture
def serving() -> Iterator[list[grpc.Server]]:
    servers: list[grpc.Server] = []
    yield servers
    for server in servers:
        server.stop(grace=None)


def _node(agent: Agent, servers: list[grpc.Server]) -> RemoteNode:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    pb_grpc.add_AgentServicer_to_server(agent, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    servers.append(server)
    return RemoteNode(f"127.0.0.1:{port}")


class Relayed:
    """A ``Plan`` answering every call from ``agent``'s servicer, as a relay would."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def answer(self, node: RemoteNode, method: str, request: Message, timeout: float) -> object:
        answer: Message = getattr(self.agent, method)(request, None)
        return answer.SerializeToString()


def test_through_relays_one_call_finds_the_job() -> None:
    agent = Agent(pb.AgentInfo(schema_version=SCHEMA_VERSION, host="n"))
    node = RemoteNode("10.0.0.1:7420")
    with planning(Relayed(agent)):
        assert [p.pid for p in node.find_ranks(SPEC).ranks] == [7]
        node.find_ranks(SPEC)
    assert agent.calls == ["FindRanks", "FindRanks"]


def test_through_relays_an_older_agent_is_asked_getinfo() -> None:
    agent = Agent(None)
    node = RemoteNode("10.0.0.1:7420")
    with planning(Relayed(agent)):
        assert [p.pid for p in node.find_ranks(SPEC).ranks] == [7]
        node.find_ranks(SPEC)
    assert agent.calls == ["FindRanks", "GetInfo", "FindRanks"]


def test_through_relays_another_schema_in_the_answer_is_refused() -> None:
    node = RemoteNode("10.0.0.1:7420")
    future = Relayed(Agent(pb.AgentInfo(schema_version=99, hangdoc_version="9.0.0", host="x")))
    with planning(future), pytest.raises(AgentError, match="schema 99.*same hangdoc version"):
        node.find_ranks(SPEC)


def test_asked_directly_getinfo_comes_first(serving: list[grpc.Server]) -> None:
    agent = Agent(pb.AgentInfo(schema_version=SCHEMA_VERSION, host="n"))
    node = _node(agent, serving)
    assert [p.pid for p in node.find_ranks(SPEC).ranks] == [7]
    node.find_ranks(SPEC)
    assert agent.calls == ["GetInfo", "FindRanks", "FindRanks"]
