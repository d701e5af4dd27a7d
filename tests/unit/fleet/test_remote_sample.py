"""``RemoteNode.sample`` over a real (replaying) agent: the request's process list is built
once and sent again while the processes stay the same; another set of processes (a subset,
another order) is translated afresh, and every answer comes back in the order asked."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.factories import make_snapshot

from hangdoc.bundle import save_snapshot
from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.fleet import wire
from hangdoc.fleet.agent import AgentConfig, serve_in_thread
from hangdoc.fleet.client import AgentAuth, RemoteNode
from hangdoc.model import Sample

TOKEN = "0123456789abcdef0123456789abcdef"
pytestmark = [pytest.mark.timeout(60)]


def _leaf(sample: Sample) -> str:
    return sample.threads[0].frames[-1].function


def test_repeated_rounds_reuse_the_process_list_and_a_new_set_is_sent_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stacks = {r: ["train.py:main:10", f"train.py:step{r}:{20 + r}"] for r in range(3)}
    saved = tmp_path / "snap.json"
    save_snapshot(make_snapshot(stacks), saved)
    agent = serve_in_thread(AgentConfig(listen="127.0.0.1:0", token=TOKEN, replay=str(saved)))
    node = RemoteNode(f"127.0.0.1:{agent.port}", AgentAuth(token=TOKEN))
    translated: list[int] = []
    to_proto = wire.rank_process_to_proto
    try:
        procs = list(node.find_ranks(parse_job_spec("127.0.0.1:29500")).ranks)
        monkeypatch.setattr(wire, "rank_process_to_proto", lambda p: translated.append(p.pid) or to_proto(p))
        for t in (1.0, 2.0):  # the same processes twice: translated once
            taken = node.sample(procs, t, native=False, timeout=5.0)
            assert [_leaf(s) for s in taken] == ["step0", "step1", "step2"]
            assert {s.t for s in taken} == {t}
        assert translated == [p.pid for p in procs]
        subset = [procs[2], procs[0]]  # another set, another order: translated again
        assert [_leaf(s) for s in node.sample(subset, 3.0, native=False, timeout=5.0)] == ["step2", "step0"]
        assert translated[3:] == [procs[2].pid, procs[0].pid]
        assert [_leaf(s) for s in node.sample(procs, 4.0, native=False, timeout=5.0)] == ["step0", "step1", "step2"]
        assert len(translated) == 8
    finally:
        node.close()
        agent.stop()
