"""The job's output always flows through the watch: a bug in noting activity stops only the
noting (a stopped copy would fill the job's pipe and block the job)."""

from __future__ import annotations

import io
import os

from support.said import Said

from hangdoc.watch.activity import EventQueue, StepPattern, tee
from hangdoc.watch.config import Level
from hangdoc.watch.stall import Signal


class Broken(StepPattern):
    def match(self, line: str) -> tuple[bool, int | None]:
        raise RuntimeError("a bug in step matching")


def _copy(pattern: StepPattern, data: bytes) -> tuple[bytes, Said, EventQueue]:
    read_end, write_end = os.pipe()
    said = Said()
    sink = io.BytesIO()
    queue = EventQueue()
    with os.fdopen(read_end, "rb", buffering=0) as source:
        thread = tee(source, sink, pattern, queue, said)
        for start in range(0, len(data), 4096):  # many chunks, more than a pipe holds
            os.write(write_end, data[start : start + 4096])
        os.close(write_end)
        thread.join(10)
        assert not thread.is_alive()
    return sink.getvalue(), said, queue


def test_a_bug_in_noting_activity_never_stops_the_output() -> None:
    data = b"".join(b"step %d loss 0.1\n" % i for i in range(20_000))  # ~350 kB
    out, said, queue = _copy(Broken(r"step (\d+)"), data)
    assert out == data
    ((level, line),) = said
    assert level is Level.ERROR
    assert "RuntimeError: a bug in step matching" in line and "still passed through" in line
    assert [e.signal for e in queue.drain()][:1] == [Signal.OUTPUT]  # noted until the bug


def test_steps_are_noted_when_nothing_breaks() -> None:
    out, said, queue = _copy(StepPattern(r"step (\d+)"), b"step 1\nstep 2\n")
    assert out == b"step 1\nstep 2\n" and said == []
    assert Signal.STEP_LINE in {e.signal for e in queue.drain()}
