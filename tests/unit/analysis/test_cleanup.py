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
    return [*LOOP, make_frame("train.py:main:160", code="with zero_first(rank):"),
            make_frame("contextlib.py:_GeneratorContextManager.__exit__:144", code=exit_line),
            make_frame("train.py:zero_first:30", code="dist.barrier()"), BARRIER]


def test_code_after_yield_on_the_normal_path_is_not_cleanup() -> None:
    op = recognise(make_thread(_zero_first("next(self.gen)")))
    assert op is not None and op.name == "barrier"
    assert not op.in_cleanup and op.cleanup_frame is None


def test_an_exception_thrown_into_the_generator_is_cleanup() -> None:
    op = recognise(make_thread(_zero_first("self.gen.throw(typ, value, traceback)")))
    assert op is not None and op.in_cleanup
    assert op.cleanup_frame is not None and op.cleanup_frame.function.endswith("__exit__")


def test_zero_first_normal_path_is_not_a_cleanup_deadlock() -> None:
    others = [*LOOP, make_frame("train.py:main:170", code="dist.all_reduce(loss)"),
              f"{C10D}:all_reduce:2800"]
    snap = make_snapshot([make_rank(0, _zero_first("next(self.gen)"))]
                         + [make_rank(r, others) for r in (1, 2, 3)])
    d = analyse(snap)
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH
    assert d.culprit_ranks == (0,)
    thrown = make_snapshot([make_rank(0, _zero_first("self.gen.throw(typ, value, traceback)"))]
                           + [make_rank(r, others) for r in (1, 2, 3)])
    d = analyse(thrown)
    assert d.verdict is Verdict.CLEANUP_DEADLOCK
    assert d.culprit_ranks == (0,)


def test_a_thread_pool_shutdown_at_the_end_of_a_with_block_is_not_cleanup() -> None:
    joining = make_thread([*LOOP, make_frame("train.py:main:180", code="with ThreadPoolExecutor() as pool:"),
                           "concurrent/futures/_base.py:Executor.__exit__:649",
                           "concurrent/futures/thread.py:ThreadPoolExecutor.shutdown:235",
                           "threading.py:Thread.join:1112", "threading.py:_wait_for_tstate_lock:1132"])
    assert cleanup_marker(joining, None) is None


def test_exit_time_machinery_of_the_standard_library_is_cleanup() -> None:
    at_exit = make_thread(["multiprocessing/util.py:_exit_function:360",
                           "multiprocessing/util.py:_run_finalizers:300",
                           make_frame("train.py:close_all:12", code="dist.barrier()"), BARRIER])
    marker = cleanup_marker(at_exit, None)
    assert marker is not None and marker.function == "_run_finalizers"
    # and the job's own __exit__ still is cleanup, by its name
    own = make_thread([*LOOP, "train.py:Trainer.__exit__:90", BARRIER])
    marker = cleanup_marker(own, None)
    assert marker is not None and marker.function == "Trainer.__exit__"


def _trainer_exit(exception: str | None) -> object:
    """Rank 1 in the barrier of ``Trainer.__exit__`` (the job's own context manager),
    with what capture kept of the exception ``__exit__`` was called with."""
    stack = [*LOOP, "train.py:main:170", "trainer.py:Trainer.__exit__:55",
             "trainer.py:Trainer._sync:61", BARRIER]
    kept = [(3, {"exception": exception})] if exception is not None else []
    return make_rank(1, stack, world_size=3, arguments=kept)


def _in_training(rank: int) -> object:
    return make_rank(rank, [*LOOP, "train.py:train_step:40", f"{C10D}:all_reduce:2800"],
                     world_size=3)


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
