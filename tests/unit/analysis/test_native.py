"""The one question capture asks the analysis: does one native sample of this rank show
where it waits."""

from __future__ import annotations

import pytest
from support.factories import make_frame, make_rank

from hangdoc.analysis.native import needs_native
from hangdoc.model import CaptureErrorKind, Frame

BACKWARD = ["train.py:main:30", "torch/_tensor.py:backward:626", "torch/autograd/graph.py:_engine_run_backward:823"]
SYNC = ["train.py:main:30", "torch/cuda/__init__.py:synchronize:1083"]
ITEM = ["train.py:main:31"]
LINES = {31: "    total += loss.item()"}


def code(frame: Frame) -> str | None:
    return LINES.get(frame.line) if frame.line else None


@pytest.mark.parametrize(
    ("stack", "kwargs", "wanted"),
    [
        (BACKWARD, {}, True),  # idle in the autograd engine
        (BACKWARD, {"active": True}, False),  # computing there: its Python stack says so
        (BACKWARD, {"threads": {"TrainingThread(train_func)": BACKWARD}, "active": True}, True),  # any thread
        (SYNC, {}, True),  # torch's own synchronize
        (ITEM, {"env": {"CUDA_VISIBLE_DEVICES": "0"}}, True),  # a host-syncing line on a GPU rank
        (ITEM, {}, False),  # the same line on a rank that shows no GPU
        (["train.py:main:32"], {"env": {"CUDA_VISIBLE_DEVICES": "0"}}, False),
        (SYNC, {"error": CaptureErrorKind.PTRACE_DENIED}, False),  # no stacks to read
    ],
)
def test_needs_native(stack, kwargs, wanted) -> None:
    rank = make_rank(0, stack, **kwargs)
    assert needs_native(rank.samples, rank.process, code) is wanted


def test_native_frames_already_there_answer_it() -> None:
    rank = make_rank(0, [*SYNC, make_frame("libcudart.so:cudaStreamSynchronize", native=True)])
    assert needs_native(rank.samples, rank.process, code) is False
