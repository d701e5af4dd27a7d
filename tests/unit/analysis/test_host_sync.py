"""Ranks blocked at a host sync wait for device work (``analysis.host_sync``), never compute.

There is no GPU here: the snapshots are built by hand in the shapes public reports of hung
NCCL jobs show.

- pytorch/pytorch#95944 (https://github.com/pytorch/pytorch/issues/95944): every rank of a
  multi-node job in ``torch.cuda.synchronize()`` (``cudaDeviceSynchronize``) but one, whose
  gdb stack is ``.item()``: ``_local_scalar_dense_cuda`` -> ``cudaMemcpyAsync`` -> libcuda.
- cybertronai/transformer-xl#10 (https://github.com/cybertronai/transformer-xl/issues/10):
  all 8 ranks in ``.item()`` (``cuMemcpyDtoHAsync_v2`` under ``cudaMemcpyAsync``), 100% GPU
  utilisation.
- rwth-i6/returnn#1811 (https://github.com/rwth-i6/returnn/issues/1811): py-spy shows
  ``Thread (active): "MainThread"`` with the job's own frame innermost; gdb shows libcuda
  under ``cudaStreamSynchronize``: the thread is on CPU while it waits.
- sgl-project/sglang#26454 (https://github.com/sgl-project/sglang/issues/26454): all 8 TP
  ranks in ``result.copy_done.synchronize()`` (a CUDA ``Event.synchronize``, whose Python
  frame is torch/cuda/streams.py's).
"""

from __future__ import annotations

import pytest
from support.factories import make_frame, make_rank, make_snapshot

from hangdoc.analysis.analyse import analyse
from hangdoc.analysis.host_sync import device_wait, gpu_evidence, sync_call
from hangdoc.analysis.views import view_rank
from hangdoc.model import Confidence, Frame, RankSnapshot, RankState, Verdict

C10D = "torch/distributed/distributed_c10d.py"
LOOP = ["train.py:<module>:200", "train.py:main:150"]
GPU_ENV = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
LIBCUDART = "/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"
LIBTORCH_CUDA = "/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so"


def native(*names: tuple[str, str]) -> list[Frame]:
    """Native frames, outermost first, as (function, library)."""
    return [Frame(fn, lib, None, native=True) for fn, lib in names]


# .item() as gdb shows it (pytorch#95944, transformer-xl#10), outermost first
ITEM_NATIVE = native(
    ("at::native::_local_scalar_dense_cuda(at::Tensor const&)", LIBTORCH_CUDA),
    ("cudaMemcpyAsync", LIBCUDART),
    ("0x7f5178571f92", LIBCUDA),
    ("0x14cd955ebdbc", LIBCUDA),
)


def at_item(line: int = 40, code: str = "loss_value = loss.item()") -> list[object]:
    return [*LOOP, make_frame(f"train.py:train_step:{line}", code=code)]


def spinning(rank: int, stack: list[object], world: int = 4, **kw: object) -> RankSnapshot:
    """A rank whose main thread spins a core at a host sync (on CPU, ~100%)."""
    kw.setdefault("env", GPU_ENV)
    return make_rank(rank, stack, world_size=world, active=True, cpu_per_sample=0.5, **kw)  # type: ignore[arg-type]


# -- recognition --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "call"),
    [
        ("loss_value = loss.item()", ".item()"),
        ("preds = logits.argmax(-1).tolist()", ".tolist()"),
        ("cpu_copy = t.detach().cpu()", ".cpu()"),
        ("arr = t.numpy(force=True)", ".numpy()"),
        ("torch.cuda.current_stream().synchronize()", ".synchronize()"),
        ("x = batch.cuda()", ".cuda()"),
        ('host = t.to("cpu")', ".to()"),
        ("x = batch.cuda(non_blocking=True)", None),  # from pinned memory: queued, no wait
        ("arr = t.numpy()", None),  # a CUDA tensor raises here: never a device wait
        ("x = t.to(dtype)", None),
        ("done.wait()", None),
    ],
)
def test_host_syncing_calls(code: str, call: str | None) -> None:
    assert sync_call(code) == call


def test_torch_synchronize_frames_are_device_waits_without_any_other_evidence() -> None:
    for inner, name in (
        ("torch/cuda/__init__.py:synchronize:1220", "torch.cuda.synchronize()"),
        ("torch/cuda/streams.py:Event.synchronize:255", "Event.synchronize()"),
        ("torch/cuda/streams.py:Stream.synchronize:109", "Stream.synchronize()"),
    ):
        thread = make_rank(0, [*LOOP, "train.py:train_step:40", inner]).samples[0].threads[0]
        op = device_wait(thread, lines=False)
        assert op is not None and op.name == name
        assert op.call_site is not None and op.call_site.location == "train.py:40"


