"""Cleanup is recognised by what the code is doing, not by a function's name.

A ``@contextmanager`` whose code after ``yield`` runs on the normal path (sparseml's
``torch_distributed_zero_first``: rank 0 waits in a barrier after ``yield``) is no cleanup;
the same generator with an exception thrown into it is. The standard library's own
``__exit__``/``shutdown`` (a ``with ThreadPoolExecutor()`` joining its workers) is the
normal end of a ``with`` block; its exit-time machinery (atexit, multiprocessing's
finalizers) is cleanup.
"""

from __future__ import annotations

from support.factories import make_frame, make_rank, make_snapshot, make_thread

from hangdoc.analysis.analyse import analyse
from hangdoc.analysis.ops import cleanup_marker, recognise
from hangdoc.model import Verdict

C10D = "torch/distributed/distributed_c10d.py"
BARRIER = f"{C10D}:barrier:4100"
LOOP = ["train.py:<module>:200", "train.py:main:150"]


def _zero_first(exit_line: str) -> list:
    """Rank 0 in the barrier after ``yield`` of a ``@contextmanager``, reached through
    ``contextlib``'s ``__exit__`` at ``exit_line``."""
    return [
        *LOOP,
        make_frame("train.py:main:160", code="with zero_first(rank):"),
        make_frame("contextlib.py:_GeneratorContextManager.__exit__:144", code=exit_line),
        make_frame("train.py:zero_first:30", code="dist.barrier()"),
        BARRIER,
    ]


def test_code_after_yield_on_the_normal_path_is_not_cleanup() -> None:
    op = recognise(make_thread(_zero_first("next(self.gen)")))
    assert op is not None and op.name == "barrier"
    assert not op.in_cleanup and op.cleanup_frame is None


def test_an_exception_thrown_into_the_generator_is_cleanup() -> None:
    op = recognise(make_thread(_zero_first("self.gen.throw(typ, value, traceback)")))
    assert op is not None and op.in_cleanup
    assert op.cleanup_frame is not None and op.cleanup_frame.function.endswith("__exit__")


def test_zero_first_normal_path_is_not_a_cleanup_deadlock() -> None:
    others = [*LOOP, make_frame("train.py:main:170", code="dist.all_reduce(loss)"), f"{C10D}:all_reduce:2800"]
    snap = make_snapshot([make_rank(0, _zero_first("next(self.gen)"))] + [make_rank(r, others) for r in (1, 2, 3)])
    d = analyse(snap)
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH
    assert d.culprit_ranks == (0,)
    thrown = make_snapshot(
        [make_rank(0, _zero_first("self.gen.throw(typ, value, traceback)"))] + [make_rank(r, others) for r in (1, 2, 3)]
    )
    d = analyse(thrown)
    assert d.verdict is Verdict.CLEANUP_DEADLOCK
    assert d.culprit_ranks == (0,)


def test_a_thread_pool_shutdown_at_the_end_of_a_with_block_is_not_cleanup() -> None:
    joining = make_thread(
        [
            *LOOP,
            make_frame("train.py:main:180", code="with ThreadPoolExecutor() as pool:"),
            "concurrent/futures/_base.py:Executor.__exit__:649",
            "concurrent/futures/thread.py:ThreadPoolExecutor.shutdown:235",
            "threading.py:Thread.join:1112",
            "threading.py:_wait_for_tstate_lock:1132",
        ]
    )
    assert cleanup_marker(joining, None) is None


def test_exit_time_machinery_of_the_standard_library_is_cleanup() -> None:
    at_exit = make_thread(
        [
            "multiprocessing/util.py:_exit_function:360",
            "multiprocessing/util.py:_run_finalizers:300",
            make_frame("train.py:close_all:12", code="dist.barrier()"),
            BARRIER,
        ]
    )
    marker = cleanup_marker(at_exit, None)
    assert marker is not None and marker.function == "_run_finalizers"
    # and the job's own __exit__ still is cleanup, by its name
    own = make_thread([*LOOP, "train.py:Trainer.__exit__:90", BARRIER])
    marker = cleanup_marker(own, None)
    assert marker is not None and marker.function == "Trainer.__exit__"


