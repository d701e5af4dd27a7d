"""Analysis cost grows with the distinct stacks of a job, not with its ranks; and ranks that
share stacks share nothing else of their views.

``views.Views`` works out what a rank's stacks say once per *shape* (the same stack objects,
kept arguments, on-CPU marks and thread names, thread by thread) and reads per rank only what
differs per rank. These tests count the per-shape work on jobs of 500 and 5,000 ranks of
the same few shapes (the same counts at both sizes, for a mismatch, a half-and-half cleanup
deadlock, an init deadlock and a straggler, and no view compared with another: no membership
test on lists of views), and check, input by input, that ranks whose stacks are the same
objects but whose counters, ids, marks, arguments, environment or errors differ get the
views they get alone. Snapshots are interned as a bundle loads them (one object per
distinct stack).
"""

from __future__ import annotations

import dataclasses
import gc
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.factories import make_frame, make_rank, make_snapshot

from hangdoc.analysis import views as views_module
from hangdoc.analysis.analyse import analyse
from hangdoc.analysis.ops import Recogniser
from hangdoc.analysis.views import RankView, Views, view_rank
from hangdoc.model import (
    CaptureErrorKind,
    Frame,
    JobSnapshot,
    RankSnapshot,
    RankSource,
    RankState,
    Stack,
    Verdict,
)

C10D = "torch/distributed/distributed_c10d.py"
TRUNK = [
    "train.py:<module>:200",
    "train.py:main:150",
    "lightning/pytorch/trainer/trainer.py:fit:540",
    "lightning/pytorch/loops/fit_loop.py:run:205",
]
ALL_REDUCE = [
    *TRUNK,
    "train.py:training_step:64",
    "torch/distributed/c10d_logger.py:wrapper:81",
    f"{C10D}:all_reduce:2806",
]
SAVE = [*TRUNK, "train.py:save_checkpoint:140", "torch/distributed/c10d_logger.py:wrapper:81", f"{C10D}:barrier:4159"]
CLEANUP = [*TRUNK[:2], "train.py:__exit__:120", f"{C10D}:destroy_process_group:2101"]
INIT = [
    "train.py:<module>:200",
    "train.py:setup_groups:52",
    "torch/distributed/c10d_logger.py:wrapper:95",
    f"{C10D}:new_group:4870",
    f"{C10D}:_store_based_barrier:4410",
]
EXITING = ["train.py:_shutdown_workers:30", f"{C10D}:barrier:4100"]
COMPUTE = [*TRUNK, "train.py:training_step:60", "model.py:forward:77"]
PIN = [
    "threading.py:_bootstrap:995",
    "threading.py:_bootstrap_inner:1038",
    "torch/utils/data/_utils/pin_memory.py:_pin_memory_loop:59",
    "threading.py:wait:331",
]
LOGGER = ["threading.py:_bootstrap:995", "threading.py:run:982", "train.py:log_loop:20", "threading.py:wait:331"]


def interned(snapshot: JobSnapshot, threads: bool = False) -> JobSnapshot:
    """``snapshot`` with one object per distinct stack, as a bundle loads it; with
    ``threads``, also one tuple per distinct tuple of threads (a bundle's samples whose
    threads are alike share one, which ``Views`` keys once for all of them)."""
    seen: dict[Stack, Stack] = {}
    alike: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def one(made: tuple[Any, ...]) -> tuple[Any, ...]:
        return alike.setdefault(made, made) if threads else made

    return dataclasses.replace(
        snapshot,
        ranks=tuple(
            dataclasses.replace(
                r,
                samples=tuple(
                    dataclasses.replace(
                        s,
                        threads=one(
                            tuple(dataclasses.replace(t, frames=seen.setdefault(t.frames, t.frames)) for t in s.threads)
                        ),
                    )
                    for s in r.samples
                ),
            )
            for r in snapshot.ranks
        ),
    )


