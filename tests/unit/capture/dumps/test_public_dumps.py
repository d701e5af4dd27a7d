"""``hangdoc analyze`` on stack dumps of hung NCCL jobs posted in public logbooks (issue 13:
"real dumps of hung NCCL jobs posted in public issues, fed to `hangdoc analyze` as text, get
the verdict and culprits their investigations established").

Each ``tests/data/dumps/public/NAME.txt`` is quoted as posted (only markdown fences and the
text between quotes left out); its sibling ``NAME.md`` gives the source, quotes what the
investigation established and states the expected verdict and culprits. The dumps show no
ranks, so ranks are the file's order and culprits are compared by pid. Where hangdoc is
wrong the test is ``xfail(strict=True)`` and says which frames and which rule mislead it.

The parser variants these posts need (a grouped post listing several processes' main-thread
headers above the one stack they share; py-spy 0.3's ``Reason:`` lines under its error)
have their own tests at the end.
"""

from __future__ import annotations

import json
import re

import pytest
from support.paths import TESTS

from hangdoc.capture.dumps.dumpfile import load_evidence
from hangdoc.capture.dumps.dumptext import parse_text
from hangdoc.cli import main
from hangdoc.model import CaptureErrorKind

PUBLIC = TESTS / "data" / "dumps" / "public"
BLOOM_EVAL = "bloom176b_eval_dataloader_deadlock.txt"
M4_SLEEP = "m4_tr141_rank0_uninterruptible_sleep.txt"
BLOOM_PREQUEL = "bloom_prequel_host_sync_after_step.txt"


