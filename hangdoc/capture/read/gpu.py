"""The GPUs a node's rank processes run on, as NVML shows them: the seed guide's
"``nvidia-smi`` shows some GPUs idle while others at 100%", per rank.

NVML is read through nvidia-ml-py (imported as ``pynvml``), an optional dependency:
``pip install nvidia-ml-py`` (hangdoc's ``gpu`` extra). Without it, or without an NVIDIA driver, ``read_gpus``
returns no state and one line saying why; it never raises.

What is read, once per diagnosis and node (``read_nvml``): for each GPU (at most
``MAX_GPUS``) its index, UUID and name, utilisation (``nvmlDeviceGetUtilizationRates``:
the percent of NVML's last sample period, 1/6 s to 1 s, in which a kernel ran), memory
used and total, the volatile uncorrectable ECC count, its compute processes (pid and
memory), whether NVML calls it lost (``NVML_ERROR_GPU_IS_LOST``: fallen off the bus); then,
for ``listen`` seconds, the XID errors NVML delivers through an event set
(``nvmlDeviceRegisterEvents`` with ``nvmlEventTypeXidCriticalError``,
``nvmlEventSetWait_v2``). An event set only delivers XIDs that happen while it is
registered: an XID from before the diagnosis is in the kernel log (``dmesg | grep Xid``),
which hangdoc does not read.

NVML calls can hang on a broken GPU. They all run in one worker thread, with a deadline;
past it the caller gets a reason, and the thread is abandoned. While an abandoned one is
still stuck, later calls wait for it up to their own deadline, then give up the same way:
never more than one NVML worker at a time.

Pid namespaces: NVML lists each GPU's processes by pid. Most drivers give the pid in the
host's pid namespace whatever the caller's (https://github.com/NVIDIA/nvidia-docker/issues/1483);
some recent ones translate it into the caller's
(https://github.com/Project-HAMi/HAMi-core/issues/112). A rank is therefore matched by
every pid it has in the namespaces this agent can see (``/proc/PID/status`` ``NSpid``: the
agent's view first, then nested ones). When NVML lists pids of which none is a process this
agent can see, the agent runs in another pid namespace than the driver reports (a container
without ``--pid=host``): a rank whose ``CUDA_VISIBLE_DEVICES`` names GPUs by UUID is given
those GPUs (``matched_by="CUDA_VISIBLE_DEVICES"``), the others none, and the reason says so.
A device *index* in ``CUDA_VISIBLE_DEVICES`` is not used: CUDA's numbering need not be
NVML's.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import psutil

from ...model import GpuState

NVML_TIMEOUT = 5.0  # seconds for every NVML call of one reading together
MAX_LISTEN = 10.0  # seconds of listening for XIDs, at most
MAX_GPUS = 64  # per node (the largest nodes have 16)
MAX_XIDS = 64  # XID events kept per reading
MAX_PROCESSES = 1024  # compute processes kept per GPU
_MAPS_LIMIT = 4 * 2**20  # bytes of /proc/PID/maps read when looking for a library
INSTALL_HINT = "pip install nvidia-ml-py"  # works wherever hangdoc came from; `.[gpu]` only in a clone

# one NVML worker at a time: held while it runs; a worker stuck in the driver keeps it
_worker = threading.Lock()


@dataclass(frozen=True, slots=True)
class NvmlGpu:
    """A GPU as NVML showed it, before it is tied to ranks: its state and its compute
    processes as (pid as NVML gave it, GPU memory it holds or None)."""

    state: GpuState
    processes: tuple[tuple[int, int | None], ...] = ()


@dataclass(frozen=True)
class GpuReading:
    """The GPUs of each rank process (by its pid as the caller sees it), and why GPU state
    is missing or partial ("" when neither)."""

    gpus: Mapping[int, tuple[GpuState, ...]]
    reason: str = ""


class NvmlUnavailable(Exception):
    """NVML cannot be used here; the message says why in one line."""


def read_gpus(pids: Sequence[int], listen: float = 0.5, timeout: float = NVML_TIMEOUT) -> GpuReading:
    """The GPUs each of ``pids`` runs on, read through NVML within ``timeout`` seconds plus
    ``listen`` seconds of listening for XIDs (module doc). Never raises. Where NVML cannot
    be read, the reason is given only if one of ``pids`` uses CUDA (has mapped
    ``libcuda``): a CPU job on a machine without GPUs has nothing to be told."""
    try:
        import pynvml
    except ImportError:
        return GpuReading({}, _if_cuda(pids, f"nvidia-ml-py is not installed ({INSTALL_HINT})"))
    listen = min(max(listen, 0.0), MAX_LISTEN)
    seen = in_worker(lambda: read_nvml(pynvml, listen), timeout + listen)
    if isinstance(seen, str):
        return GpuReading({}, _if_cuda(pids, seen))
    return attribute(seen, {pid: pid_aliases(pid) for pid in pids}, {pid: visible_uuids(pid) for pid in pids})


def _if_cuda(pids: Sequence[int], reason: str) -> str:
    return reason if any(loaded_library(pid, b"/libcuda.so") for pid in pids) else ""


def loaded_library(pid: int, marker: bytes) -> bool:
    """``marker`` (``b"/libcuda.so"``) is in the paths the process has mapped
    (``/proc/PID/maps``, read up to 4 MiB; False where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as maps:
            return marker in maps.read(_MAPS_LIMIT)
    except OSError:
        return False


def in_worker(work: Callable[[], tuple[NvmlGpu, ...]], deadline: float) -> tuple[NvmlGpu, ...] | str:
    """``work()`` run in the NVML worker thread, or why it gave nothing within ``deadline``."""
    start = time.monotonic()
    if not _worker.acquire(timeout=max(deadline, 0.0)):
        return f"NVML is still stuck in an earlier call ({deadline:.1f} s waited): a hung GPU or driver?"
    answer: queue.Queue[tuple[NvmlGpu, ...] | BaseException] = queue.Queue(maxsize=1)

    def run() -> None:
        try:
            answer.put(work())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            answer.put(exc)
        finally:
            _worker.release()

    threading.Thread(target=run, name="hangdoc-nvml", daemon=True).start()
    try:
        got = answer.get(timeout=max(deadline - (time.monotonic() - start), 0.01))
    except queue.Empty:
        return f"NVML did not answer within {deadline:.1f} s: a hung GPU or driver?"
    if isinstance(got, NvmlUnavailable):
        return str(got)
    if isinstance(got, BaseException):
        return f"NVML failed: {type(got).__name__}: {str(got)[:200]}"
    return got


# ------------------------------------------------------------------ reading NVML


def read_nvml(nvml: ModuleType, listen: float) -> tuple[NvmlGpu, ...]:
    """Every GPU of the node as ``nvml`` (the pynvml module) shows it, then ``listen``
    seconds of XIDs. Raises ``NvmlUnavailable`` when NVML cannot start."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        raise NvmlUnavailable(_why_unavailable(nvml, err)) from None
    try:
        count = min(nvml.nvmlDeviceGetCount(), MAX_GPUS)
        handles: dict[int, Any] = {}
        gpus: dict[int, NvmlGpu] = {}
        for index in range(count):
            try:
                handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError as err:
                if _is(nvml, err, "NVML_ERROR_GPU_IS_LOST"):
                    gpus[index] = NvmlGpu(GpuState(index=index, uuid="", lost=True))
                continue
            gpus[index] = _read_gpu(nvml, index, handles[index])
        # no compute process on any GPU: no rank runs on one, nothing to listen for
        busy = any(gpu.processes for gpu in gpus.values())
        xids = _listen_xids(nvml, handles, listen) if busy else {}
        return tuple(
            replace(gpu, state=replace(gpu.state, xids=tuple(xids.get(index, ()))))
            for index, gpu in sorted(gpus.items())
        )
    except nvml.NVMLError as err:
        raise NvmlUnavailable(f"NVML failed: {err}") from None
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def _why_unavailable(nvml: ModuleType, err: Exception) -> str:
    if _is(nvml, err, "NVML_ERROR_LIBRARY_NOT_FOUND"):
        return "no NVIDIA driver on this node (libnvidia-ml.so.1 not found)"
    if _is(nvml, err, "NVML_ERROR_DRIVER_NOT_LOADED"):
        return "the NVIDIA driver is not loaded on this node"
    if _is(nvml, err, "NVML_ERROR_NO_PERMISSION"):
        return "NVML refused this agent (no permission to the GPUs)"
    return f"NVML did not start: {err}"


def _is(nvml: ModuleType, err: Exception, name: str) -> bool:
    code = getattr(nvml, name, None)
    return code is not None and getattr(err, "value", None) == code


class _Lost(Exception):
    """NVML said the GPU is lost."""


def _read_gpu(nvml: ModuleType, index: int, handle: Any) -> NvmlGpu:
    """One GPU's state; a reading NVML does not support is None, a lost GPU says so."""

    def ask(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(handle, *args)
        except nvml.NVMLError as err:
            if _is(nvml, err, "NVML_ERROR_GPU_IS_LOST"):
                raise _Lost from None
            return None

    try:
        uuid = _text(ask(nvml.nvmlDeviceGetUUID))
        name = _text(ask(nvml.nvmlDeviceGetName))
        rates = ask(nvml.nvmlDeviceGetUtilizationRates)
        memory = ask(nvml.nvmlDeviceGetMemoryInfo)
        ecc = ask(nvml.nvmlDeviceGetTotalEccErrors, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)
        processes = _processes(nvml, handle)
    except _Lost:
        return NvmlGpu(GpuState(index=index, uuid="", lost=True))
    state = GpuState(
        index=index,
        uuid=uuid,
        name=name,
        utilization_percent=_number(getattr(rates, "gpu", None), 100),
        memory_used_bytes=_number(getattr(memory, "used", None)),
        memory_total_bytes=_number(getattr(memory, "total", None)),
        ecc_uncorrected=_number(ecc),
    )
    listed = tuple(
        (pid, _number(getattr(p, "usedGpuMemory", None)))
        for p in list(processes)[:MAX_PROCESSES]
        if (pid := _number(getattr(p, "pid", None))) is not None
    )
    return NvmlGpu(state, listed)


def _processes(nvml: ModuleType, handle: Any) -> list[Any]:
    """The GPU's compute processes: NVML's v3 call, or v2 on a driver without it (before
    R510); [] where neither answers."""
    for call in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"):
        try:
            return list(getattr(nvml, call)(handle))
        except nvml.NVMLError as err:
            if _is(nvml, err, "NVML_ERROR_GPU_IS_LOST"):
                raise _Lost from None
            if not _is(nvml, err, "NVML_ERROR_FUNCTION_NOT_FOUND"):
                return []
        except AttributeError:
            continue
    return []


def _listen_xids(nvml: ModuleType, handles: Mapping[int, Any], listen: float) -> dict[int, list[int]]:
    """XID numbers by GPU index, delivered within ``listen`` seconds; {} where the GPUs
    support no XID events."""
    if listen <= 0 or not handles:
        return {}
    try:
        events = nvml.nvmlEventSetCreate()
    except nvml.NVMLError:
        return {}
    found: dict[int, list[int]] = {}
    try:
        registered = 0
        for handle in handles.values():
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
                registered += 1
            except nvml.NVMLError:
                continue  # not supported on this GPU (or not to this user)
        deadline = time.monotonic() + listen
        kept = 0
        while registered and kept < MAX_XIDS and (left := deadline - time.monotonic()) > 0:
            try:
                data = nvml.nvmlEventSetWait_v2(events, max(1, int(left * 1000)))
            except nvml.NVMLError:
                break  # NVML_ERROR_TIMEOUT: none arrived; anything else: stop listening
            if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
                continue
            try:
                index = nvml.nvmlDeviceGetIndex(data.device)
            except nvml.NVMLError:
                continue
            found.setdefault(index, []).append(int(data.eventData))
            kept += 1
    finally:
        try:
            nvml.nvmlEventSetFree(events)
        except nvml.NVMLError:
            pass
    return found


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value[:200] if isinstance(value, str) else ""


def _number(value: Any, maximum: int = 2**63 - 1) -> int | None:
    return value if type(value) is int and 0 <= value <= maximum else None


# ------------------------------------------------------------------ tying GPUs to ranks


def attribute(
    gpus: Sequence[NvmlGpu],
    aliases: Mapping[int, Sequence[int]],
    visible: Mapping[int, Sequence[str]],
    exists: Callable[[int], bool] = psutil.pid_exists,
) -> GpuReading:
    """Each rank's GPUs: by any of its pids (``aliases``: the pids it has in the namespaces
    the caller sees, its own pid first), else, when NVML's pids are of processes the caller
    cannot see at all, by the GPU UUIDs of its ``CUDA_VISIBLE_DEVICES`` (``visible``)."""
    owner = {alias: pid for pid, names in aliases.items() for alias in names}
    found: dict[int, list[GpuState]] = {}
    listed: set[int] = set()
    for gpu in gpus:
        for nvml_pid, memory in gpu.processes:
            listed.add(nvml_pid)
            pid = owner.get(nvml_pid)
            if pid is not None:
                how = "pid" if nvml_pid == pid else f"pid {nvml_pid} in its namespace"
                found.setdefault(pid, []).append(replace(gpu.state, process_memory_bytes=memory, matched_by=how))
    reasons = [f"GPU {g.state.index} is lost (NVML: fallen off the bus or inaccessible)" for g in gpus if g.state.lost]
    unmatched = [pid for pid in aliases if pid not in found]
    foreign = sorted(p for p in listed if p not in owner and not exists(p))
    if unmatched and foreign and not (listed & owner.keys()):
        for pid in unmatched:
            chosen = [
                g.state for g in gpus if g.state.uuid and any(g.state.uuid.startswith(u) for u in visible.get(pid, ()))
            ]
            if chosen:
                found[pid] = [replace(s, matched_by="CUDA_VISIBLE_DEVICES") for s in chosen]
        reasons.append(
            f"NVML lists GPU processes by pids this agent cannot see ({', '.join(map(str, foreign[:4]))}"
            f"{', ...' if len(foreign) > 4 else ''}): it runs in another pid namespace than the "
            "driver reports; GPUs were tied to ranks only where CUDA_VISIBLE_DEVICES names them "
            "by UUID (run the agent in the host's pid namespace: --pid=host, hostPID: true)"
        )
    return GpuReading({pid: tuple(states) for pid, states in found.items()}, "; ".join(reasons))


def pid_aliases(pid: int) -> tuple[int, ...]:
    """``pid`` and the pids the same process has in nested pid namespaces (``NSpid``)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    nested = [int(p) for p in line.split()[1:] if p.isascii() and p.isdigit()]
                    return tuple(dict.fromkeys([pid, *nested]))
    except OSError:
        pass
    return (pid,)


def visible_uuids(pid: int) -> tuple[str, ...]:
    """The GPU UUIDs (or UUID prefixes, as CUDA takes them) in the process's
    ``CUDA_VISIBLE_DEVICES``; device indices are left out (module doc)."""
    try:
        value = psutil.Process(pid).environ().get("CUDA_VISIBLE_DEVICES", "")
    except (psutil.Error, OSError):
        return ()
    return tuple(v.strip() for v in value.split(",") if v.strip().startswith("GPU-") and len(v.strip()) > 8)
