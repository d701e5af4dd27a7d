"""The words of a diagnosis, on hand-built views and facts: no rule runs here."""

from __future__ import annotations

import ast
from collections.abc import Sequence

import pytest
from support.factories import make_frame, make_op, make_rank
from support.paths import REPO

from hangdoc.analysis import phrases, wording
from hangdoc.analysis.facts import (
    AllReceive,
    CleanupStuck,
    EnvSplit,
    InitSplit,
    InitStuck,
    Mismatch,
    NothingCaptured,
    RanksGone,
    SameOp,
    Straggling,
    Unexplained,
    Unpaired,
    Working,
)
from hangdoc.analysis.progress import Movement
from hangdoc.analysis.views import RankView
from hangdoc.model import CaptureErrorKind, DistOp, Evidence, Frame, RankState, Verdict

C10D = "torch/distributed/distributed_c10d.py"


def still(seconds: float = 2.0, cpu: float = 0.0, io: float = 0.0, **kw: object) -> Movement:
    fields: dict = {
        "seconds": seconds,
        "cpu_fraction": cpu,
        "bytes_per_second": io,
        "wakeups": 0,
        "dumps": 3,
        "op_changed": False,
        "left_op": False,
        "stack_changed": False,
        "status": "sleeping",
    }
    fields.update(kw)
    return Movement(**fields)


def view(
    rank: int,
    stack: Sequence[str | Frame] = ("train.py:main:10",),
    *,
    op: DistOp | None = None,
    state: RankState | None = None,
    move: Movement | None = None,
    cleanup: Frame | None = None,
    **rank_kwargs: object,
) -> RankView:
    """A view built by hand: the rank's main thread from ``stack``, no analysis run."""
    snap = make_rank(rank, stack, **rank_kwargs)  # type: ignore[arg-type]
    latest = snap.latest
    thread = latest.main_thread if latest is not None else None
    if state is None:
        state = RankState.WAITING if op is not None else RankState.BLOCKED
    return RankView(rank, snap, state, op, thread, move, cleanup)


def waiting(rank: int, name: str = "all_reduce", site: str = "train.py:train_step:30") -> RankView:
    """A rank blocked in ``name`` called from ``site``."""
    return view(rank, ["train.py:main:10", site, f"{C10D}:{name}:2800"], op=make_op(name, site))


def outside(rank: int, frame: Frame, **kw: object) -> RankView:
    return view(rank, ["train.py:main:10", frame], **kw)  # type: ignore[arg-type]


# -- ranks in sentences: ranges and agreement ---------------------------------------------


def test_rank_ranges_are_compressed_and_the_verb_agrees() -> None:
    lines = phrases.op_lines([waiting(r) for r in (5, 0, 2, 1)] + [waiting(3, "barrier", "train.py:sync:40")])
    assert lines == [
        "ranks 0-2,5 wait in all_reduce (train.py:30)",
        "rank 3 waits in barrier (train.py:40)",
    ]


def test_one_op_per_recogniser_in_the_order_first_seen() -> None:
    site = "train.py:train_step:30"
    patched = view(
        4, ["train.py:main:10", site, "apex/parallel.py:sync:9"], op=make_op("all_reduce", site, via="apex wrapper")
    )
    lines = phrases.op_lines([waiting(1), patched, waiting(0)])
    assert lines == [
        "ranks 0-1 wait in all_reduce (train.py:30)",
        ("rank 4 waits in all_reduce (train.py:30) via apex wrapper [innermost: sync (apex/parallel.py:9)]"),
    ]


def test_op_summary_deduplicates_and_sorts() -> None:
    idle = outside(3, make_frame("a.py:g:1"))
    views = [waiting(0, "barrier", "a.py:f:3"), waiting(1), waiting(2), idle]
    assert phrases.op_summary(views) == "all_reduce (train.py:30) / barrier (a.py:3)"
    assert phrases.op_summary([idle]) == "?"


