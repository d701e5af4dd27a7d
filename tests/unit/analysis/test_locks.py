"""Threads waiting on locks, who holds them, and lock-order deadlocks (``analysis.locks``).

Snapshots are built by hand: each thread's frames carry the source line py-spy's capture
reads (``code``), the snapshot the lines of their functions (``SourceFile``), and the frames
the object identities capture keeps of their lock expressions with ``--locals``
(``@NAME`` -> the address of the object NAME holds, ``-`` for a module global; see
``capture.read.pyspy.object_locals``).
"""

from __future__ import annotations

from collections.abc import Sequence

from support.factories import make_frame, make_rank, make_snapshot

from hangdoc.analysis.analyse import analyse
from hangdoc.analysis.locks import LockGraph, lock_graph, with_items
from hangdoc.analysis.ops import Recogniser
from hangdoc.analysis.views import view_rank
from hangdoc.model import Confidence, Frame, JobSnapshot, RankSnapshot, SourceFile, Verdict

C10D = "torch/distributed/distributed_c10d.py"
IN_ALL_REDUCE = ["train.py:<module>:60", "train.py:main:50", "train.py:train_step:40", f"{C10D}:all_reduce:2800"]
THREAD = [
    "threading.py:Thread._bootstrap:1002",
    "threading.py:Thread._bootstrap_inner:1045",
    "threading.py:Thread.run:982",
]
SCHED, LOADER = "0x7f642e0e9950", "0x7f642e110690"  # the two objects whose locks deadlock

# the loader's prefetch thread takes its cursor lock, then asks the curriculum for the level
# (the curriculum's lock); the trainer takes the curriculum's lock, then asks the loader
# for its state (the cursor lock): the lock order is reversed
CURRICULUM = SourceFile(
    "/job/curriculum.py",
    (
        (10, "class Curriculum:"),
        (11, "    def level(self):"),
        (12, "        with self._lock:"),
        (13, "            return self._level"),
        (14, ""),
        (15, "    def next_batch(self, loader):"),
        (16, "        with self._lock:"),
        (17, "            batch = next(loader)"),
        (18, "            if self._step % 5 == 0:"),
        (19, "                self.saved = loader.state_dict()"),
        (20, "            return batch"),
    ),
)
LOADER_PY = SourceFile(
    "/job/loader.py",
    (
        (30, "class Loader:"),
        (31, "    def _produce(self):"),
        (32, "        while True:"),
        (33, "            with self._cursor_lock:"),
        (34, "                batch = self._load()"),
        (35, "                self._queue.put(batch)"),
        (36, "                level = self._schedule.level()"),
        (37, ""),
        (38, "    def state_dict(self):"),
        (39, "        with self._cursor_lock:"),
        (40, "            return {'cursor': self._cursor}"),
    ),
)


def code_frame(spec: str, sources: Sequence[SourceFile] = (CURRICULUM, LOADER_PY)) -> Frame:
    """A frame carrying its source line, read from ``sources``, as capture reads it."""
    frame = make_frame(spec)
    for src in sources:
        if src.filename == frame.filename and frame.line is not None:
            text = src.line(frame.line)
            return make_frame(spec, code=text.strip() if text else None)
    return frame


MAIN_WAITS = [
    *IN_ALL_REDUCE[:2],
    "train.py:train_step:38",
    code_frame("curriculum.py:Curriculum.next_batch:19"),
    code_frame("loader.py:Loader.state_dict:39"),
]
PREFETCH_WAITS = [*THREAD, code_frame("loader.py:Loader._produce:36"), code_frame("curriculum.py:Curriculum.level:12")]
PREFETCH_PUTS = [
    *THREAD,
    code_frame("loader.py:Loader._produce:35"),
    make_frame("queue.py:Queue.put:140", code="self.not_full.wait()"),
    make_frame("threading.py:Condition.wait:320", code="waiter.acquire()"),
]


def deadlocked_rank(rank: int = 0, samples: int = 3, **kw: object) -> RankSnapshot:
    """MainThread and 'prefetch' each wait on the lock the other holds."""
    return make_rank(
        rank,
        MAIN_WAITS,
        samples=samples,
        world_size=3,
        arguments=[(3, {"@self": SCHED}), (4, {"@self": LOADER})],
        threads={"prefetch": PREFETCH_WAITS},
        thread_arguments={"prefetch": [(3, {"@self": LOADER}), (4, {"@self": SCHED})]},
        **kw,
    )  # type: ignore[arg-type]


def waiting(rank: int, samples: int = 3) -> RankSnapshot:
    return make_rank(rank, IN_ALL_REDUCE, samples=samples, world_size=3)


