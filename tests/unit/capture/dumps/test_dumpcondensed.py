"""Stacks as people paste them (issue 24 item 6): condensed frame lines under free-form
labels, top-frame summaries, tracebacks and faulthandler's output, read by
``hangdoc analyze`` (``capture/dumps/dumpcondensed``), and ``hangdoc analyze -`` on standard input.

The public threads behind ``tests/data/dumps/condensed/`` are in its README.
"""

from __future__ import annotations

import io
import json
import os

import pytest
from support.paths import TESTS

from hangdoc.capture.dumps.dumpcondensed import parse_condensed
from hangdoc.capture.dumps.dumpfile import DumpFormat, load_evidence, sniff
from hangdoc.capture.dumps.dumplabels import LabelIndex, label_count, label_ranks, world_size_in
from hangdoc.cli import main
from hangdoc.errors import DumpFileError

CONDENSED = TESTS / "data" / "dumps" / "condensed"
C10D = "torch/distributed/distributed_c10d.py"


def analyze(capsys: pytest.CaptureFixture[str], name: str) -> dict:
    assert main(["analyze", str(CONDENSED / name), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def read(text: str):  # type: ignore[no-untyped-def]
    return parse_condensed(text.splitlines(), "test.txt")


def functions(dump) -> list[str]:  # type: ignore[no-untyped-def]
    return [f.function for f in dump.threads[0].frames]


# ------------------------------------------------------------------- public threads


def test_sglang_tp0_extra_all_reduce_is_a_mismatch_naming_tp0(capsys) -> None:
    """sglang#22607: TP0 in HiCache's all_reduce, TP1-3 moved on to the next broadcast."""
    report = analyze(capsys, "sglang_22607_tp0_prefetch_all_reduce.txt")
    assert (report["verdict"], report["culprit_ranks"]) == ("collective_mismatch", [0])
    ops = {r["rank"]: r["op"]["name"] for r in report["ranks"]}
    assert ops == {0: "all_reduce", 1: "broadcast", 2: "broadcast", 3: "broadcast"}
    snapshot = load_evidence(CONDENSED / "sglang_22607_tp0_prefetch_all_reduce.txt")
    notes = " | ".join(n.words() for n in snapshot.notes)
    assert "'TP0 stuck forever in:' -> rank 0 (TP rank, taken as the global rank)" in notes
    assert "-> ranks 1-3" in notes and "ranks seen: 0-3" in notes
    assert "line 1 (text that is neither a frame nor the label of a stack)" in notes
    assert snapshot.world_size is None and snapshot.stacks_may_be_cut
    assert snapshot.ranks[2].process.rank_evidence.startswith("the label 'while TP1-3 had already moved on")


def test_lightning_rank0_pystack_alone_names_no_culprit(capsys) -> None:
    """Lightning#11267: only rank 0's stack (pystack, outermost first) was posted."""
    report = analyze(capsys, "lightning_11267_rank0_broadcast_pystack.txt")
    assert report["culprit_ranks"] == [] and report["confidence"] in ("low", None)
    assert report["verdict"] in ("unknown", "nccl_timeout")
    (rank,) = report["ranks"]
    assert (rank["rank"], rank["state"], rank["op"]["name"]) == (0, "waiting", "broadcast_object_list")
    snapshot = load_evidence(CONDENSED / "lightning_11267_rank0_broadcast_pystack.txt")
    frames = snapshot.ranks[0].samples[0].threads[0].frames
    assert frames[0].function == "run" and frames[-1].function == "broadcast"
    assert frames[0].code == "output = self.on_run_end()"


def test_deepspeed_faulthandler_dump_of_one_process_names_no_culprit(capsys) -> None:
    """DeepSpeed#860: faulthandler's output of one process, innermost first."""
    report = analyze(capsys, "deepspeed_860_zero3_inference_faulthandler.txt")
    assert report["culprit_ranks"] == [] and report["confidence"] in ("low", None)
    (rank,) = report["ranks"]
    assert rank["state"] == "waiting"
    snapshot = load_evidence(CONDENSED / "deepspeed_860_zero3_inference_faulthandler.txt")
    (thread,) = snapshot.ranks[0].samples[0].threads
    assert thread.thread_id == 0x00007F57CAF71740 and thread.is_main
    assert thread.frames[0].function == "_call_impl"
    assert thread.frames[-1].function == "synchronize" and thread.frames[-1].line == 95


def test_sglang_every_tp_rank_at_one_host_sync_names_no_culprit(capsys) -> None:
    """sglang#36702: one stack under 'TP0–TP7', with native frames named without their
    library and a '...' cut; every rank waits for its device at the same host sync."""
    name = "sglang_36702_dcp_all_ranks_stream_sync.txt"
    report = analyze(capsys, name)
    assert report["culprit_ranks"] == [] and report["confidence"] in ("low", None)
    assert report["verdict"] in ("unknown", "nccl_timeout")
    assert [r["rank"] for r in report["ranks"]] == list(range(8))
    assert {r["state"] for r in report["ranks"]} == {"waiting"}
    snapshot = load_evidence(CONDENSED / name)
    frames = snapshot.ranks[0].samples[0].threads[0].frames
    assert len({r.samples[0].threads for r in snapshot.ranks}) == 1  # one stack, 8 ranks
    assert frames[0].function == "event_loop_overlap"
    assert [f.function for f in frames[-6:-2]] == [
        "torch::autograd::THPVariable_getitem",
        "at::_ops::index_Tensor::call",
        "at::native::nonzero_cuda",
        "at::native::nonzero_cuda_out_impl<bool>",
    ]
    assert all(f.native for f in frames[-6:]) and not frames[-7].native
    notes = " | ".join(n.words() for n in snapshot.notes)
    assert "-> ranks 0-7 (TP rank, taken as the global rank)" in notes
    assert "ranks seen: 0-7" in notes and "line 17 (a mark of frames left out" in notes
    assert snapshot.world_size is None and snapshot.stacks_may_be_cut


def test_sglang_tp0_alone_in_writing_check_names_no_culprit(capsys) -> None:
    """sglang#10070: only TP0's py-spy stack (under 'TP0:') of a two-rank job; its peer
    is not in the text, so nothing may be said of it."""
    name = "sglang_10070_tp0_writing_check_all_reduce.txt"
    report = analyze(capsys, name)
    assert (report["verdict"], report["culprit_ranks"]) == ("unknown", [])
    assert report["confidence"] in ("low", None)
    (rank,) = report["ranks"]
    assert (rank["rank"], rank["state"], rank["op"]["name"]) == (0, "waiting", "all_reduce")
    snapshot = load_evidence(CONDENSED / name)
    assert snapshot.world_size is None and not snapshot.nodes_searched
    assert "TP rank" in snapshot.ranks[0].process.rank_evidence


def test_function_only_fingerprints_are_refused_saying_what_is_read() -> None:
    """sglang#27489 names functions only (``all_reduce → writing_check``): no file, no line."""
    with pytest.raises(DumpFileError, match=r"no frame line \('function \(file.py:LINE\)'\)"):
        load_evidence(CONDENSED / "sglang_27489_arrow_fingerprint.txt")


# ------------------------------------------------------------------- labels


@pytest.mark.parametrize(
    ("label", "ranks", "kind"),
    [
        ("TP0 stuck in:", (0,), LabelIndex.TP),
        ("rank 3:", (3,), LabelIndex.RANK),
        ("[rank3]:", (3,), LabelIndex.RANK),
        ("ranks 1-3 had moved on to:", (1, 2, 3), LabelIndex.RANK),
        ("ranks [0, 2, 3] stopped at", (0, 2, 3), LabelIndex.RANK),
        ("GPU 5", (5,), LabelIndex.LOCAL),
        ("worker-2:", (2,), LabelIndex.WORKER),
        ("node 1 rank 9:", (9,), LabelIndex.RANK),
        ("local rank 2:", (2,), LabelIndex.LOCAL),
    ],
)
def test_labels_that_name_ranks(label: str, ranks: tuple[int, ...], kind: LabelIndex) -> None:
    found = label_ranks(label)
    assert found is not None and (found.ranks, found.kind) == (ranks, kind)


@pytest.mark.parametrize(
    "label", ["Node 48:", "PP2 TP1", "node 3 GPU 5", "3 processes in:", "the others:", "ranks 5-2", "rank 99999999"]
)
def test_labels_that_do_not_say_which_rank(label: str) -> None:
    assert label_ranks(label) is None


def test_counts_and_world_sizes() -> None:
    assert label_count("3 processes in:") == 3 and label_count("rank 3:") is None
    assert world_size_in(["job of 8 ranks", "x"]) == (8, "job of 8 ranks")
    assert world_size_in(["WORLD_SIZE=4", "world size 4"]) is not None
    assert world_size_in(["world size 4", "world size 8"]) is None


# ------------------------------------------------------------------- forms


def test_frame_lines_under_labels_innermost_first() -> None:
    result = read(
        f"rank 0:\n    all_reduce ({C10D}:2501)\n    train (train.py:40)\n\n"
        f"ranks 1-2:\n  barrier ({C10D}:3000)\n  train (train.py:44)\n"
    )
    assert [d.rank for d in result.dumps] == [0, 1, 2]
    assert functions(result.dumps[0]) == ["train", "all_reduce"]
    assert result.dumps[1].threads == result.dumps[2].threads
    assert result.dumps[0].threads[0].frames[-1].filename.endswith("site-packages/" + C10D)


def test_native_frames_without_library_and_cut_marks_inside_a_stack() -> None:
    result = read(
        f"rank 1:\n  cudaStreamSynchronize (libcudart.so.13)\n"
        "  at::native::nonzero_cuda_out_impl<bool>\n  c10::cuda::stream_synchronize\n"
        f"  …\n  train (t.py:2)\n\nrank 2:\n  all_reduce ({C10D}:1)\n  [...]\n"
        "  main (t.py:9)\n"
    )
    assert [(d.rank, functions(d)) for d in result.dumps] == [
        (
            1,
            [
                "train",
                "c10::cuda::stream_synchronize",
                "at::native::nonzero_cuda_out_impl<bool>",
                "cudaStreamSynchronize",
            ],
        ),
        (2, ["main", "all_reduce"]),
    ]
    assert [f.native for f in result.dumps[0].threads[0].frames] == [False, True, True, True]
    assert dict(result.skipped) == {"a mark of frames left out inside a stack: the stack is cut there": (5, 10)}


def test_symbols_and_dots_outside_a_stack_are_text() -> None:
    result = read("std::thread::join\n...\nrank 0:\n  get (queue.py:171)\n")
    (dump,) = result.dumps
    assert (dump.rank, functions(dump)) == (0, ["get"])
    assert dict(result.skipped) == {"text that is neither a frame nor the label of a stack": (1, 2)}


def test_top_frame_summaries() -> None:
    result = read(f"rank 0: all_reduce ({C10D}:2501)\nrank 1: barrier ({C10D}:3000)\nrank 2 -> get (queue.py:171)\n")
    assert [(d.rank, functions(d)) for d in result.dumps] == [(0, ["all_reduce"]), (1, ["barrier"]), (2, ["get"])]


def test_unlabelled_stacks_are_one_process_each_and_count_labels_repeat() -> None:
    result = read(
        f"all_reduce ({C10D}:1)\ntrain (t.py:2)\n\nbarrier ({C10D}:3)\n\n3 processes in:\n  get (queue.py:171)\n"
    )
    assert [functions(d)[-1] for d in result.dumps] == ["all_reduce", "barrier"] + ["get"] * 3
    assert all(d.rank is None for d in result.dumps)


def test_python_traceback_is_outermost_first_with_source_lines() -> None:
    result = read(
        "Traceback (most recent call last):\n"
        '  File "/x/train.py", line 40, in <module>\n    main()\n'
        '  File "/x/train.py", line 12, in main\n    dist.barrier()\n'
        "               ^^^^^^^^^^^^^^\n"
        '  File "/usr/lib/python3.11/site-packages/torch/distributed/'
        'distributed_c10d.py", line 3696, in barrier\n'
        "    work = default_pg.barrier(opts=opts)\n"
    )
    (dump,) = result.dumps
    assert functions(dump) == ["<module>", "main", "barrier"]
    assert dump.threads[0].frames[1].code == "dist.barrier()"
    assert not result.skipped


def test_print_stack_without_header_is_outermost_first() -> None:
    (dump,) = read('  File "/x/t.py", line 3, in <module>\n    f()\n  File "/x/t.py", line 2, in f\n    g()\n').dumps
    assert functions(dump) == ["<module>", "f"]


def test_faulthandler_threads_of_one_process() -> None:
    result = read(
        "Fatal Python error: Aborted\n\n"
        "Thread 0x00007f0000000002 (most recent call first):\n"
        '  File "/x/threading.py", line 320 in wait\n\n'
        "Current thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/x/torch/distributed/distributed_c10d.py", line 9 in all_reduce\n'
        '  File "/x/t.py", line 4 in <module>\n'
    )
    (dump,) = result.dumps
    assert [t.thread_id for t in dump.threads] == [0x7F0000000002, 0x7F0000000001]
    assert [t.is_main for t in dump.threads] == [False, True]
    assert functions(replace_first(dump)) == ["<module>", "all_reduce"]


def replace_first(dump):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    return replace(dump, threads=dump.threads[1:])


def test_torchrun_prefixes_and_markdown_are_read_through() -> None:
    result = read(
        "```\n"
        "[rank1]:Thread 0x0000000000000001 (most recent call first):\n"
        "[rank0]:Thread 0x0000000000000002 (most recent call first):\n"
        '[rank1]:  File "/x/t.py", line 2 in f\n'
        '[rank0]:  File "/x/t.py", line 3 in g\n'
        "```\n> rank 2:\n> h (t.py:4)\n"
    )
    assert sorted((d.rank, functions(d)[0]) for d in result.dumps) == [(0, "g"), (1, "f"), (2, "h")]


def test_py_spy_variables_are_passed_over_and_prose_is_said() -> None:
    result = read(
        f"some words here\nmore words\n\nrank 4:\n  all_reduce ({C10D}:1)\n"
        "      Arguments:\n          tensor: <Tensor>\n  train (t.py:2)\n"
        "that is all\n"
    )
    (dump,) = result.dumps
    assert (dump.rank, functions(dump)) == (4, ["train", "all_reduce"])
    assert dict(result.skipped) == {
        "text that is neither a frame nor the label of a stack": (1, 2),
        "text after the last stack": (9,),
    }


def test_world_size_the_text_says_reaches_the_snapshot(tmp_path) -> None:
    path = tmp_path / "paste.txt"
    path.write_text(f"world size 8\nrank 3:\n  all_reduce ({C10D}:1)\n")
    snapshot = load_evidence(path)
    assert snapshot.world_size == 8 and snapshot.ranks[0].process.world_size == 8
    assert snapshot.ranks[0].process.rank == 3
    assert any("world size 8, as the text says" in n.words() for n in snapshot.notes)


def test_py_spy_json_is_not_taken_for_pasted_text() -> None:
    assert sniff('[{"pid": 1, "thread_id": 2, "frames": []}]') is DumpFormat.PYSPY_JSON
    assert sniff(f"[rank1]: all_reduce ({C10D}:1)\n") is DumpFormat.CONDENSED


def test_prose_alone_is_refused() -> None:
    assert sniff("the job hangs (see below)\nplease help\n") is None


def test_a_py_spy_dump_under_a_tp_label_takes_its_rank(tmp_path) -> None:
    path = tmp_path / "sglang.txt"
    path.write_text(
        "[2025-03-10 16:29:01 TP1] Pyspy dump for PID 4711:\n"
        "Process 4711: sglang::scheduler\n\n"
        'Thread 4711 (idle): "MainThread"\n'
        f"    broadcast ({C10D}:1)\n"
    )
    (rank,) = load_evidence(path).ranks
    assert rank.process.rank == 1 and "TP rank" in rank.process.rank_evidence


# ------------------------------------------------------------------- standard input


def test_analyze_dash_reads_standard_input(capsys, monkeypatch) -> None:
    data = (CONDENSED / "sglang_22607_tp0_prefetch_all_reduce.txt").read_bytes()
    read_fd, write_fd = os.pipe()
    os.write(write_fd, data)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as stream:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(stream))
        assert main(["analyze", "-", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["verdict"], report["culprit_ranks"]) == ("collective_mismatch", [0])


def test_analyze_dash_refuses_gzip_with_help(capsys, monkeypatch) -> None:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"\x1f\x8b\x08\x00")
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as stream:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(stream))
        assert main(["analyze", "-"]) == 6
    assert "zcat FILE.gz | hangdoc analyze -" in capsys.readouterr().err