def test_straggler_sentence_singular_and_plural() -> None:
    sleeper = outside(2, make_frame("/job/data.py:load:7", code="time.sleep(5)"))
    one = wording.words(Straggling([sleeper], [waiting(0), waiting(1)]))
    assert one.summary == ("straggler: rank 2 is sleeping while ranks 0-1 wait in all_reduce (train.py:30)")
    assert [e.words() for e in one.evidence] == [
        ("rank 2 is sleeping, not in any collective: thread 'MainThread' at load (data.py:7) `time.sleep(5)`"),
        "ranks 0-1 wait in all_reduce (train.py:30)",
    ]
    assert [e.rank for e in one.evidence] == [2, None]  # the sleeper's line is said of rank 2
    spinner = outside(3, make_frame("data.py:augment:77"), move=still(cpu=1.0), state=RankState.BUSY)
    many = wording.words(Straggling([sleeper, spinner], [waiting(0)]))
    assert many.summary == (
        "straggler: ranks 2-3 are computing (100% of a core)/sleeping while rank 0 waits in all_reduce (train.py:30)"
    )


def test_missing_ranks_singular_plural_and_exited() -> None:
    one = wording.words(RanksGone([3], [], 4, [waiting(0), waiting(1), waiting(2)]))
    assert one.summary == ("rank missing: rank 3 has no process while ranks 0-2 wait in all_reduce (train.py:30)")
    assert one.evidence[0].words() == "rank 3 of world size 4 has no process"
    many = wording.words(RanksGone([1, 2, 3, 7], [7], 8, [waiting(0)]))
    assert many.summary == ("rank missing: ranks 1-3,7 have no process while rank 0 waits in all_reduce (train.py:30)")
    assert [e.words() for e in many.evidence] == [
        "ranks 1-3,7 of world size 8 have no process",
        "rank 7 exited during the capture",
        "rank 0 waits in all_reduce (train.py:30)",
    ]


def test_working_ranks_quote_at_most_four() -> None:
    busy = [outside(r, make_frame("data.py:augment:77"), move=still(cpu=0.9), state=RankState.BUSY) for r in range(6)]
    said = wording.words(Working(busy))
    assert said.summary == (
        "not hung: no rank waits in a distributed operation; ranks 0-5 are working (CPU, I/O or changing stacks)"
    )
    assert len(said.evidence) == 4
    assert said.evidence[0].words().startswith("rank 0 is computing (90% of a core), not in any collective")
    assert "rank 0 is working" in wording.words(Working(busy[:1])).summary


# -- cleanup --------------------------------------------------------------------------------


def test_a_collective_on_a_cleanup_path() -> None:
    exit_frame = "ckpt.py:__exit__:12"
    stuck = view(
        1,
        ["train.py:main:10", exit_frame, f"{C10D}:barrier:4100"],
        op=make_op("barrier", exit_frame, in_cleanup=True, cleanup_frame=exit_frame),
    )
    assert phrases.describe_rank(stuck) == ("in barrier (ckpt.py:12), on a cleanup path: __exit__ (ckpt.py:12)")
    said = wording.words(CleanupStuck([stuck], [waiting(0), waiting(2)]))
    assert said.summary == (
        "cleanup deadlock: rank 1 left the training loop and waits in cleanup "
        "(barrier (ckpt.py:12)) while ranks 0,2 wait in all_reduce (train.py:30)"
    )
    assert [e.words() for e in said.evidence] == [
        "rank 1 is on a cleanup path: __exit__ (ckpt.py:12) -> barrier (ckpt.py:12)",
        "ranks 0,2 wait in all_reduce (train.py:30)",
    ]


def test_a_cleanup_line_is_said_of_its_rank_and_an_op_line_of_none() -> None:
    exit_frame = "ckpt.py:__exit__:12"
    stuck = view(
        5,
        ["train.py:main:10", exit_frame, f"{C10D}:barrier:4100"],
        op=make_op("barrier", exit_frame, in_cleanup=True, cleanup_frame=exit_frame),
    )
    cleanup, plain = wording.words(CleanupStuck([stuck], [waiting(0), waiting(2)])).evidence
    assert cleanup == Evidence("is on a cleanup path: __exit__ (ckpt.py:12) -> barrier (ckpt.py:12)", rank=5)
    assert cleanup.words() == "rank 5 is on a cleanup path: __exit__ (ckpt.py:12) -> barrier (ckpt.py:12)"
    assert plain == Evidence("ranks 0,2 wait in all_reduce (train.py:30)")
    assert plain.rank is None and plain.words() == plain.text


