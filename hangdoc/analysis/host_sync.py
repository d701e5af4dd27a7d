"""Threads blocked at a host sync: waiting for device work, with no torch.distributed frame.

On GPUs, collectives are asynchronous: ``dist.all_reduce`` returns once NCCL's kernel is
queued, and the rank blocks later, wherever the host next waits for the device:
``loss.item()``, ``.cpu()``, ``.tolist()``, ``torch.cuda.synchronize()``,
``Stream.synchronize()``/``Event.synchronize()``, a blocking copy. The thread usually spins
a core there (CUDA's default wait spins or yields), so its CPU time says nothing about
progress, and its stack names no collective: which one the device is stuck in is not
visible from stacks (the flight recorder, ``TORCH_NCCL_TRACE_BUFFER_SIZE``, would tell).

A thread waits for device work (``device_wait``) when, in order:

1. its innermost Python frame is one of torch's own device synchronisations: a function
   named ``synchronize`` in torch's device modules (``torch/cuda/__init__.py``'s
   ``synchronize``, ``torch/cuda/streams.py``'s ``Stream.synchronize`` and
   ``Event.synchronize``, ``torch.accelerator``, ``torch.xpu``, ...). Not
   ``Event.wait``/``Stream.wait_event``: they queue a wait on the device
   (``cudaStreamWaitEvent``) and return;
2. native frames below its innermost Python frame (``--native``) name a CUDA runtime or
   driver call that blocks the host (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
   ``cudaEventSynchronize``, ``cuStreamSynchronize``, ``cudaMemcpy*``, ``cuMemcpy*``,
   ``cudaFree`` (an implicit device sync), torch's ``_local_scalar_dense_cuda`` /
   ``c10::cuda::*synchronize``), or are in ``libcuda``/``libcudart``. Native frames that show
   the thread elsewhere make it no device wait, whatever its Python line;
3. (``lines=True`` only: the rank shows it runs on a GPU, ``gpu_evidence``) its innermost
   Python frame is the job's or a library's code whose current line calls a tensor method
   that waits for the device: ``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy(force=True)``,
   ``.synchronize()``, a blocking ``.cuda()``/``.to("cpu")``. On a CPU tensor those return at
   once or compute, so a line alone is read only where the rank uses a GPU.

Implicit syncs (``float(t)``, ``if t.any():``, ``print(t)``) show only in native frames.
The names are torch's own API and the CUDA runtime/driver API, nothing of any one job.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..model import DistOp, Frame, OpKind, Origin, RankProcess, RankSnapshot, Sample, ThreadStack

HOST_SYNC = "host sync"  # ``DistOp.via`` of a device wait starts with it
# torch's device modules (path inside the torch package) whose ``synchronize`` blocks the host
_DEVICE_MODULES = ("torch/cuda/", "torch/xpu/", "torch/mps/", "torch/mtia/", "torch/accelerator/")
_TORCH_GPU = ("torch/cuda/", "torch/xpu/", "torch/mtia/")  # a frame there: the rank uses a device
# CUDA runtime / driver calls that block the host until device work completes, and torch's
# C++ helpers around them
_NATIVE_SYNC = re.compile(
    r"\b(?:cuda(?:Stream|Device|Event|Ctx|Thread)?Synchronize|cu(?:Stream|Event|Ctx)Synchronize"
    r"|cudaMemcpy\w*|cuMemcpy\w*|cudaFree|cuMemFree\w*|_local_scalar_dense_cuda"
    r"|c10::cuda::(?:device_synchronize|stream_synchronize|memcpy_and_sync)"
    r"|at::cuda::CUDAEvent::synchronize)"
)
_CUDA_LIBRARY = re.compile(r"(?:^|/)lib(?:cuda|cudart)(?:[-.][^/]*)?\.so")
# a line calling a tensor method that waits for the device (see the module doc)
_SYNC_CALL = re.compile(
    r"\.(?P<m>item|tolist|cpu|synchronize)\s*\(\s*\)"
    r"|\.(?P<n>numpy)\s*\(\s*force\s*=\s*True\s*\)"
    r"|\.(?P<c>cuda)\s*\((?![^)]*non_blocking\s*=\s*True)"
    r"|\.(?P<t>to)\s*\(\s*(?:device\s*=\s*)?(?:['\"]cpu['\"]|torch\.device\(\s*['\"]cpu['\"]\s*\))"
    r"(?![^)]*non_blocking\s*=\s*True)"
)


def waits_for_device(op: DistOp | None) -> bool:
    """``op`` is a host sync (a wait for device work), not a torch.distributed call."""
    return op is not None and op.via.startswith(HOST_SYNC)


def is_cuda_native(frame: Frame) -> bool:
    """A native frame of the CUDA runtime or driver, or of torch's sync helpers."""
    return frame.native and (bool(_NATIVE_SYNC.search(frame.function)) or bool(_CUDA_LIBRARY.search(frame.filename)))


def sync_call(code: str | None) -> str | None:
    """The host-syncing call on a line (``.item()``, ``.cpu()``, ``.to("cpu")``...), or None."""
    m = _SYNC_CALL.search(code or "")
    if not m:
        return None
    name = m.group("m") or m.group("n") or m.group("c") or m.group("t")
    return f".{name}()"