def job(rank0: RankSnapshot, sources: Sequence[SourceFile] = (CURRICULUM, LOADER_PY)) -> JobSnapshot:
    return make_snapshot([rank0, waiting(1, len(rank0.samples)), waiting(2, len(rank0.samples))], sources=sources)


def graph_of(snap: JobSnapshot, rank: int = 0) -> LockGraph | None:
    rec = Recogniser(snap)
    sample = snap.ranks[rank].samples[-1]
    return lock_graph(sample, rec.sources, rec.recognise)


# -- two threads, two locks --------------------------------------------------------------


def test_a_cycle_of_two_names_both_threads_and_both_lines() -> None:
    d = analyse(job(deadlocked_rank()))
    assert d.verdict is Verdict.STRAGGLER and d.culprit_ranks == (0,)
    # the summary names both threads and where each waits
    assert (
        "lock-order deadlock between threads 'MainThread' (loader.py:39) and 'prefetch' (curriculum.py:12)" in d.summary
    ), d.summary
    assert "while ranks 1-2 wait in all_reduce (train.py:40)" in d.summary
    line = next(e.words() for e in d.evidence if e.words().startswith("rank 0 is"))
    assert (
        "rank 0 is in a lock-order deadlock, not in any collective: thread 'MainThread' "
        "waits at Loader.state_dict (loader.py:39) "
        "`with self._cursor_lock:` for a lock held by thread 'prefetch' (taken at loader.py:33), "
        "which waits at Curriculum.level (curriculum.py:12) `with self._lock:` for a lock held "
        "by thread 'MainThread' (taken at curriculum.py:16); none of them can go on"
    ) in line, line
    assert sum("deadlock" in e.words() for e in d.evidence) == 1  # said once
    # seen in every sample: stuck, not slow, without watching longer
    assert not d.ambiguous
    assert d.confidence is Confidence.HIGH, d.basis
    assert any("in 3 samples: stuck, not slow" in b for b in d.basis), d.basis


def test_a_cycle_seen_in_one_sample_only_is_still_watched() -> None:
    d = analyse(job(deadlocked_rank(samples=1)))
    assert d.verdict is Verdict.STRAGGLER and d.culprit_ranks == (0,)
    assert "lock-order deadlock" in d.summary
    assert d.ambiguous  # one instant: both threads may have been passing through
    assert d.confidence is not Confidence.HIGH


def test_the_graph_of_a_cycle_of_two() -> None:
    graph = graph_of(job(deadlocked_rank()))
    assert graph is not None and len(graph.cycles) == 1
    ((first, second),) = graph.cycles
    assert first.wait.thread.name == "MainThread" and first.wait.lock == ("obj", LOADER, "_cursor_lock")
    assert first.holder is not None and first.holder.thread.name == "prefetch"
    assert first.holder.line == 33
    assert second.wait.lock == ("obj", SCHED, "_lock")
    assert second.holder is not None and second.holder.thread.name == "MainThread"
    assert second.holder.line == 16


# -- three threads, three locks -----------------------------------------------------------

LOCKS3 = SourceFile(
    "/job/stages.py",
    (
        (1, "import threading"),
        (2, "LOCK_A = threading.Lock()"),
        (10, "def stage_a():"),
        (11, "    with LOCK_A:"),
        (12, "        with LOCK_B:"),
        (20, "def stage_b():"),
        (21, "    with LOCK_B:"),
        (22, "        with LOCK_C:"),
        (30, "def stage_c():"),
        (31, "    with LOCK_C:"),
        (32, "        with LOCK_A:"),
    ),
)
GLOBALS = {"@LOCK_A": "-", "@LOCK_B": "-", "@LOCK_C": "-"}


def test_a_cycle_of_three_module_locks() -> None:
    def stage(name: str, line: int) -> list[object]:
        return [*THREAD, code_frame(f"stages.py:stage_{name}:{line}", (LOCKS3,))]

    rank = make_rank(
        0,
        IN_ALL_REDUCE[:2] + [code_frame("stages.py:stage_a:12", (LOCKS3,))],
        world_size=3,
        arguments=[(-1, GLOBALS)],
        threads={"b": stage("b", 22), "c": stage("c", 32)},
        thread_arguments={"b": [(-1, GLOBALS)], "c": [(-1, GLOBALS)]},
    )
    snap = job(rank, (LOCKS3,))
    graph = graph_of(snap)
    assert graph is not None and len(graph.cycles) == 1
    cycle = graph.cycles[0]
    assert [e.wait.thread.name for e in cycle] == ["MainThread", "b", "c"]
    assert [e.holder.line for e in cycle if e.holder] == [21, 31, 11]
    d = analyse(snap)
    assert d.verdict is Verdict.STRAGGLER and d.culprit_ranks == (0,)
    assert "between threads 'MainThread' (stages.py:12), 'b' (stages.py:22) and 'c' (stages.py:32)" in d.summary, (
        d.summary
    )