def test_event_wait_queues_a_device_wait_and_is_no_host_sync() -> None:
    thread = (
        make_rank(0, [*LOOP, "train.py:train_step:40", "torch/cuda/streams.py:Event.wait:222"]).samples[0].threads[0]
    )
    assert device_wait(thread, lines=True) is None


def test_native_cuda_frames_make_any_line_a_device_wait() -> None:
    """An implicit sync (``float(loss)``) shows only in native frames."""
    thread = make_rank(0, [*at_item(code="total += float(loss)"), *ITEM_NATIVE]).samples[0].threads[0]
    op = device_wait(thread, lines=False)
    assert op is not None and op.name == "_local_scalar_dense_cuda"


def test_native_frames_elsewhere_overrule_the_line() -> None:
    cpu_kernel = native(("at::native::cpu_kernel_vec", "/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so"))
    thread = make_rank(0, [*at_item(), *cpu_kernel]).samples[0].threads[0]
    assert device_wait(thread, lines=True) is None


def test_a_line_counts_only_where_the_rank_uses_a_gpu() -> None:
    thread = make_rank(0, at_item()).samples[0].threads[0]
    assert device_wait(thread, lines=False) is None
    assert device_wait(thread, lines=True) is not None
    assert gpu_evidence(make_rank(0, at_item())) is None
    assert gpu_evidence(make_rank(0, at_item(), env={"CUDA_VISIBLE_DEVICES": "-1"})) is None
    assert gpu_evidence(make_rank(0, at_item(), env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"})) is None
    assert gpu_evidence(make_rank(0, at_item(), env=GPU_ENV)) == "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"
    with_native = make_rank(0, at_item(), stacks=[at_item(), [*at_item(), *ITEM_NATIVE]])
    assert gpu_evidence(with_native) == "native frames of CUDA"
    pin = ["threading.py:_bootstrap:995", "torch/cuda/streams.py:Stream.query:96"]
    assert gpu_evidence(make_rank(0, at_item(), threads={"pin": pin})) is not None


def test_its_cpu_and_wakeups_are_not_progress() -> None:
    """A host sync spinning a core (returnn#1811: active) and yielding often is still a wait."""
    rank = spinning(0, at_item(), ctx_per_sample=8)
    snap = make_snapshot([rank])
    v = view_rank(rank, snap)
    assert v.op is not None and v.state is RankState.WAITING


def test_bytes_moving_at_a_host_sync_are_progress() -> None:
    """NCCL over sockets moves bytes through the process: a long collective, not a hang."""
    snap = make_snapshot([spinning(r, at_item(), io_per_sample=2_000_000) for r in range(2)])
    d = analyse(snap)
    assert d.verdict is Verdict.NOT_HUNG, d.summary


def test_a_side_threads_host_sync_is_not_the_ranks() -> None:
    """A metrics thread blocked at ``.item()`` while the main thread computes: the rank
    computes."""
    rank = make_rank(
        0,
        [*LOOP, "model.py:forward:12"],
        cpu_per_sample=0.5,
        env=GPU_ENV,
        threads={"metrics": ["threading.py:run:982", make_frame("metrics.py:flush:9", code="v = acc.item()")]},
    )
    v = view_rank(rank, make_snapshot([rank]))
    assert v.op is None and v.state is RankState.BUSY


# -- classification -------------------------------------------------------------------------


def test_every_rank_at_one_host_sync_is_transport_like_with_low_confidence() -> None:
    """transformer-xl#10: all ranks in ``.item()``, nothing moves (before: not_hung, busy)."""
    d = analyse(make_snapshot([spinning(r, at_item()) for r in range(4)]))
    assert d.verdict is Verdict.NCCL_TIMEOUT and d.culprit_ranks == ()
    assert "waits for device work at the same .item() (train.py:40)" in d.summary, d.summary
    assert "stacks cannot tell which collective" in d.summary
    assert d.confidence is Confidence.LOW, d.basis
    assert any("stacks cannot tell which collective" in b for b in d.basis)
    assert any("at a host sync: CPU there is no progress" in b for b in d.basis), d.basis
    assert any("TORCH_NCCL_TRACE_BUFFER_SIZE" in s for s in d.next_steps)
    rank = next(r for r in d.ranks if r.rank == 0)
    assert rank.state is RankState.WAITING and not rank.working  # its CPU is not work


def test_event_synchronize_on_every_tp_rank() -> None:
    """sglang#26454: every TP rank in ``result.copy_done.synchronize()``."""
    stack = [
        "sglang/srt/managers/scheduler.py:Scheduler.event_loop_overlap:1040",
        make_frame(
            "sglang/srt/managers/scheduler.py:Scheduler.process_batch_result:1502",
            code="result.copy_done.synchronize()",
        ),
        "torch/cuda/streams.py:Event.synchronize:255",
    ]
    d = analyse(make_snapshot([spinning(r, stack, world=8, env={}) for r in range(8)]))
    assert d.verdict is Verdict.NCCL_TIMEOUT and d.confidence is Confidence.LOW
    assert "Event.synchronize() (sglang/srt/managers/scheduler.py:1502)" in d.summary, d.summary


def test_one_rank_on_a_dataloader_lock_while_the_others_wait_for_their_devices() -> None:
    lock = [*LOOP, make_frame("data.py:next_batch:80", code="with self._lock:")]
    d = analyse(
        make_snapshot(
            [*(spinning(r, at_item()) for r in range(3)), make_rank(3, lock, world_size=4, samples=24, env=GPU_ENV)]
        )
    )
    assert d.verdict is Verdict.STRAGGLER and d.culprit_ranks == (3,), d.summary
    assert "while ranks 0-2 wait for device work at .item() (train.py:40)" in d.summary, d.summary
    assert d.confidence is Confidence.MEDIUM, d.basis
    assert any(
        "ranks 0-2 wait for device work at a host sync, not in a torch.distributed frame" in b for b in d.basis
    ), d.basis


def test_ranks_at_different_host_syncs_are_not_called_a_mismatch() -> None:
    """pytorch#95944: most ranks in ``torch.cuda.synchronize()``, one in ``.item()``: the
    devices may all wait in one collective; stacks cannot say."""
    sync = [*LOOP, "train.py:train_step:52", "torch/cuda/__init__.py:synchronize:1220"]
    d = analyse(make_snapshot([*(spinning(r, sync) for r in range(3)), spinning(3, [*at_item(45), *ITEM_NATIVE])]))
    assert d.verdict is Verdict.UNKNOWN and d.culprit_ranks == (), d.summary
    assert "for device work at torch.cuda.synchronize() (train.py:52)" in d.summary, d.summary
    assert "for device work at _local_scalar_dense_cuda (train.py:45)" in d.summary
    assert any("no mismatch is inferred" in e.words() for e in d.evidence)
    assert d.confidence is Confidence.LOW


def test_ranks_in_a_collective_frame_and_ranks_at_a_host_sync_say_what_is_missing() -> None:
    barrier = [*LOOP, "train.py:train_step:50", f"{C10D}:barrier:4100"]
    d = analyse(make_snapshot([*(make_rank(r, barrier, world_size=4) for r in range(3)), spinning(3, at_item(45))]))
    assert d.verdict is Verdict.UNKNOWN, d.summary
    assert "ranks 0-2 in barrier (train.py:50)" in d.summary
    assert "rank 3 for device work at .item() (train.py:45)" in d.summary


def test_a_mismatch_among_collective_frames_stands_beside_host_syncs() -> None:
    d = analyse(
        make_snapshot(
            [
                make_rank(0, [*LOOP, "train.py:a:50", f"{C10D}:all_reduce:2800"], world_size=4),
                make_rank(1, [*LOOP, "train.py:a:50", f"{C10D}:all_reduce:2800"], world_size=4),
                make_rank(2, [*LOOP, "train.py:b:70", f"{C10D}:all_gather:3000"], world_size=4),
                spinning(3, at_item(45)),
            ]
        )
    )
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH and d.culprit_ranks == (2,), d.summary
    assert "rank 3 waits for device work at .item() (train.py:45)" in " ".join(e.words() for e in d.evidence)
    assert d.confidence is Confidence.MEDIUM


def test_without_gpu_evidence_a_spinning_sync_line_is_computing_but_doubted() -> None:
    d = analyse(make_snapshot([spinning(r, at_item(), env={}) for r in range(4)]))
    assert d.verdict is Verdict.NOT_HUNG  # read as computing: nothing shows a GPU
    assert d.confidence is Confidence.LOW
    assert any("may be waiting for device work, not computing" in b for b in d.basis), d.basis
