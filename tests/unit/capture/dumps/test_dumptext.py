"""Reading py-spy's text and ``ray stack`` output (``hangdoc.capture.dumps.dumptext``).

The recorded dumps of real hung jobs are in ``tests/data/dumps/`` (``record.py`` made
them); the snippets here are written in the formats py-spy's ``src/dump.rs`` prints (and
older py-spy printed, as posted in public issues), one variation each.
"""

from __future__ import annotations

import pytest
from support.paths import TESTS

from hangdoc.capture.dumps.dumped import is_native, python_filename, text_frame
from hangdoc.capture.dumps.dumptext import MAX_LINE_CHARS, looks_like_text_dump, parse_text
from hangdoc.model import CaptureErrorKind, Origin

DUMPS = TESTS / "data" / "dumps"


def parse(text: str):  # type: ignore[no-untyped-def]
    dumps, skipped = parse_text(text.splitlines(), "test.txt")
    assert skipped == 0
    return dumps


TWO = """\
Process 101: /usr/bin/python3 train.py --local_rank=0
Python v3.10.12 (/usr/bin/python3.10)

Thread 101 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2050)
    train (train.py:40)
    <module> (train.py:60)
Thread 130 (active+gil): "Thread-1"
    run (tqdm/_monitor.py:60)
Process 102: /usr/bin/python3 train.py --local_rank=1
Python v3.10.12 (/usr/bin/python3.10)

Thread 102 (active): "MainThread"
    get (queue.py:170)
    <module> (train.py:60)
"""


def test_processes_threads_and_frames_outermost_first() -> None:
    first, second = parse(TWO)
    assert (first.pid, first.cmdline, first.python) == (101, "/usr/bin/python3 train.py --local_rank=0", "3.10.12")
    main, side = first.threads
    assert [f.function for f in main.frames] == ["<module>", "train", "all_reduce"]
    assert main.frames[-1].line == 2050 and main.is_main
    assert (side.name, side.active, side.owns_gil) == ("Thread-1", True, True)
    assert (second.pid, second.threads[0].active, second.threads[0].owns_gil) == (102, True, False)


def test_decimal_thread_ids_are_os_ids_and_hex_ones_pthread_ids() -> None:
    (dump,) = parse(
        'Thread 4711 (idle): "MainThread"\n    f (a.py:1)\nThread 0x7F12AB3C4740 (idle): "worker"\n    g (a.py:2)\n'
    )
    decimal, hexadecimal = dump.threads
    assert (decimal.thread_id, decimal.native_id) == (4711, 4711)
    assert (hexadecimal.thread_id, hexadecimal.native_id) == (0x7F12AB3C4740, None)


def test_a_thread_id_beyond_64_bits_is_one_error() -> None:
    from hangdoc.errors import DumpFileError

    with pytest.raises(DumpFileError, match="does not fit in 64 bits"):
        parse("Thread 99999999999999999999 (idle)\n    f (a.py:1)\n")


def test_unnamed_main_thread_is_named_by_its_pid() -> None:
    (dump,) = parse(
        "Process 55: python job.py\nPython v3.11.7 (/usr/bin/python3)\n\n"
        "Thread 55 (idle)\n    f (job.py:3)\nThread 56 (idle)\n    g (job.py:9)\n"
    )
    assert [t.name for t in dump.threads] == ["MainThread", None]


def test_locals_keep_torch_distributed_arguments_only() -> None:
    text = """\
Process 7: python pp.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 7 (idle): "MainThread"
    recv (torch/distributed/distributed_c10d.py:2425)
        Arguments:
            tensor: <Tensor at 0x7f00>
            src: 3
            group: None
            tag: 0
        Locals:
            group_src: 3
            secret: "s3cr3t"
    stage (pp.py:20)
        Arguments:
            batch: <Tensor at 0x7f01>
    <module> (pp.py:40)
"""
    ((thread,),) = [d.threads for d in parse(text)]
    (kept,) = thread.locals
    assert kept.index == 2 and thread.frames[2].function == "recv"
    assert dict(kept.values) == {"src": "3", "group": "None", "tag": "0", "group_src": "3"}


def test_locals_in_the_format_of_py_spy_before_0_4() -> None:
    """py-spy 0.3 printed the block headers with a doubled colon."""
    text = (
        'Thread 7 (idle): "MainThread"\n    send (torch/distributed/distributed_c10d.py:1)\n'
        "        Arguments::\n            dst: 2\n    main (x.py:5)\n"
    )
    (dump,) = parse(text)
    (kept,) = dump.threads[0].locals
    assert kept.get("dst") == "2"


def test_native_frames_and_python_frames_told_apart() -> None:
    text = """\
Thread 3542 (idle): "MainThread"
    0x7f796d4a3f16 (libc.so.6)
    std::condition_variable::wait (libstdc++.so.6.0.30)
    c10d::ProcessGroupGloo::RecvWork::wait (ProcessGroupGloo.cpp:812)
    select_poll_poll (selectmodule.c.h:223)
    all_reduce (torch/distributed/distributed_c10d.py:3252)
    <module> (torchrun:8)
    Py_RunMain (python3.11)
"""
    (dump,) = parse(text)
    frames = dump.threads[0].frames  # outermost first
    assert [f.native for f in frames] == [True, False, False, True, True, True, True]
    assert frames[1].filename == "torchrun" and frames[1].line == 8
    assert frames[-3].line == 812 and frames[-3].function.startswith("c10d::")


def test_old_tab_indented_format_with_hex_ids() -> None:
    """py-spy before 0.2 (as `ray stack` printed it in 2018) indented frames with a tab."""
    text = (
        "Thread 0x7F4AACDE7700 (active)\n"
        "\t _get_next_task_from_local_scheduler (ray/worker.py:988)\n"
        "\t main_loop (ray/worker.py:1005)\n"
        "\t <module> (ray/workers/default_worker.py:105)\n"
    )
    (dump,) = parse(text)
    (thread,) = dump.threads
    assert thread.native_id is None and thread.active
    assert thread.frames[0].function == "<module>"