def device_wait(thread: ThreadStack, lines: bool) -> DistOp | None:
    """The device wait ``thread`` is blocked in (module doc), or None. ``lines``: the rank
    runs on a GPU, so a host-syncing line of the job's code counts."""
    python = [i for i, f in enumerate(thread.frames) if not f.native]
    if not python:
        return None
    inner_index = python[-1]
    inner = thread.frames[inner_index]
    below = thread.frames[inner_index + 1 :]
    site = _call_site(thread, inner_index)
    # 1. torch's own synchronize
    origin = inner.origin
    if (
        origin.kind is Origin.TORCH
        and inner.function.rsplit(".", 1)[-1] == "synchronize"
        and origin.module_path.startswith(_DEVICE_MODULES)
    ):
        if below and not any(is_cuda_native(f) for f in below):
            return None
        return _op(_torch_name(inner), site, f"{HOST_SYNC}: torch's {_torch_name(inner)} frame")
    # 2. native frames of the CUDA runtime or driver
    if below:
        sync = next((f for f in reversed(below) if is_cuda_native(f)), None)
        if sync is None:
            return None  # native frames show it elsewhere in C
        # the outermost such call: torch's operation (``_local_scalar_dense_cuda`` for
        # ``.item()``) rather than the driver call it ends in
        called = next((f.function for f in below if _NATIVE_SYNC.search(f.function)), None)
        name = _short_native(called) if called else "a CUDA call"
        return _op(name, site, f"{HOST_SYNC}: native frames ({name})")
    # 3. a host-syncing line of the job's own code, on a rank that uses a GPU
    if lines and origin.kind in (Origin.USER, Origin.LIBRARY):
        call = sync_call(inner.code)
        if call is not None:
            return _op(call, inner, f"{HOST_SYNC}: its line calls {call} on a rank that uses a GPU")
    return None


def _op(name: str, site: Frame | None, via: str) -> DistOp:
    path = (site,) if site is not None else ()
    return DistOp(OpKind.COLLECTIVE, name, site, via, path=path)


def _call_site(thread: ThreadStack, below: int) -> Frame | None:
    """The innermost Python frame outside torch at or above ``below``."""
    for frame in reversed(thread.frames[: below + 1]):
        if not frame.native and frame.origin.kind is not Origin.TORCH:
            return frame
    return None


def _torch_name(frame: Frame) -> str:
    """``torch.cuda.synchronize()``, ``Event.synchronize()``: how the job called it."""
    function = frame.function
    if "." in function:
        return f"{function}()"
    module = frame.origin.module_path.removesuffix("/__init__.py").removesuffix(".py")
    return f"{module.replace('/', '.')}.{function}()"


def _short_native(function: str) -> str:
    """``cudaStreamSynchronize`` out of a C++ signature."""
    m = _NATIVE_SYNC.search(function)
    return m.group(0) if m else function


def python_host_sync(thread: ThreadStack, uses_gpu: bool, code: Callable[[Frame], str | None]) -> bool:
    """Python frames alone say ``thread`` may wait for the device, and no native frames were
    taken to tell: its innermost frame is torch's ``synchronize`` (rule 1), or, on a rank
    that uses a GPU, a line of the job calling a host-syncing method (rule 3; ``code``
    gives a frame's line). One native sample then shows whether it waits in CUDA or
    computes."""
    if any(f.native for f in thread.frames):
        return False
    inner = thread.innermost_python
    if inner is None:
        return False
    origin = inner.origin
    if origin.kind is Origin.TORCH:
        return inner.function.rsplit(".", 1)[-1] == "synchronize" and origin.module_path.startswith(_DEVICE_MODULES)
    return uses_gpu and origin.kind in (Origin.USER, Origin.LIBRARY) and sync_call(code(inner)) is not None


def gpu_evidence(snap: RankSnapshot) -> str | None:
    """What shows that a rank runs on a GPU, or None: native frames of CUDA, a frame of
    torch's device modules on any thread in any sample, or ``CUDA_VISIBLE_DEVICES``
    naming devices, or NVML listing its process on a GPU (``RankSnapshot.gpus``). (``NCCL_*``
    variables say nothing: torchrun sets ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` for CPU jobs too.)"""
    if snap.gpus:
        return f"NVML lists it on GPU {snap.gpus[0].index}"
    return samples_gpu_evidence(snap.good_samples, snap.process)


def samples_gpu_evidence(samples: Sequence[Sample], process: RankProcess) -> str | None:
    """``gpu_evidence`` of a rank's samples and process, before they make a snapshot."""
    return stacks_gpu_evidence(samples) or env_gpu_evidence(process)


def stacks_gpu_evidence(samples: Sequence[Sample]) -> str | None:
    """What the samples' stacks show of a GPU: native frames of CUDA, a frame of torch's
    device modules; None when they show none (the part of ``gpu_evidence`` that ranks with
    the same stacks share)."""
    for sample in samples:
        for thread in sample.threads:
            for frame in thread.frames:
                if frame.native:
                    if is_cuda_native(frame):
                        return "native frames of CUDA"
                elif frame.origin.under(*_TORCH_GPU):
                    return f"a frame of {frame.origin.module_path}"
    return None


def env_gpu_evidence(process: RankProcess) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` naming devices in the process's environment, or None."""
    visible = (process.env_get("CUDA_VISIBLE_DEVICES") or "").strip()
    if visible and visible not in ("-1", "NoDevFiles", "none", "void"):
        return f"CUDA_VISIBLE_DEVICES={visible}"
    return None
