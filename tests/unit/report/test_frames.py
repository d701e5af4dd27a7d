"""Which frames a report shows and in what words (``report.frames``): the job's own frames a
line each, a run of one library's frames one line named after the function the job called.
The terminal's tree and the ``--svg`` picture both show these rows (their own tests check
that they do)."""

from __future__ import annotations

import pytest
from support.factories import make_frame

from hangdoc.model import Frame
from hangdoc.report.frames import RowKind, fold, library_name, package

RUNPY = ["<frozen runpy>:_run_module_as_main:198", "<frozen runpy>:_run_code:88"]


def test_own_frames_are_rows_of_their_own_and_library_runs_fold_per_package() -> None:
    step = make_frame("train.py:step:9", code="  dist.all_reduce(x)  ")
    frames = [
        *(make_frame(f) for f in RUNPY),
        make_frame("train.py:main:5"),
        step,
        make_frame("torch/distributed/c10d_logger.py:wrapper:81"),
        make_frame("torch/distributed/distributed_c10d.py:all_reduce:2800"),
        make_frame("numpy/core/numeric.py:asarray:10"),
        make_frame("libnccl.so:ncclWait", native=True),
    ]
    rows = fold(frames)
    assert [(row.kind, row.frames) for row in rows] == [
        (RowKind.FOLDED, 2),  # runpy
        (RowKind.OWN, 1),
        (RowKind.OWN, 1),
        (RowKind.FOLDED, 2),  # torch
        (RowKind.LIBRARY, 1),  # a run of one is not folded
        (RowKind.NATIVE, 1),
    ]
    assert sum(row.frames for row in rows) == len(frames)
    assert rows[0].words == "runpy: _run_module_as_main › _run_code (<frozen runpy>:88)"
    assert rows[2].words == str(step) and rows[2].code == step.code  # the reporter cuts it
    assert rows[3].words == "torch.distributed.all_reduce (torch/distributed/distributed_c10d.py:2800)"
    assert rows[5].words.endswith(" [native]")
    assert all(row.code is None for row in rows if row.kind is not RowKind.OWN)


def test_the_package_of_a_frame() -> None:
    assert package(make_frame("train.py:main:5")) is None
    assert package(make_frame(RUNPY[0])) == "runpy"
    assert package(make_frame("torch/distributed/distributed_c10d.py:barrier:1")) == "torch"
    assert package(make_frame("libc.so.6:poll", native=True)) == "native"
    assert library_name(make_frame("libc.so.6:poll", native=True)) is None
    assert library_name(make_frame(RUNPY[0])) is None


def test_a_long_native_run_keeps_the_frames_that_name_the_collective() -> None:
    names = ["pthread_cond_wait", "c10d::ProcessGroupNCCL::WorkNCCL::wait", "x1", "x2", "x3", "poll"]
    lib = "/venv/lib/python3.11/site-packages/torch/lib/libtorch.so"
    (row,) = fold([Frame(name, lib, native=True) for name in names])
    assert row.kind is RowKind.FOLDED and row.frames == len(names)
    said = "native: pthread_cond_wait › c10d::ProcessGroupNCCL::WorkNCCL::wait › …2 more… › x3 › poll"
    assert row.words.startswith(said)


def test_words_are_printable() -> None:
    evil = Frame("f\x1b[2J", "/venv/lib/python3.11/site-packages/torch/x\u202e.py", 1)
    (row,) = fold([evil, Frame("g", evil.filename, 2)])
    assert "\x1b" not in row.words and "\u202e" not in row.words
    assert "\\x1b" in row.words or "\\u202e" in row.words


@pytest.mark.parametrize(
    ("code", "frames", "row"),
    [
        # the caller's line names the function (a Python without qualified names in py-spy)
        ("opt.step()", ["torch/optim/optimizer.py:wrapper:493", "torch/optim/adamw.py:AdamW.step:220"],
         "torch.optim.AdamW.step (torch/optim/adamw.py:220)"),
        # no name in the line: the first frame that is no closure, then where the run ends
        ("loss = model(x)", ["torch/nn/modules/module.py:Module._wrapped_call_impl:1773",
                             "torch/nn/modules/module.py:Module._call_impl:1784",
                             "torch/nn/parallel/distributed.py:DistributedDataParallel.forward:1633"],
         "torch.nn.modules.Module._wrapped_call_impl › _call_impl › "
         "DistributedDataParallel.forward (torch/nn/parallel/distributed.py:1633)"),
        # a package's __init__.py is the package; a module of its own names itself
        ("torch.cuda.synchronize()",
         ["torch/cuda/__init__.py:synchronize:985", "torch/cuda/__init__.py:_lazy_init:300"],
         "torch.cuda.synchronize › _lazy_init (torch/cuda/__init__.py:300)"),
        ("done.wait()", ["/usr/lib/python3.11/threading.py:Event.wait:629",
                         "/usr/lib/python3.11/threading.py:Condition.wait:327"],
         "threading.Event.wait › Condition.wait (threading.py:327)"),
    ],
)  # fmt: skip
def test_a_folded_run_is_named_by_its_library_path(code: str, frames: list[str], row: str) -> None:
    stack = ["train.py:main:5", make_frame("train.py:step:9", code=code), *frames]
    *_, last = fold([make_frame(f) for f in stack])
    assert last.kind is RowKind.FOLDED and last.words == row