def test_threads_without_frames_and_pasted_stacks_without_headers() -> None:
    """Without `Process` lines, a second MainThread starts another process."""
    text = (
        'Thread 4888 (idle): "MainThread"\n    train (t.py:411)\n'
        "Thread 8283 (idle)\nThread 8284 (idle)\n"
        'Thread 4886 (idle): "MainThread"\n    train (t.py:411)\n'
    )
    first, second = parse(text)
    assert first.pid is None and len(first.threads) == 3
    assert first.threads[1].frames == () and len(second.threads) == 1


def test_labels_are_kept_for_the_dump_that_follows() -> None:
    text = (
        '$ for p in 101 102; do echo "== rank $p =="; py-spy dump --pid $p; done\n'
        "== rank 3 ==\n" + TWO.split("Process 102")[0] + "== rank 1 ==\nProcess 102" + TWO.split("Process 102")[1]
    )
    first, second = parse(text)
    assert first.label.endswith("== rank 3 ==") and second.label == "== rank 1 =="


def test_py_spy_errors_make_dumps_without_threads() -> None:
    text = """\
== pid 9 ==
Error: Permission Denied: Try running again with elevated permissions by going 'sudo env "PATH=$PATH" !!'
== pid 10 ==
Error: Failed to find python version from target process

Stack backtrace:
   0: anyhow::error::<impl anyhow::Error>::msg
   1: py_spy::python_process_info::get_python_version
== pid 11 ==
Error: Failed to get process executable name. Check that the process is running.

Caused by:
    0: No such process (os error 3)
"""
    denied, not_python, gone = parse(text)
    assert denied.error is not None and denied.error.kind is CaptureErrorKind.PTRACE_DENIED
    assert not_python.error is not None and not_python.error.kind is CaptureErrorKind.NOT_PYTHON
    assert gone.error is not None and gone.error.kind is CaptureErrorKind.PROCESS_GONE
    assert "backtrace" not in not_python.error.message
    assert [d.label for d in (denied, not_python, gone)] == ["== pid 9 ==", "== pid 10 ==", "== pid 11 =="]


def test_ray_stack_lines_name_the_process_before_py_spys_header() -> None:
    text = (
        "Stack dump for ubuntu  2787  5.3  0.0 4421976 332512 pts/0  Sl   03:50   0:15 "
        "ray::Worker.train\nProcess 2787: ray::Worker.train\n"
        "Python v3.11.7 (/usr/bin/python3.11)\n\n"
        'Thread 2787 (idle): "MainThread"\n    train (w.py:3)\n\n'
        "Stack dump for ubuntu  2788  0.0  0.0 4421976 332512 pts/0  Sl   03:50   0:15 "
        "ray::IDLE\nError: Permission Denied\n\n"
    )
    worker, idle = parse(text)
    assert (worker.pid, worker.cmdline, len(worker.threads)) == (2787, "ray::Worker.train", 1)
    assert (idle.pid, idle.cmdline) == (2788, "ray::IDLE") and idle.error is not None


def test_too_long_lines_are_skipped_and_counted() -> None:
    text = 'Thread 1 (idle): "MainThread"\n    f (a.py:1)\n' + "x" * (MAX_LINE_CHARS + 1) + "\n"
    dumps, skipped = parse_text(text.splitlines(), "t")
    assert skipped == 1 and len(dumps) == 1


def test_what_counts_as_a_text_dump() -> None:
    assert looks_like_text_dump(["hello", "Thread 12 (idle)"])
    assert looks_like_text_dump(["Process 1: python x.py"])
    assert not looks_like_text_dump(["hello world", '  "thread_id": 12,'])


@pytest.mark.parametrize(
    ("shown", "kind", "package"),
    [
        ("torch/distributed/distributed_c10d.py", Origin.TORCH, "torch"),
        ("threading.py", Origin.STDLIB, ""),
        ("multiprocessing/queues.py", Origin.STDLIB, ""),
        ("deepspeed/comm/comm.py", Origin.LIBRARY, "deepspeed"),
        ("ray/_private/worker.py", Origin.LIBRARY, "ray"),
        ("train.py", Origin.USER, ""),
        ("fairseq_cli/train.py", Origin.USER, ""),
        ("/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", Origin.TORCH, "torch"),
    ],
)
def test_short_file_names_keep_their_origin(shown: str, kind: Origin, package: str) -> None:
    frame = text_frame("f", shown, 3, "3.10.12")
    assert (frame.origin.kind, frame.origin.package) == (kind, package)
    assert (
        frame.short_filename == shown.rsplit("site-packages/", 1)[-1].rsplit("/lib/", 1)[-1]
        or frame.short_filename == shown.rsplit("/", 1)[-1]
    )


def test_python_filename_marks_what_py_spy_left_out() -> None:
    assert python_filename("torch/nn/x.py") == "…/site-packages/torch/nn/x.py"
    assert python_filename("threading.py", "3.10.12") == "…/lib/python3.10/threading.py"
    assert python_filename("<frozen importlib._bootstrap>") == "<frozen importlib._bootstrap>"
    assert is_native("libc.so.6", None) and is_native("?", None) and not is_native("t.py", None)


def test_recorded_native_dump_reads_every_process() -> None:
    dumps = parse((DUMPS / "straggler_forked_worker_lock_native.txt").read_text())
    assert [d.pid for d in dumps] == [3542, 3541, 3540]
    assert all(d.threads and any(f.native for t in d.threads for f in t.frames) for d in dumps)