def test_module_globals_of_a_nested_function_have_no_identity() -> None:
    """A name that is not a local of ``outer.<locals>.inner`` may be a closure's variable:
    two closures over different locks must not be taken for one lock."""
    inner = make_frame("stages.py:make.<locals>.stage_b:22", code="with LOCK_C:")
    rank = make_rank(0, [*THREAD, inner], arguments=[(-1, GLOBALS)])
    graph = graph_of(make_snapshot([rank], sources=(LOCKS3,)))
    assert graph is not None and graph.edges[0].wait.lock is None


# -- no cycle -----------------------------------------------------------------------------


def test_a_lock_held_by_a_thread_blocked_elsewhere_is_no_cycle() -> None:
    rank = make_rank(
        0,
        MAIN_WAITS,
        world_size=3,
        arguments=[(3, {"@self": SCHED}), (4, {"@self": LOADER})],
        threads={"prefetch": PREFETCH_PUTS},
        thread_arguments={"prefetch": [(3, {"@self": LOADER})]},
    )
    snap = job(rank)
    graph = graph_of(snap)
    assert graph is not None and not graph.cycles and not graph.self_deadlocks
    d = analyse(snap)
    assert d.verdict is Verdict.STRAGGLER and d.culprit_ranks == (0,)
    assert "deadlock" not in d.summary and "blocked on a lock" in d.summary
    line = next(e.words() for e in d.evidence if e.words().startswith("rank 0 is"))
    assert (
        "waiting on a lock at loader.py:39 (Loader.state_dict) `with self._cursor_lock:`, "
        "held by thread 'prefetch' (taken at loader.py:33), which is blocked at Condition.wait "
        "(threading.py:320)"
    ) in line, line
    assert d.ambiguous  # the holder may still let go


def test_a_lock_wait_without_identities_still_says_where() -> None:
    """Captured without --locals: the line still says it waits on a lock, and where."""
    rank = make_rank(0, MAIN_WAITS, world_size=3, threads={"prefetch": PREFETCH_PUTS})
    d = analyse(job(rank))
    assert d.verdict is Verdict.STRAGGLER and d.culprit_ranks == (0,)
    line = next(e.words() for e in d.evidence if e.words().startswith("rank 0 is"))
    assert "waiting on a lock at loader.py:39 (Loader.state_dict) `with self._cursor_lock:`" in line
    assert "held by" not in line


def test_a_thread_on_cpu_at_a_with_line_is_not_waiting() -> None:
    rank = make_rank(0, MAIN_WAITS, active=True, arguments=[(4, {"@self": LOADER})])
    assert graph_of(make_snapshot([rank], sources=(CURRICULUM, LOADER_PY))) is None


def test_native_frames_elsewhere_than_a_lock_acquire_are_not_a_lock_wait() -> None:
    native_read = Frame("read", "/usr/lib/x86_64-linux-gnu/libc.so.6", None, native=True)
    native_lock = Frame("PyThread_acquire_lock_timed", "/usr/lib/libpython3.11.so.1.0", None, native=True)
    for below, waits in ((native_read, False), (native_lock, True)):
        rank = make_rank(0, [*MAIN_WAITS, below], arguments=[(4, {"@self": LOADER})])
        graph = graph_of(make_snapshot([rank], sources=(CURRICULUM, LOADER_PY)))
        assert (graph is not None) is waits


def test_with_items() -> None:
    assert with_items("with self._lock:") == ["self._lock"]
    assert with_items("with a, b.c as d:  # both") == ["a", "b.c"]
    assert with_items("with open(path) as f:") == []
    assert with_items("with torch.no_grad(), self._lock:") == ["self._lock"]
    assert with_items("x = 1") is None


# -- RLock re-entry -----------------------------------------------------------------------

REENTER = SourceFile(
    "/job/cache.py",
    (
        (1, "def refresh(lock):"),
        (2, "    with lock:"),
        (3, "        fill(lock)"),
        (5, "def fill(lock):"),
        (6, "    with lock:"),
        (7, "        pass"),
    ),
)