def test_idle_in_cleanup_code_outside_any_op() -> None:
    exit_frame = make_frame("ckpt.py:__exit__:12")
    joiner = view(
        2,
        ["train.py:main:10", exit_frame, "threading.py:join:1100", "threading.py:wait:320"],
        cleanup=exit_frame,
        threads={"saver": ["threading.py:run:900", "ckpt.py:save:40"]},
    )
    assert phrases.cleanup_short(joiner) == "blocked on a lock in ckpt.py:12 at wait"
    assert phrases.cleanup_where(joiner) == (
        "__exit__ (ckpt.py:12); blocked on a lock, not in any collective: thread 'MainThread' "
        "at wait (threading.py:320); other threads: 'saver' waiting at save (ckpt.py:40)"
    )
    said = wording.words(CleanupStuck([joiner, waiting(3, "barrier", "ckpt.py:__exit__:12")], [waiting(0), waiting(1)]))
    assert said.summary.startswith(
        "cleanup deadlock: ranks 2-3 left the training loop and wait in cleanup "
        "(barrier (ckpt.py:12) / blocked on a lock in ckpt.py:12 at wait) while ranks 0-1 wait"
    )


# -- what a rank outside any op is doing ---------------------------------------------------


@pytest.mark.parametrize(
    ("code", "kw", "expected"),
    [
        (None, {"state": RankState.STOPPED}, "stopped (SIGSTOP or a debugger)"),
        (None, {"move": still(cpu=0.5)}, "computing (50% of a core)"),
        (None, {"move": still(status="disk-sleep")}, "blocked on I/O (uninterruptible disk sleep)"),
        ("with self.lock:", {}, "blocked on a lock"),
        ("data = sock.recv(4096)", {}, "blocked on I/O"),
        ("time.sleep(self.poll)", {}, "sleeping"),
        ("x = compute()", {}, "idle outside any distributed op"),
    ],
)
def test_activity(code: str | None, kw: dict, expected: str) -> None:
    v = outside(0, make_frame("/job/worker.py:loop:5", code=code), **kw)
    assert phrases.activity(v) == expected


def test_unreadable_rank_is_described_by_its_error() -> None:
    denied = view(2, error=CaptureErrorKind.PTRACE_DENIED, state=RankState.UNREADABLE)
    not_python = view(3, error=CaptureErrorKind.NOT_PYTHON, state=RankState.UNREADABLE)
    assert phrases.describe_rank(denied) == "ptrace_denied (pid 1002)"
    assert wording.notes([4, 5], [denied, not_python]) == [
        (
            "ranks 4-5 were not seen (on a node not searched, not in the dumps, or on a node that did "
            "not answer): nothing is concluded about them"
        ),
        "ranks 2-3 could not be read: not_python (pid 1003); ptrace_denied (pid 1002)",
    ]
    assert wording.notes([], []) == []
    assert wording.partial_suffix([4, 5, 6, 9]) == " (partial evidence: ranks 4-6,9 unknown)"


# -- mismatches --------------------------------------------------------------------------


def test_mismatch_names_the_minority_against_the_majority() -> None:
    majority = [waiting(r, "all_gather", "metrics.py:gather:12") for r in (0, 1, 2)]
    minority = [waiting(3)]
    said = wording.words(Mismatch([majority, minority], [3]))
    assert said.summary == (
        "collective mismatch: rank 3 is in all_reduce (train.py:30) while ranks 0-2 are in all_gather (metrics.py:12)"
    )
    assert [e.words() for e in said.evidence] == [
        "ranks 0-2 wait in all_gather (metrics.py:12)",
        "rank 3 waits in all_reduce (train.py:30)",
    ]


def test_mismatch_without_a_majority_lists_every_group() -> None:
    said = wording.words(Mismatch([[waiting(0)], [waiting(1, "barrier", "a.py:f:3")]], []))
    assert said.summary == ("collective mismatch: rank 0 in all_reduce (train.py:30); rank 1 in barrier (a.py:3)")


