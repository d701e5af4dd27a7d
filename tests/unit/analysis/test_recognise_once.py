"""Analysis recognises each distinct thread once, whatever the number of ranks.

One ``ops.Recogniser`` per analysis keys recognition on ``ops.thread_key``: a thread's
frames and their kept arguments, whether it is on CPU and whether it is the main thread.
Those tests count the
underlying recognition on a 2000-rank job of three stacks, check that the memoised answer
is the unmemoised one, and that every part of the key matters (and that recognition reads
nothing of a thread the key does not hold).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from support.factories import make_frame, make_rank, make_snapshot, make_thread
from support.paths import TESTS

from hangdoc.analysis import ops
from hangdoc.analysis.analyse import analyse
from hangdoc.analysis.ops import Recogniser, recognise, thread_key
from hangdoc.analysis.source_lines import SourceIndex
from hangdoc.bundle import load_snapshot
from hangdoc.model import Frame, FrameLocals, JobSnapshot, SourceFile, ThreadStack, Verdict
from hangdoc.report.json_report import to_json_dict

C10D = "torch/distributed/distributed_c10d.py"
OUTER = [
    "<frozen runpy>:_run_module_as_main:198",
    "train.py:<module>:400",
    "train.py:main:380",
    "lightning/pytorch/trainer/trainer.py:fit:540",
    "lightning/pytorch/loops/fit_loop.py:run:200",
]
ALL_REDUCE = [
    *OUTER,
    "train.py:train_step:30",
    "torch/distributed/c10d_logger.py:wrapper:83",
    f"{C10D}:all_reduce:2800",
]
IN_FINALLY = [*OUTER, "train.py:cleanup_step:64", f"{C10D}:barrier:4100"]
COMPUTE = [*OUTER, "train.py:train_step:31", "model.py:forward:77", "torch/nn/functional.py:linear:20"]
PIN = [
    "threading.py:_bootstrap:995",
    "threading.py:_bootstrap_inner:1038",
    "torch/utils/data/_utils/pin_memory.py:_pin_memory_loop:59",
    "threading.py:wait:331",
]
NATIVE = tuple(
    Frame(name, "/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so", None, native=True)
    for name in ("c10d::ProcessGroupGloo::allreduce", "gloo::allreduce")
)
SOURCES = (
    SourceFile(
        "/job/train.py",
        (
            (59, "def cleanup_step():"),
            (60, "    try:"),
            (61, "        step()"),
            (62, "    finally:"),
            (63, "        log()"),
            (64, "        dist.barrier()"),
        ),
    ),
)
RANKS = 2000


def _job() -> JobSnapshot:
    """2000 ranks in three main-thread stacks (every rank's frames built anew, as capture
    does), each with a pin-memory thread; every seventh rank has native frames in its last
    sample (a dump taken on demand)."""
    ranks = []
    for r in range(RANKS):
        main = IN_FINALLY if r % 500 == 3 else COMPUTE if r == 7 else ALL_REDUCE
        stacks = None
        if r % 7 == 0 and main is ALL_REDUCE:
            stacks = [main, main, [*main, *NATIVE]]
        ranks.append(
            make_rank(
                r,
                main,
                stacks=stacks,
                threads={"pin_memory": PIN},
                active=r == 7,
                cpu_per_sample=0.5 if r == 7 else 0.0,
            )
        )
    return make_snapshot(ranks, sources=SOURCES)


def _count(monkeypatch: pytest.MonkeyPatch, name: str) -> Counter[Any]:
    """Count the calls of ``ops.<name>`` (the uncached work), by thread key and arguments."""
    calls: Counter[Any] = Counter()
    inner: Callable[..., Any] = getattr(ops, name)

    def counted(thread: ThreadStack, *args: Any) -> Any:
        calls[(thread_key(thread), *args[1:])] += 1
        return inner(thread, *args)

    monkeypatch.setattr(ops, name, counted)
    return calls


def _unmemoised(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every thread its own key: the recogniser works every thread out again."""
    monkeypatch.setattr(ops, "thread_key", lambda thread: (object(),))