def analyze(capsys: pytest.CaptureFixture[str], name: str) -> dict:
    """The ``hangdoc analyze FILE --json`` report of a public dump."""
    assert main(["analyze", str(PUBLIC / name), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def by_pid(report: dict) -> dict[int, dict]:
    return {r["pid"]: r for r in report["ranks"]}


def culprit_pids(report: dict) -> list[int]:
    culprits = set(report["culprit_ranks"])
    return sorted(r["pid"] for r in report["ranks"] if r["rank"] in culprits)


# ------------------------------------------------------------------- the record


@pytest.mark.parametrize("name", [BLOOM_EVAL, M4_SLEEP, BLOOM_PREQUEL])
def test_each_public_dump_says_where_it_comes_from_and_what_to_expect(name: str) -> None:
    note = (PUBLIC / name).with_suffix(".md").read_text()
    assert re.search(r"<https://github\.com/[\w.-]+/[\w.-]+/blob/[0-9a-f]{40}/", note), name
    for section in (
        "## Source",
        "## What was taken, what was removed",
        "## What the investigation established",
        "## Expected",
    ):
        assert section in note, (name, section)


# ------------------------------------------------------------------- BLOOM-176B eval hang


def test_bloom176b_eval_hang_names_the_rank_in_its_dataloader(capsys) -> None:
    """bigscience tr11-176B-ml, 2022-04-30/05-18: 16 processes of a 2-node reproduction
    (TP=4, PP=2, DP=2) hung at eval; pid 688514 waits for a batch from its deadlocked
    DataLoader worker (``_try_get_data``), the other 15 wait in the eval step's broadcast,
    all_reduce and recv. The logbook's fix: ``num_workers=0`` for the eval DataLoaders."""
    report = analyze(capsys, BLOOM_EVAL)
    assert (report["verdict"], culprit_pids(report)) == ("straggler", [688514])
    ranks = by_pid(report)
    assert len(ranks) == 16
    waiting = {pid: r["op"]["name"] for pid, r in ranks.items() if pid != 688514}
    assert all(r["state"] == "waiting" for pid, r in ranks.items() if pid != 688514)
    assert sorted(set(waiting.values())) == ["all_reduce", "broadcast", "recv"]
    assert [pid for pid, op in waiting.items() if op == "recv"] == [686185, 686186, 686187, 686188]


# ------------------------------------------------------------------- m4 tr_141


def test_m4_hang_names_the_rank_py_spy_could_not_read(capsys) -> None:
    """HuggingFace m4-logs tr_141: node 0's rank 0 (pid 280058) sat in uninterruptible sleep
    on a frozen filesystem, so py-spy could not suspend it (EPERM); every process that
    answered was in accelerate's ``wait_for_everyone`` barrier."""
    report = analyze(capsys, M4_SLEEP)
    assert (report["verdict"], culprit_pids(report)) == ("straggler", [280058])
    ranks = by_pid(report)
    assert ranks[280058]["state"] == "unreadable"
    assert "EPERM: Operation not permitted" in ranks[280058]["detail"]
    assert (ranks[280064]["state"], ranks[280064]["op"]["name"]) == ("waiting", "barrier")


def test_m4_wait_for_everyone_barrier_is_not_cleanup(capsys) -> None:
    """The posted stack is cut after 3 frames (the author's ``grep -A2``): a main thread
    without ``<module>`` in pasted text is no sign of an exit handler (it is in a live
    capture, where atexit calls the handler from C), so the barrier is the training loop's
    own sync point, not cleanup."""
    op = by_pid(analyze(capsys, M4_SLEEP))[280064]["op"]
    assert not op["in_cleanup"], op["cleanup_site"]


# ------------------------------------------------------------------- BLOOM prequel


@pytest.mark.xfail(
    strict=True,
    reason=(
        "hangdoc says straggler with culprit rank 0 (pid 835990, 'idle outside any distributed "
        "op' at train (megatron/training.py:915)). The logbook established the 6 processes there "
        "had finished train_step and wait in all_reduce(done_cuda) (line 915 is "
        "`done = done_cuda.item()`, a host sync after the NCCL all_reduce), while the 2 in "
        "DeepSpeed's _aggregate_total_loss broadcast never finished train_step: a "
        "collective_mismatch in which rank 0 is not the culprit. analysis/host_sync.py cannot see "
        "it: rule 1 needs a torch synchronize frame, rule 2 native frames, rule 3 the line's "
        "code, and a dump file has none of them. A likely fix: with no source lines, a rank "
        "whose innermost frame is the job's own code in the same function that issues the "
        "others' collectives (here `train`, the caller of train_step) should not be a "
        "high/medium-confidence straggler culprit; report it as possibly at a host sync "
        "(straggler at low confidence, or unknown, naming both readings), or read the line "
        "when the job's source is at hand"
    ),
)
def test_bloom_prequel_rank_at_a_host_sync_is_not_the_culprit(capsys) -> None:
    """bigscience tr11-176B-ml prequel, "Hanging Issue": one node's 8 TP processes, posted
    as one stack per group; 6 at ``train (megatron/training.py:915)``, 2 in ``broadcast``
    inside ``train_step``. Why they diverged was never found (``CUDA_LAUNCH_BLOCKING=1``
    made it go away); which ranks sat in which op was."""
    report = analyze(capsys, BLOOM_PREQUEL)
    assert report["verdict"] == "collective_mismatch"
    assert 835990 not in culprit_pids(report)


def test_bloom_prequel_straggler_reading_is_doubted_in_words(capsys) -> None:
    """What hangdoc can soundly say of this file: with no source line and no native frames,
    rank 0's line may be a host sync, so its straggler reading is low confidence and the
    basis says what would settle it (the xfail above is what the logbook established)."""
    report = analyze(capsys, BLOOM_PREQUEL)
    assert (report["verdict"], report["confidence"]) == ("straggler", "low")
    basis = " · ".join(report["basis"])
    assert (
        "rank 0 is on a line of the job that capture does not show (training.py:915): if it "
        "waits for a GPU (`.item()`, `.cpu()`, `synchronize()`), the rank has issued its "
        "collective and waits, and is no straggler"
    ) in basis


# ------------------------------------------------------------------- parser variants


def parse(text: str):  # type: ignore[no-untyped-def]
    dumps, skipped = parse_text(text.splitlines(), "test.txt")
    assert skipped == 0
    return dumps


GROUPED = """\
4 in:
Thread 201 (active): "MainThread"
Thread 202 (active): "MainThread"
Thread 203 (idle): "MainThread"
    broadcast (torch/distributed/distributed_c10d.py:1191)
    train (train.py:40)
1 in:
Thread 204 (idle): "MainThread"
    get (queue.py:179)
    train (train.py:30)
"""


def test_grouped_main_thread_headers_each_are_a_process_with_the_stack_below() -> None:
    dumps = parse(GROUPED)
    assert [d.threads[0].thread_id for d in dumps] == [201, 202, 203, 204]
    assert [len(d.threads) for d in dumps] == [1, 1, 1, 1]
    functions = [[f.function for f in d.threads[0].frames] for d in dumps]
    assert functions == [["train", "broadcast"]] * 3 + [["train", "get"]]
    # each keeps its own header: id and status
    assert [d.threads[0].active for d in dumps] == [True, True, False, False]
    assert dumps[0].label == "4 in:" and dumps[3].label == "1 in:"


def test_a_public_grouped_post_reads_as_one_process_per_header() -> None:
    snapshot = load_evidence(PUBLIC / BLOOM_EVAL)
    assert len(snapshot.ranks) == 16
    assert all(r.samples[0].threads and r.samples[0].threads[0].frames for r in snapshot.ranks)
    assert {r.process.pid for r in snapshot.ranks} >= {688510, 688511, 599212, 599213, 686188}


@pytest.mark.parametrize(
    "text",
    [
        # a blank line between two headers: two pasted main threads, the first without frames
        'Thread 201 (idle): "MainThread"\n\nThread 202 (idle): "MainThread"\n    f (a.py:1)\n',
        # a line of prose between them
        'Thread 201 (idle): "MainThread"\nthen:\nThread 202 (idle): "MainThread"\n    f (a.py:1)\n',
    ],
)
def test_main_thread_headers_apart_are_not_grouped(text: str) -> None:
    first, second = parse(text)
    assert first.threads[0].frames == () and len(second.threads[0].frames) == 1


def test_frameless_side_threads_of_one_process_take_no_frames() -> None:
    """py-spy prints threads without Python frames as bare headers (DeepSpeed#6524's dumps:
    ``Thread 4076 (idle)`` lines above ``Thread 4079 (active)`` and its frames): they are
    threads of the process above, not grouped processes."""
    dumps = parse(
        'Thread 40 (idle): "MainThread"\n    main (t.py:9)\n'
        "Thread 4076 (idle)\nThread 4077 (idle)\nThread 4079 (active)\n"
        "    all_gather_into_tensor (torch/distributed/distributed_c10d.py:2709)\n"
    )
    (dump,) = dumps
    assert [(t.thread_id, len(t.frames)) for t in dump.threads] == [(40, 1), (4076, 0), (4077, 0), (4079, 1)]


def test_grouped_headers_after_a_process_line_stay_one_process() -> None:
    dumps = parse(
        'Process 300: python t.py\nThread 300 (idle): "MainThread"\nThread 301 (idle): "MainThread"\n    f (t.py:1)\n'
    )
    (dump,) = dumps
    assert dump.pid == 300 and [len(t.frames) for t in dump.threads] == [0, 1]


def test_py_spy_reason_lines_are_part_of_its_error() -> None:
    """py-spy 0.3 prints each cause of an error on a ``Reason:`` line (as in m4-logs)."""
    (dump,) = parse(
        "py-spy dump --pid 280058\nProcess 280058: ...\n"
        "Error: Failed to suspend process\n"
        "Reason: EPERM: Operation not permitted\n"
        "Reason: EPERM: Operation not permitted\n"
    )
    assert dump.pid == 280058 and not dump.threads
    assert dump.error is not None and dump.error.kind is CaptureErrorKind.PTRACE_DENIED
    assert dump.error.message == "Failed to suspend process; EPERM: Operation not permitted"


def test_a_label_after_a_reason_line_starts_no_error() -> None:
    dumps = parse(
        "Error: Failed to suspend process\nReason: EPERM: Operation not permitted\n"
        'rank 1:\nThread 7 (idle): "MainThread"\n    f (t.py:1)\n'
    )
    assert [bool(d.error) for d in dumps] == [True, False]
    assert dumps[1].label == "rank 1:"
