"""A busy side thread neither hides a hang nor fakes progress: movement is read per thread.

A metrics, pin-memory or async-checkpoint thread using a tenth of a core made every waiting
rank look like it moved data (``CPU_MOVING_FRACTION`` is 5%): an nccl_timeout or a
straggler became ``not_hung``. With per-thread counters, the CPU of a rank's Python threads
that are in no distributed op is left out of its op's movement; the op thread's own CPU, and
that of threads py-spy does not list (gloo's workers), still counts.
"""

from __future__ import annotations

from support.factories import make_rank, make_snapshot

from hangdoc.analysis.analyse import analyse
from hangdoc.model import RankState, Verdict

C10D = "torch/distributed/distributed_c10d.py"
STEP = ["train.py:<module>:200", "train.py:main:150", "train.py:train_step:40"]
WAIT = [*STEP, f"{C10D}:all_reduce:2800"]
METRICS = ["threading.py:Thread._bootstrap:1002", "metrics.py:collect:31"]
LOCKED = ["train.py:<module>:200", "train.py:main:150", "loader.py:next_batch:12", "threading.py:Lock.acquire:88"]


def _rank(rank: int, stack: list[str], **counters: object) -> object:
    return make_rank(rank, stack, world_size=3, threads={"metrics": METRICS}, **counters)


def test_a_busy_metrics_thread_in_every_rank_does_not_turn_a_hang_into_progress() -> None:
    # every rank waits in the same all_reduce; each rank's metrics thread uses 20% of a core
    d = analyse(make_snapshot([_rank(r, WAIT, thread_cpu={"metrics": 0.1}) for r in range(3)]))
    assert d.verdict is Verdict.NCCL_TIMEOUT
    assert d.culprit_ranks == ()
    assert {ra.state for ra in d.ranks} == {RankState.WAITING}


def test_the_same_cpu_in_the_op_thread_itself_is_the_op_moving() -> None:
    # the other side of the line: the waiting thread itself on CPU (a big reduction)
    d = analyse(make_snapshot([_rank(r, WAIT, thread_cpu={"MainThread": 0.1}) for r in range(3)]))
    assert d.verdict is Verdict.NOT_HUNG
    assert {ra.state for ra in d.ranks} == {RankState.COMMUNICATING}


def test_cpu_of_threads_py_spy_does_not_list_still_counts() -> None:
    # gloo's workers do a collective's work and have no Python frames: process CPU beyond
    # the listed threads' is theirs, and it is the op moving
    d = analyse(make_snapshot([_rank(r, WAIT, thread_cpu={"metrics": 0.1}, cpu_per_sample=0.1) for r in range(3)]))
    assert d.verdict is Verdict.NOT_HUNG


def test_without_per_thread_counters_the_process_cpu_is_all_there_is() -> None:
    # older captures: the process's CPU, as before (the limitation this file is about)
    d = analyse(make_snapshot([_rank(r, WAIT, cpu_per_sample=0.1) for r in range(3)]))
    assert d.verdict is Verdict.NOT_HUNG


def test_a_straggler_stays_a_straggler_beside_busy_side_threads() -> None:
    ranks = [_rank(r, WAIT, thread_cpu={"metrics": 0.1}) for r in (0, 1)]
    ranks.append(_rank(2, LOCKED, thread_cpu={"metrics": 0.1}))
    d = analyse(make_snapshot(ranks))
    assert d.verdict is Verdict.STRAGGLER
    assert d.culprit_ranks == (2,)


def test_wake_ups_are_counted_on_the_op_thread() -> None:
    # the op thread's own context switches: many more than the dumps cause = it woke up
    woke = [_rank(r, WAIT, thread_cpu={"metrics": 0.0}, ctx_per_sample=20) for r in range(3)]
    assert analyse(make_snapshot(woke)).verdict is Verdict.NOT_HUNG
    still = [_rank(r, WAIT, thread_cpu={"metrics": 0.0}, ctx_per_sample=2) for r in range(3)]
    assert analyse(make_snapshot(still)).verdict is Verdict.NCCL_TIMEOUT


RAY_MAIN = ["ray/_private/workers/default_worker.py:<module>:330", "ray/_private/worker.py:Worker.main_loop:1005"]


def test_a_ray_worker_outside_any_op_is_read_in_its_training_thread() -> None:
    # Ray Train: the actor's main thread idles in Ray's task loop; the training function,
    # in its own thread, waits on a lock outside any collective: that thread is the rank's
    train = [
        "threading.py:Thread._bootstrap:1002",
        "train.py:train_func:58",
        "train.py:load_latest_shard:34",
        "threading.py:Lock.acquire:88",
    ]
    waiting = ["threading.py:Thread._bootstrap:1002", "train.py:train_func:60", f"{C10D}:all_reduce:2800"]
    ranks = [make_rank(r, RAY_MAIN, world_size=3, threads={"TrainingThread(train_func)": waiting}) for r in (0, 2)]
    ranks.insert(1, make_rank(1, RAY_MAIN, world_size=3, threads={"TrainingThread(train_func)": train}))
    d = analyse(make_snapshot(ranks))
    assert d.verdict is Verdict.STRAGGLER and d.culprit_ranks == (1,)
    rank1 = next(ra for ra in d.ranks if ra.rank == 1)
    assert rank1.thread == "TrainingThread(train_func)"
    assert "load_latest_shard" in rank1.detail or "acquire" in rank1.detail