def test_a_2000_rank_job_recognises_each_distinct_thread_once(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = _job()
    recognised = _count(monkeypatch, "_recognise")
    marked = _count(monkeypatch, "_cleanup_marker")
    d = analyse(snap)
    assert d.verdict is Verdict.CLEANUP_DEADLOCK and d.culprit_ranks == (3, 503, 1003, 1503)
    assert recognised and set(recognised.values()) == {1}, "a thread was recognised twice"
    assert marked and set(marked.values()) == {1}, "a cleanup marker was looked for twice"
    # the three main stacks, the all-reduce one with native frames too, and the pin-memory
    # thread of the one rank whose main thread is in no op
    assert len(recognised) == 5
    main_stacks = {key[0] for (key,) in recognised if key[3]}
    assert len(main_stacks) == 4


def test_the_memoised_diagnosis_is_the_unmemoised_one(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = _job()
    memoised = analyse(snap)
    with monkeypatch.context() as patched:
        _unmemoised(patched)
        recognised = _count(patched, "_recognise")
        plain = analyse(snap)
        assert sum(recognised.values()) >= 4 * RANKS  # really unmemoised
    assert memoised == plain
    assert memoised.tree == plain.tree
    assert to_json_dict(memoised, snap) == to_json_dict(plain, snap)


def test_each_thread_gets_the_answer_recognising_it_alone_gives() -> None:
    snap = _job()
    rec = Recogniser(snap)
    alone = SourceIndex(snap.sources)
    for rank in snap.ranks[:50] + snap.ranks[495:510]:
        for sample in rank.samples:
            for thread in sample.threads:
                assert rec.recognise(thread) == ops._recognise(thread, alone)
                for blocks in (("finally",), ("finally", "except")):
                    assert rec.cleanup_marker(thread, blocks) == ops._cleanup_marker(thread, alone, blocks)


# ---------------------------------------------------------------- every part of the key

WAITING = [*OUTER, make_frame("/job/train.py:overlap:44", code="work.wait()")]
OVERLAP = SourceFile(
    "/job/train.py",
    (
        (40, "def overlap(t):"),
        (41, "    work = dist.all_reduce(t, async_op=True)"),
        (42, "    compute()"),
        (43, "    log()"),
        (44, "    work.wait()"),
    ),
)
EXIT_HANDLER = ["train.py:on_exit:12", f"{C10D}:barrier:4100"]  # no <module> below: atexit


@pytest.mark.parametrize("first", [False, True], ids=["idle-first", "active-first"])
def test_the_same_frames_on_and_off_cpu_are_recognised_apart(first: bool) -> None:
    """A ``.wait()`` line of an idle thread waits; on CPU, the same line is no wait."""
    rec = Recogniser(make_snapshot({0: []}, sources=(OVERLAP,)))
    ops_seen = {active: rec.recognise(make_thread(WAITING, active=active)) for active in (first, not first)}
    assert ops_seen[True] is None
    idle = ops_seen[False]
    assert idle is not None and idle.name == "all_reduce" and "line 41" in idle.via


@pytest.mark.parametrize("main_first", [True, False], ids=["main-first", "other-first"])
def test_the_same_frames_in_the_main_thread_and_another_are_recognised_apart(main_first: bool) -> None:
    """Exit handlers are looked for in the main thread only."""
    rec = Recogniser(None)
    names = ("MainThread", "Thread-1") if main_first else ("Thread-1", "MainThread")
    seen = {name: rec.recognise(make_thread(EXIT_HANDLER, name=name)) for name in names}
    main, other = seen["MainThread"], seen["Thread-1"]
    assert main is not None and main.in_cleanup and main.cleanup_frame is not None
    assert other is not None and not other.in_cleanup
    marker = {name: rec.cleanup_marker(make_thread(EXIT_HANDLER, name=name)) for name in names}
    assert marker["MainThread"] is not None and marker["Thread-1"] is None


def test_frames_that_differ_only_in_their_source_line_are_recognised_apart() -> None:
    """The key holds the frames whole: ``code`` too (a ``@contextmanager`` exiting normally
    or with an exception thrown into it)."""

    def zero_first(exit_line: str) -> ThreadStack:
        return make_thread(
            [
                *OUTER,
                make_frame("contextlib.py:_GeneratorContextManager.__exit__:144", code=exit_line),
                "train.py:zero_first:30",
                f"{C10D}:barrier:4100",
            ]
        )

    rec = Recogniser(None)
    normal = rec.recognise(zero_first("next(self.gen)"))
    thrown = rec.recognise(zero_first("self.gen.throw(typ, value, traceback)"))
    assert normal is not None and not normal.in_cleanup
    assert thrown is not None and thrown.in_cleanup


def test_what_recognition_ignores_is_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids, the name beyond 'main or not' and ``owns_gil`` are not in the key: threads that
    differ only there are recognised once."""
    recognised = _count(monkeypatch, "_recognise")
    rec = Recogniser(None)
    threads = [
        ThreadStack(tid, name, make_thread(ALL_REDUCE).frames, tid + 1, False, gil)
        for tid, name, gil in ((1, "Thread-1", False), (2, "Thread-2", True), (3, None, False))
    ]
    answers = {rec.recognise(t) for t in threads}
    assert len(answers) == 1 and None not in answers
    assert sum(recognised.values()) == 1


def test_recognising_one_thread_alone_still_works() -> None:
    op = recognise(make_thread(WAITING), make_snapshot({0: []}, sources=(OVERLAP,)))
    assert op is not None and op.name == "all_reduce"
    assert ops.cleanup_marker(make_thread(EXIT_HANDLER), None) is not None


# ThreadStack's methods and properties, by the part of the key they read
_READS_OF = {"locals_at": "locals", "innermost": "frames", "innermost_python": "frames"}


class _Reads:
    """A thread that records which of its attributes are read."""

    def __init__(self, thread: ThreadStack, read: set[str]) -> None:
        self._thread, self._read = thread, read

    def __getattr__(self, name: str) -> Any:
        self._read.add(_READS_OF.get(name, name))
        return getattr(self._thread, name)


# what ``thread_key`` holds, by the attribute recognition reads, and a change to that
# attribute alone (``is_main`` is read through the name)
_KEYED: dict[str, Callable[[ThreadStack], ThreadStack]] = {
    "frames": lambda t: replace(t, frames=(*t.frames, make_frame("x.py:f:1"))),
    "locals": lambda t: replace(t, locals=(*t.locals, FrameLocals(0, (("group", "None"),)))),
    "active": lambda t: replace(t, active=not t.active),
    "is_main": lambda t: replace(t, name="Thread-9" if t.is_main else "MainThread"),
}


def _recorded_threads() -> list[tuple[ThreadStack, SourceIndex]]:
    threads: list[tuple[ThreadStack, SourceIndex]] = []
    snaps = [load_snapshot(p) for p in sorted((TESTS / "snapshots").glob("*.json.gz"))]
    for snap in [*snaps, _job()]:
        index, seen = SourceIndex(snap.sources), set()
        for rank in snap.ranks:
            for sample in rank.samples:
                for thread in sample.threads:
                    if thread_key(thread) not in seen:
                        seen.add(thread_key(thread))
                        threads.append((thread, index))
    return threads


def test_recognition_reads_of_a_thread_only_what_its_key_holds() -> None:
    """On every distinct thread of the recorded corpus: a new read of a thread fails here
    until ``ops.thread_key`` holds it, and each part of the key changes the key."""
    read: set[str] = set()
    threads = _recorded_threads()
    assert len(threads) > 50
    for thread, index in threads:
        proxy: Any = _Reads(thread, read)
        ops._recognise(proxy, index)
        ops._cleanup_marker(proxy, index, ("finally",))
    unkeyed = read - set(_KEYED)
    assert not unkeyed, f"recognition reads ThreadStack.{sorted(unkeyed)}: add it to ops.thread_key"
    assert {"frames", "active", "is_main"} <= read  # keyed and read (``locals`` only with locals)
    thread = threads[0][0]
    for attr, change in _KEYED.items():
        assert thread_key(change(thread)) != thread_key(thread), attr


def test_every_field_of_a_thread_is_keyed_or_known_to_be_ignored() -> None:
    """A new ``ThreadStack`` field is a decision: does recognition read it? If it does, add
    it to ``ops.thread_key`` (and ``_KEYED``); if not, to the ignored ones here."""
    ignored = {"thread_id", "name", "native_id", "owns_gil"}  # name: only as is_main
    fields = {f.name for f in dataclasses.fields(ThreadStack)}
    assert fields == ignored | (set(_KEYED) - {"is_main"}), sorted(fields)


def test_the_source_index_reads_each_file_once_and_the_first_of_a_name() -> None:
    first = SourceFile("/job/a.py", ((1, "one"),))
    index = SourceIndex([first, SourceFile("/job/a.py", ((1, "other"),))])
    lines = index.lines("/job/a.py")
    assert lines == {1: "one"} and index.lines("/job/a.py") is lines
    assert index.lines("/job/b.py") is None


def test_a_recogniser_never_scans_the_snapshot_for_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = make_snapshot({0: []}, sources=(SourceFile("/job/other.py", ()), *SOURCES))

    def scan(self: JobSnapshot, filename: str) -> SourceFile | None:
        raise AssertionError("JobSnapshot.source scans every file")

    monkeypatch.setattr(JobSnapshot, "source", scan)
    rec = Recogniser(snap)
    op = rec.recognise(make_thread(IN_FINALLY))
    assert op is not None and op.in_cleanup  # line 64 sits in a ``finally:``
    assert rec.cleanup_marker(make_thread(IN_FINALLY)) is not None