def test_point_to_point_lines() -> None:
    recv = make_op("recv", "pipe.py:stage:20", peer=1)
    unpaired = Unpaired(0, recv, True, 1, make_op("all_reduce"))
    assert wording.p2p_line(unpaired) == (
        "rank 0 receives from rank 1 (pipe.py:20), but rank 1 is in all_reduce (train.py:30)"
    )
    send = make_op("send", None, peer=3)
    assert wording.p2p_line(Unpaired(2, send, False, 3, None)) == (
        "rank 2 sends to rank 3 (send), but rank 3 is in no distributed op"
    )
    receivers = [
        view(r, ["pipe.py:stage:20", f"{C10D}:recv:2400"], op=make_op("recv", "pipe.py:stage:20")) for r in (0, 1, 2)
    ]
    said = wording.words(Mismatch([receivers], [0, 1, 2], [AllReceive([0, 1, 2])]))
    assert said.summary == (
        "collective mismatch: point-to-point calls do not pair up: ranks 0-2 all receive and no rank sends"
    )
    assert [e.words() for e in said.evidence] == [
        "ranks 0-2 wait in recv (pipe.py:20)",
        "ranks 0-2 all receive and no rank sends",
    ]


# -- init, transport, nothing known -----------------------------------------------------------


def test_init_where_every_rank_waits_leads_with_the_disagreement() -> None:
    init = [waiting(r, "init_process_group", "train.py:<module>:5") for r in range(5)]
    env = EnvSplit("MASTER_PORT", {"29500": [0, 1, 2], "29501": [3, 4]})
    said = wording.words(InitStuck(init, [3, 4], env))
    assert said.summary == ("init deadlock: every rank waits in init_process_group (train.py:5); ranks 3-4 differ")
    assert [e.words() for e in said.evidence] == [
        ("ranks disagree on the rendezvous: MASTER_PORT=29500 on ranks 0-2, MASTER_PORT=29501 on ranks 3-4"),
        "ranks 0-4 wait in init_process_group (train.py:5)",
    ]
    assert wording.words(InitStuck(init, [])).summary == (
        "init deadlock: every rank waits in init_process_group (train.py:5)"
    )


def test_init_where_some_ranks_went_past() -> None:
    init = [waiting(r, "new_group", "train.py:setup:30") for r in (0, 1, 2)]
    ahead = [waiting(3)]
    said = wording.words(InitSplit(init, ahead, went_past=True))
    assert said.summary == ("init deadlock: ranks 0-2 wait in new_group (train.py:30) while rank 3 went past it")
    assert said.evidence[-1].words() == "rank 3 is in all_reduce (train.py:30)"
    assert said.evidence[-1].rank == 3
    late = wording.words(InitSplit(init[:1], [outside(1, make_frame("data.py:load:3"))], False))
    assert late.summary.endswith("rank 0 waits in new_group (train.py:30) while rank 1 never reached it")


def test_transport_hang_and_the_quiet_line() -> None:
    views = [waiting(r) for r in range(4)]
    said = wording.words(SameOp(views))
    assert said.summary == (
        "transport hang: every rank (ranks 0-3) waits in the same all_reduce (train.py:30) and no data moves"
    )
    assert phrases.quiet_line(views) == "no progress counters were available"
    moved = [
        view(0, op=make_op(), move=still(seconds=3.0, cpu=0.001, io=1024)),
        view(1, op=make_op(), move=still(seconds=2.5, cpu=0.004, io=3072)),
    ]
    assert phrases.quiet_line(moved) == (
        "nothing moved on the waiting ranks over 2.5 s: stacks unchanged, at most 0.4% CPU and 3.0 KiB/s read+written"
    )


def test_when_nothing_is_known() -> None:
    assert wording.words(NothingCaptured()) == ("No rank could be captured.", [])
    said = wording.words(Unexplained([outside(0, make_frame("a.py:f:1")), waiting(1)]))
    assert said.summary.startswith("No rank is in a distributed operation and nothing moves")
    assert said.evidence[1].words() == "rank 1: in all_reduce (train.py:30)"


@pytest.mark.parametrize("verdict", list(Verdict))
def test_every_verdict_has_next_steps(verdict: Verdict) -> None:
    assert wording.next_steps(verdict)


def test_wording_does_not_import_the_rules() -> None:
    tree = ast.parse((REPO / "hangdoc" / "analysis" / "wording.py").read_text())
    imported = {
        alias.name if isinstance(node, ast.Import) else f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert not any("classify" in name for name in imported)