def _reenter(kind: str) -> JobSnapshot:
    rank = make_rank(
        0,
        [*IN_ALL_REDUCE[:2], code_frame("cache.py:refresh:3", (REENTER,)), code_frame("cache.py:fill:6", (REENTER,))],
        world_size=3,
        arguments=[(2, {"@lock": f"0x7f0000001000 {kind}"}), (3, {"@lock": f"0x7f0000001000 {kind}"})],
    )
    return job(rank, (REENTER,))


def test_rlock_reentry_is_not_a_deadlock() -> None:
    snap = _reenter("_thread.RLock")
    graph = graph_of(snap)
    assert graph is not None and graph.edges[0].reentry
    assert not graph.cycles and not graph.self_deadlocks
    d = analyse(snap)
    assert "deadlock" not in d.summary
    line = next(e.words() for e in d.evidence if e.words().startswith("rank 0 is"))
    assert "an RLock it already holds (taken at cache.py:2): re-entering it" in line, line


def test_a_plain_lock_taken_twice_by_one_thread_is_a_self_deadlock() -> None:
    snap = _reenter("_thread.lock")
    graph = graph_of(snap)
    assert graph is not None and len(graph.self_deadlocks) == 1
    d = analyse(snap)
    assert d.verdict is Verdict.STRAGGLER and d.culprit_ranks == (0,)
    assert "self-deadlock" in d.summary
    assert any(
        "for a plain Lock it already holds (taken at cache.py:2): it can never get it" in e.words() for e in d.evidence
    ), d.evidence


def test_a_lock_of_unknown_type_taken_again_is_not_called_a_deadlock() -> None:
    rank = make_rank(
        0,
        [*IN_ALL_REDUCE[:2], code_frame("cache.py:refresh:3", (REENTER,)), code_frame("cache.py:fill:6", (REENTER,))],
        world_size=3,
        arguments=[(2, {"@lock": "0x7f0000001000"}), (3, {"@lock": "0x7f0000001000"})],
    )
    d = analyse(job(rank, (REENTER,)))
    assert "deadlock" not in d.summary
    assert any("a self-deadlock if it is a plain Lock, fine if it is an RLock" in e.words() for e in d.evidence)


# -- a lock held by a thread that is in a collective --------------------------------------

STATS = SourceFile(
    "/job/stats.py",
    (
        (8, "    def flush(self):"),
        (9, "        with self._lock:"),
        (10, "            total = self._sum"),
        (11, "            dist.all_reduce(total)"),
        (20, "    def record(self, value):"),
        (21, "        with self._lock:"),
    ),
)


def test_a_lock_held_by_a_thread_in_a_collective() -> None:
    """Rank 0's MainThread waits on the stats lock; its 'stats' thread holds it while in an
    all_reduce the other ranks never issue: the rank is in that all_reduce (a minority op),
    and the evidence says who waits for whom."""
    stats_thread = [*THREAD, code_frame("stats.py:Stats.flush:11", (STATS,)), f"{C10D}:all_reduce:2800"]
    main = [*IN_ALL_REDUCE[:2], "train.py:train_step:38", code_frame("stats.py:Stats.record:21", (STATS,))]
    rank = make_rank(
        0,
        main,
        world_size=3,
        arguments=[(-1, {"@self": "0x7f00000000a0"})],
        threads={"stats": stats_thread},
        thread_arguments={"stats": [(3, {"@self": "0x7f00000000a0"})]},
    )
    snap = job(rank, (STATS,))
    graph = graph_of(snap)
    assert graph is not None and not graph.cycles
    edge = graph.edges[0]
    assert edge.holder is not None and edge.holder_op is not None and edge.holder_op.name == "all_reduce"
    d = analyse(snap)
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH and d.culprit_ranks == (0,)
    assert (
        "rank 0: thread 'MainThread' is waiting on a lock at stats.py:21 (Stats.record) "
        "`with self._lock:`, held by thread 'stats' (taken at stats.py:9), which is in "
        "all_reduce (stats.py:11)"
    ) in [e.words() for e in d.evidence], d.evidence


# -- what recognition ignores -------------------------------------------------------------


def test_lock_identities_do_not_split_recognition(monkeypatch: object) -> None:
    """Ranks whose threads differ only in the addresses of their lock objects share one key."""
    snap = make_snapshot(
        [make_rank(r, IN_ALL_REDUCE, arguments=[(2, {"@self": f"0x7f00000{r:05x}"})]) for r in range(4)]
    )
    rec = Recogniser(snap)
    keys = {rec.key(rank.samples[0].threads[0]) for rank in snap.ranks}
    assert len(keys) == 1
    views = [view_rank(r, snap, rec) for r in snap.ranks]
    assert {v.op.name for v in views if v.op} == {"all_reduce"}