def _trainer_exit(exception: str | None) -> object:
    """Rank 1 in the barrier of ``Trainer.__exit__`` (the job's own context manager),
    with what capture kept of the exception ``__exit__`` was called with."""
    stack = [*LOOP, "train.py:main:170", "trainer.py:Trainer.__exit__:55", "trainer.py:Trainer._sync:61", BARRIER]
    kept = [(3, {"exception": exception})] if exception is not None else []
    return make_rank(1, stack, world_size=3, arguments=kept)


def _in_training(rank: int) -> object:
    return make_rank(rank, [*LOOP, "train.py:train_step:40", f"{C10D}:all_reduce:2800"], world_size=3)


def test_an_exit_called_with_an_exception_is_cleanup() -> None:
    d = analyse(make_snapshot([_in_training(0), _trainer_exit("<ValueError>"), _in_training(2)]))
    assert d.verdict is Verdict.CLEANUP_DEADLOCK
    assert d.culprit_ranks == (1,)


def test_an_exit_at_the_normal_end_of_its_block_is_not_cleanup() -> None:
    # the same frames, __exit__(None, None, None): the with-block ended; rank 1 finished
    # training early and waits in a barrier the others have not reached: a mismatch
    d = analyse(make_snapshot([_in_training(0), _trainer_exit("None"), _in_training(2)]))
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH
    assert d.culprit_ranks == (1,)


def test_an_exit_with_no_kept_arguments_is_cleanup_by_its_name() -> None:
    # snapshots taken without arguments (older captures): the name is all there is
    d = analyse(make_snapshot([_in_training(0), _trainer_exit(None), _in_training(2)]))
    assert d.verdict is Verdict.CLEANUP_DEADLOCK


# ------------------------------------------------------------------ a rank dying at exit

SHUTDOWN = [
    "threading.py:_shutdown:1583",
    "concurrent/futures/thread.py:_python_exit:31",
    "threading.py:Thread.join:1112",
    "threading.py:Thread._wait_for_tstate_lock:1132",
]
WORKER = [
    "threading.py:Thread._bootstrap:995",
    "threading.py:Thread._bootstrap_inner:1038",
    "concurrent/futures/thread.py:_worker:83",
    "concurrent/futures/thread.py:_WorkItem.run:58",
]
ALL_REDUCE = [*LOOP, make_frame("train.py:main:170", code="dist.all_reduce(loss)"), f"{C10D}:all_reduce:2800"]


def _dying(worker: list) -> object:
    """Rank 1 raised: its main thread is in the interpreter's exit, joining a worker."""
    return make_rank(1, SHUTDOWN, threads={"ThreadPoolExecutor-0_0": [*WORKER, *worker]})


def test_a_rank_whose_main_thread_exits_joining_a_blocked_worker_is_the_cleanup_culprit() -> None:
    worker = [
        "train.py:upload:40",
        make_frame("queue.py:Queue.get:171", code="self.not_empty.wait()"),
        "threading.py:Condition.wait:327",
    ]
    d = analyse(make_snapshot([make_rank(r, ALL_REDUCE) for r in (0, 2)] + [_dying(worker)]))
    assert (d.verdict, d.culprit_ranks) == (Verdict.CLEANUP_DEADLOCK, (1,))
    rank1 = next(r for r in d.ranks if r.rank == 1)
    assert rank1.thread == "MainThread"


def test_an_exiting_rank_s_worker_in_a_collective_does_not_hide_the_exit() -> None:
    """Whatever the worker waits in (here a collective of its own), the rank is exiting."""
    worker = [
        "ckpt.py:save:12",
        make_frame("ckpt.py:gather:30", code="dist.all_gather(out, t)"),
        f"{C10D}:all_gather:3100",
    ]
    d = analyse(make_snapshot([make_rank(r, ALL_REDUCE) for r in (0, 2)] + [_dying(worker)]))
    assert (d.verdict, d.culprit_ranks) == (Verdict.CLEANUP_DEADLOCK, (1,))


def test_a_main_thread_that_starts_elsewhere_is_not_exiting_by_that_alone() -> None:
    """A main thread whose outermost frame is the job's (a stack a person cut) is not read
    as the interpreter's exit."""
    from hangdoc.analysis.ops import exit_frame

    assert exit_frame(make_thread(["train.py:main:150", "queue.py:Queue.get:171"])) is None
    frame = exit_frame(make_thread(SHUTDOWN))
    assert frame is not None and frame.function == "_shutdown"
    assert exit_frame(make_thread(SHUTDOWN, name="Thread-1")) is None
