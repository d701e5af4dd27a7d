"""A verdict speaks only for the ranks seen (issue 24): absence needs positive evidence,
"every rank" claims need every rank, one side of a teardown is cleanup, and the report says
what was seen."""

from __future__ import annotations

import dataclasses
import json

from support.factories import make_rank, make_snapshot

from hangdoc.analysis.analyse import analyse
from hangdoc.model import Confidence, JobSnapshot, RankState, Verdict
from hangdoc.rankranges import scope_text
from hangdoc.report.json_report import to_json_dict

C10D = "torch/distributed/distributed_c10d.py"
LOOP = ["train.py:<module>:200", "train.py:main:150"]
ALL_REDUCE = [*LOOP, "train.py:train_step:40", f"{C10D}:all_reduce:2800"]
TEARDOWN = [*LOOP, "train.py:finish:90", f"{C10D}:destroy_process_group:2100"]


def job(
    ranks: range | tuple[int, ...],
    stack: list[str],
    *,
    world: int | None,
    addr: str | None,
    spec: str = "10.0.0.1:29500",
    **kw: object,
) -> JobSnapshot:
    env = {"MASTER_ADDR": addr, "MASTER_PORT": "29500"} if addr else {}
    snap = make_snapshot([make_rank(r, stack, world_size=world, env=env) for r in ranks], spec=spec)
    return dataclasses.replace(snap, world_size=world, **kw)


# -- absence on positive evidence ---------------------------------------------------------


def test_a_rank_on_no_searched_node_is_not_seen_never_missing() -> None:
    """One node of a two-node job, no agents: ranks 2-3 could be on the other node."""
    d = analyse(job(range(2), ALL_REDUCE, world=4, addr="10.0.0.1"))
    assert d.verdict is Verdict.UNKNOWN and d.culprit_ranks == ()
    assert d.confidence is Confidence.LOW
    assert (d.scope.seen, d.scope.not_seen, d.scope.absent) == ((0, 1), (2, 3), ())
    assert d.summary.startswith("every rank seen (ranks 0-1) waits in the same all_reduce")
    assert "ranks 2-3 were not seen" in d.summary
    assert any("--agents NODE:7420" in e.words() for e in d.evidence)  # how to see the rest
    assert {r.rank: r.state for r in d.ranks}[2] is RankState.UNKNOWN
    assert any("diagnose the live job through an agent on every node" in s for s in d.next_steps)


def test_a_loopback_rendezvous_proves_the_absent_rank_has_no_process() -> None:
    """MASTER_ADDR=127.0.0.1: no rank can run on another node, and this node was searched."""
    d = analyse(job(range(2), ALL_REDUCE, world=4, addr="127.0.0.1"))
    assert d.verdict is Verdict.RANK_MISSING and d.culprit_ranks == (2, 3)
    assert (d.scope.not_seen, d.scope.absent) == ((), (2, 3))
    named = analyse(job(range(2), ALL_REDUCE, world=4, addr=None, spec="localhost:29500"))
    assert named.verdict is Verdict.RANK_MISSING  # the endpoint the job was named by


def test_ranks_missing_from_dumps_are_never_missing() -> None:
    """Two ranks' dumps of an 8-rank job, both in one all_reduce: no claim about the rest."""
    d = analyse(job(range(2), ALL_REDUCE, world=8, addr="127.0.0.1", nodes_searched=False))
    assert d.verdict is Verdict.UNKNOWN and d.confidence is Confidence.LOW
    assert d.scope.not_seen == tuple(range(2, 8)) and d.scope.absent == ()
    assert not d.scope.whole


# -- "every rank" only over every rank ----------------------------------------------------


def test_every_rank_in_one_op_is_a_transport_hang_only_over_the_whole_job() -> None:
    d = analyse(job(range(4), ALL_REDUCE, world=4, addr="10.0.0.1"))
    assert d.verdict is Verdict.NCCL_TIMEOUT and d.scope.whole
    assert d.summary.startswith("transport hang: every rank (ranks 0-3)")


def test_dumps_of_unknown_size_say_so_and_are_not_confident() -> None:
    d = analyse(job(range(2), ALL_REDUCE, world=None, addr=None, spec="dump.txt", nodes_searched=False))
    assert d.verdict is Verdict.NCCL_TIMEOUT and d.confidence is Confidence.LOW
    assert "the job's size is unknown: ranks not captured may be elsewhere" in d.basis
    assert d.scope.world_size is None and not d.scope.whole


# -- teardown -----------------------------------------------------------------------------


def test_one_rank_in_teardown_is_cleanup_seen_from_one_side() -> None:
    d = analyse(job((0,), TEARDOWN, world=None, addr=None, spec="rank0.txt", nodes_searched=False))
    assert d.verdict is Verdict.CLEANUP_DEADLOCK and d.culprit_ranks == (0,)
    assert d.confidence is Confidence.LOW
    assert d.summary.startswith("cleanup seen from one side: rank 0 left the training loop")
    assert "the job's other ranks were not seen" in d.summary
    assert "transport" not in d.summary
    of_four = analyse(job((0,), TEARDOWN, world=4, addr="10.0.0.1"))
    assert of_four.verdict is Verdict.CLEANUP_DEADLOCK and "ranks 1-3 were not seen" in of_four.summary


def test_every_rank_in_teardown_is_a_teardown_hang() -> None:
    d = analyse(job(range(4), TEARDOWN, world=4, addr="127.0.0.1"))
    assert d.verdict is Verdict.NCCL_TIMEOUT and d.culprit_ranks == ()
    assert d.summary.startswith("teardown hang: every rank (ranks 0-3) waits in the same destroy_process_group")


# -- the report says what was seen ------------------------------------------------------------


def test_the_reports_say_what_was_seen() -> None:
    snap = job(range(2), ALL_REDUCE, world=4, addr="10.0.0.1")
    report = json.loads(json.dumps(to_json_dict(analyse(snap), snap)))
    assert report["scope"] == {"world_size": 4, "whole": False, "seen": [[0, 1]], "not_seen": [[2, 3]], "absent": []}
    assert scope_text((0, 1), (2, 3), (), 4).startswith("saw ranks 0-1 of 4; ranks 2-3 not seen")
    assert scope_text((0, 1), (), (2,), 3) == "saw ranks 0-1 of 3; rank 2 absent (no process)"
    assert scope_text((0, 1, 2, 3), (), (), 4) == ""  # the whole job: nothing to say
    assert scope_text((0,), (), (), None) == "saw rank 0 (the job's size is not known)"
