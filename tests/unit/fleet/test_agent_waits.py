"""The agent's Waits call and what it opens up: waits only of processes the agent found or
a Waits answer named, peers only those the caller may read, and Sample of a process only
once named (``AgentService._waits``, ``_refusal``), over real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from hangdoc.capture.read.waits import read_syscall
from hangdoc.errors import UsageError
from hangdoc.fleet.agent import AgentConfig, AgentService
from hangdoc.fleet.callers import Caller
from hangdoc.fleet.v1 import agent_pb2 as pb

pytestmark = [pytest.mark.timeout(60)]


@pytest.fixture
def reader_and_writer() -> Iterator[tuple[int, int]]:
    """A process blocked reading a pipe whose write end another process holds."""
    r, w = os.pipe()
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=(w,))
    reader = subprocess.Popen([sys.executable, "-c", f"import os; os.read({r}, 1)"], pass_fds=(r,))
    os.close(r)
    os.close(w)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            call = read_syscall(reader.pid, reader.pid)
            if call is not None and call[0] == "read":
                break
            time.sleep(0.05)
        yield reader.pid, writer.pid
    finally:
        for p in (reader, writer):
            p.kill()
            p.wait()


class OnlyThese(Caller):
    def __init__(self, pids: set[int]) -> None:
        super().__init__(operator=False, uid=12345, how="test")
        self.pids = pids

    def may_read(self, pid: int) -> bool:
        return pid in self.pids


def test_waits_are_read_only_of_found_or_named_processes(reader_and_writer: tuple[int, int]) -> None:
    reader, writer = reader_and_writer
    service = AgentService(AgentConfig(listen="127.0.0.1:0"))
    caller = OnlyThese({reader, writer})
    assert service._waits(pb.WaitsRequest(pids=[reader]), caller).waits == {}  # not found: not read
    service.found_pids.add(reader)
    found = service._waits(pb.WaitsRequest(pids=[reader]), caller)
    assert found.waits[reader][0].peers == (writer,) and writer in found.peers
    assert found.peers[writer].rank is None and service._refusal(writer, caller) is None  # named: may be sampled
    assert service._waits(pb.WaitsRequest(pids=[writer]), caller).waits.keys() == {writer}


def test_a_peer_the_caller_may_not_read_is_never_named(reader_and_writer: tuple[int, int]) -> None:
    reader, writer = reader_and_writer
    service = AgentService(AgentConfig(listen="127.0.0.1:0"))
    service.found_pids.add(reader)
    found = service._waits(pb.WaitsRequest(pids=[reader]), OnlyThese({reader}))
    assert found.waits[reader][0].peers == () and found.peers == {}
    refusal = service._refusal(writer, OnlyThese({reader, writer}))
    assert refusal is not None and "not a rank process this agent found" in refusal.message


def test_include_names_matching_processes_the_caller_may_read(reader_and_writer: tuple[int, int]) -> None:
    _reader, writer = reader_and_writer
    service = AgentService(AgentConfig(listen="127.0.0.1:0"))
    found = service._waits(pb.WaitsRequest(include=["time.sleep(60)"]), OnlyThese({writer}))
    assert set(found.peers) == {writer} and service._refusal(writer, OnlyThese({writer})) is None
    assert service._waits(pb.WaitsRequest(include=["time.sleep(60)"]), OnlyThese(set())).peers == {}
    with pytest.raises(UsageError, match="include words"):
        service._waits(pb.WaitsRequest(include=["x" * 300]), OnlyThese({writer}))