def _job(world: int, kind: str) -> tuple[JobSnapshot, Verdict, tuple[int, ...]]:
    """``world`` ranks of a few shapes (two kinds of side threads), 8 to a node; the verdict
    and culprits the analysis must find."""
    node = list(range((world // 16) * 8, (world // 16) * 8 + 8))
    ranks = []
    for r in range(world):
        main, busy = ALL_REDUCE, False
        if kind == "mismatch" and r in node:
            main = SAVE
        elif kind == "cleanup" and r >= world // 2:
            main = CLEANUP
        elif kind == "init" and r not in node:
            main = INIT
        elif kind == "straggler" and r == world // 2:
            main, busy = COMPUTE, True
        side = {"pin_memory": PIN} if r % 2 else {"pin_memory": PIN, "logger": LOGGER}
        ranks.append(
            make_rank(
                r,
                main,
                host=f"node{r // 8}",
                threads=side,
                active=busy,
                cpu_per_sample=0.5 if busy else 0.0,
                world_size=world,
                env={"LOCAL_WORLD_SIZE": "8"},
            )
        )
    found = {
        "mismatch": (Verdict.COLLECTIVE_MISMATCH, tuple(node)),
        "cleanup": (Verdict.CLEANUP_DEADLOCK, tuple(range(world // 2, world))),
        "init": (Verdict.INIT_DEADLOCK, tuple(node)),
        "straggler": (Verdict.STRAGGLER, (world // 2,)),
    }[kind]
    return interned(make_snapshot(ranks)), *found


# the work done once per shape (or per op), and what must not happen per rank at all
PER_SHAPE = ("stack_motion", "relevant_thread", "_sync_line", "waits_on_a_lock", "init_frame")


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    calls: Counter[str] = Counter()

    def count(owner: Any, name: str) -> None:
        inner: Callable[..., Any] = getattr(owner, name)

        def counting(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return inner(*args, **kwargs)

        monkeypatch.setattr(owner, name, counting)

    for name in PER_SHAPE:
        count(views_module, name)
    count(Recogniser, "recognise")
    count(Recogniser, "cleanup_marker")
    count(RankView, "__eq__")  # a membership test on a list of views compares views
    location = Frame.location

    def quoted(frame: Frame) -> str:
        calls["Frame.location"] += 1
        return location.fget(frame)  # type: ignore[attr-defined,no-any-return]

    monkeypatch.setattr(Frame, "location", property(quoted))
    yield calls


@pytest.mark.parametrize("kind", ["mismatch", "cleanup", "init", "straggler"])
def test_the_work_per_shape_is_the_same_at_500_and_5000_ranks(kind: str, counted: Counter[str]) -> None:
    seen = []
    for world in (500, 5_000):
        snapshot, verdict, culprits = _job(world, kind)
        counted.clear()
        diagnosis = analyse(snapshot)
        assert diagnosis.verdict is verdict and diagnosis.culprit_ranks == culprits
        seen.append(dict(counted))
    small, large = seen
    assert small == large, f"work grew with ranks: {small} at 500, {large} at 5000"
    assert 1 <= small["stack_motion"] <= 8, small  # a few shapes, not hundreds of ranks
    assert small["Frame.location"] > 0  # the ops were worded (once each)
    assert small.get("__eq__", 0) == 0, "views were compared with each other"


def test_a_job_of_one_stack_everywhere_works_out_one_shape() -> None:
    snapshot, _, _ = _job(1_000, "straggler")
    making = Views(snapshot)
    views = [making.view(r) for r in snapshot.ranks]
    # two kinds of side threads x (the straggler's stack or the all_reduce)
    assert len(making._shapes) == 3
    assert [v.rank for v in views] == list(range(1_000))
    assert all(v.thread is r.samples[-1].threads[0] for v, r in zip(views, snapshot.ranks, strict=False))


# -- ranks that share their stacks but not their views ------------------------------------


def _at_wait() -> list[str | Frame]:
    return [*TRUNK, make_frame("train.py:training_step:70", code="work.wait()")]


def _at_item() -> list[str | Frame]:
    return [*TRUNK, make_frame("train.py:training_step:61", code="loss = loss.item()")]


def _variants() -> dict[str, RankSnapshot]:
    """Ranks whose stacks are the same objects (once interned), each differing from ``base``
    in one input that matters."""
    native = make_frame(
        "/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so:c10d::ProcessGroupGloo::allreduce", native=True
    )
    base: dict[str, Any] = {"threads": {"pin_memory": PIN}}
    variants = {
        "base": make_rank(0, ALL_REDUCE, **base),
        "busy": make_rank(1, ALL_REDUCE, cpu_per_sample=0.5, **base),
        "bytes": make_rank(2, ALL_REDUCE, io_per_sample=10**6, **base),
        "woke": make_rank(3, ALL_REDUCE, ctx_per_sample=40, **base),
        "stopped": make_rank(4, ALL_REDUCE, status="stopped", **base),
        "gone": make_rank(5, ALL_REDUCE, gone_after=2, **base),
        "unreadable": make_rank(6, ALL_REDUCE, error=CaptureErrorKind.PTRACE_DENIED, **base),
        "side_busy": make_rank(7, ALL_REDUCE, thread_cpu={"pin_memory": 0.4}, **base),
        "own_busy": make_rank(8, ALL_REDUCE, thread_cpu={"MainThread": 0.4}, **base),
        "wait_line": make_rank(9, _at_wait(), **base),
        "wait_line_active": make_rank(20, _at_wait(), active=True, **base),
        "not_main": make_rank(10, ALL_REDUCE, thread_name="worker", **base),
        # an exit handler (the script's <module> frame gone) is looked for on the main thread
        "exit_handler": make_rank(21, EXITING, **base),
        "exit_handler_not_main": make_rank(22, EXITING, thread_name="worker", **base),
        "peer": make_rank(11, [*TRUNK, f"{C10D}:send:1800"], arguments=[(-1, {"dst": "3"})], **base),
        "other_peer": make_rank(12, [*TRUNK, f"{C10D}:send:1800"], arguments=[(-1, {"dst": "5"})], **base),
        "lock_address": make_rank(
            13, [*TRUNK, f"{C10D}:send:1800"], arguments=[(-1, {"dst": "3", "@self": "0x7f01"})], **base
        ),
        "item": make_rank(14, _at_item(), **base),
        "item_gpu": make_rank(15, _at_item(), env={"CUDA_VISIBLE_DEVICES": "0"}, **base),
        "init": make_rank(
            16,
            [*TRUNK, f"{C10D}:init_process_group:1500"],
            arguments=[(-1, {"rank": "40", "world_size": "64"})],
            rank_source=RankSource.INFERRED,
            **base,
        ),
        "init_env": make_rank(
            17,
            [*TRUNK, f"{C10D}:init_process_group:1500"],
            arguments=[(-1, {"rank": "40", "world_size": "64"})],
            **base,
        ),
        "native_dump": make_rank(18, ALL_REDUCE, stacks=[[*ALL_REDUCE, native], ALL_REDUCE, ALL_REDUCE], **base),
    }
    # the same dumps, but the thread ids of its last sample differ: its latest sample is not
    # the native one
    dump = variants["native_dump"]
    last = dump.samples[-1]
    renumbered = dataclasses.replace(
        last, threads=tuple(dataclasses.replace(t, thread_id=t.thread_id + 1) for t in last.threads)
    )
    variants["native_dump_renumbered"] = dataclasses.replace(
        dump, process=dataclasses.replace(dump.process, rank=19, pid=1019), samples=(*dump.samples[:-1], renumbered)
    )
    return variants


@pytest.mark.parametrize("threads", [False, True], ids=["stacks_interned", "threads_interned"])
def test_ranks_that_share_stacks_get_the_views_they_get_alone(threads: bool) -> None:
    variants = _variants()
    snapshot = interned(make_snapshot(list(variants.values())), threads)
    one_tuple = [len(r.samples) > 1 and len({id(s.threads) for s in r.samples}) == 1 for r in snapshot.ranks]
    assert any(one_tuple) and not all(one_tuple)  # both ways of keying a shape
    making = Views(snapshot)
    together = {name: making.view(r) for name, r in zip(variants, snapshot.ranks, strict=False)}
    for name, rank in zip(variants, snapshot.ranks, strict=False):
        alone = view_rank(rank, make_snapshot([rank]))
        assert together[name] == alone, name

    # the inputs matter: each variant's view differs in what was derived from the view of
    # the rank it differs from in one input (the base, unless named)
    def derived(v: RankView) -> tuple[object, ...]:
        thread = (v.thread.name, v.thread.frames) if v.thread is not None else None
        return v.state, v.op, v.move, v.code_world, v.cleanup, thread, v.rank == v.snap.rank

    against = {
        "wait_line_active": "wait_line",
        "other_peer": "peer",
        "exit_handler_not_main": "exit_handler",
        "native_dump_renumbered": "native_dump",
    }
    for name, view in together.items():
        if name not in ("base", "lock_address"):
            assert derived(view) != derived(together[against.get(name, "base")]), name
    # a lock's address (kept for ``locks``) is not what recognition reads
    assert derived(together["lock_address"]) == derived(together["peer"])
    assert together["busy"].state is RankState.COMMUNICATING
    assert together["unreadable"].state is RankState.UNREADABLE and together["gone"].state is RankState.EXITED
    assert together["peer"].op != together["other_peer"].op
    assert together["wait_line"].op is not None and together["wait_line_active"].op is None
    handler, worker = together["exit_handler"].op, together["exit_handler_not_main"].op
    assert handler is not None and handler.in_cleanup and worker is not None and not worker.in_cleanup
    assert together["item"].op is None and together["item_gpu"].op is not None
    assert together["init"].rank == 40 and together["init_env"].rank == 17
    assert together["native_dump"].thread is not None and together["native_dump_renumbered"].thread is not None
    assert any(f.native for f in together["native_dump"].thread.frames)
    assert not any(f.native for f in together["native_dump_renumbered"].thread.frames)


def test_the_shared_views_make_the_diagnosis_each_rank_alone_would() -> None:
    """Ranks of one shape whose counters differ (a real capture's CPU seconds and context
    switches): the analysis of the interned job is the analysis of the same job with every
    rank's stacks its own objects (no shape shared at all)."""
    ranks = [
        make_rank(
            r,
            ALL_REDUCE,
            threads={"pin_memory": PIN},
            cpu_start=10.0 + r,
            ctx_per_sample=r % 7,
            io_per_sample=(r % 5) * 40_000,
            cpu_per_sample=0.3 if r == 5 else 0.0,
        )
        for r in range(64)
    ]
    separate = make_snapshot(ranks)
    assert analyse(interned(separate)) == analyse(separate)
    assert analyse(interned(separate, threads=True)) == analyse(separate)


@pytest.mark.parametrize("collecting", [True, False])
def test_the_garbage_collector_is_left_as_it_was(collecting: bool) -> None:
    """Analysis pauses Python's cyclic collector (a full collection would walk every object
    of a large snapshot), and leaves it on or off as the caller had it."""
    snapshot, _, _ = _job(24, "mismatch")
    was = gc.isenabled()
    try:
        (gc.enable if collecting else gc.disable)()
        analyse(snapshot)
        assert gc.isenabled() is collecting
    finally:
        (gc.enable if was else gc.disable)()
