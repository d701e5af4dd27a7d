"""GPU state through NVML (``hangdoc.capture.read.gpu``), on a machine without a GPU.

The skip paths run for real here: the installed nvidia-ml-py against a machine with no
NVIDIA driver, and an interpreter without nvidia-ml-py. What NVML would answer on a GPU
node comes from ``tests/data/gpu/nvml_node.json``, built from NVML's documented calls and
fields (its ``about`` says which and where from) and served by ``FakeNvml`` below, which
answers the pynvml calls hangdoc makes with nvml.h's error codes. No GPU could be had for
this work: no NVML output was recorded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.paths import TESTS

from hangdoc.capture.read import gpu
from hangdoc.capture.read.gpu import (
    NvmlGpu,
    NvmlUnavailable,
    attribute,
    in_worker,
    loaded_library,
    pid_aliases,
    read_gpus,
    read_nvml,
)
from hangdoc.model import GpuState

pytestmark = [pytest.mark.timeout(60)]
NODE = json.loads((TESTS / "data" / "gpu" / "nvml_node.json").read_text())


class FakeNvml:
    """The pynvml calls hangdoc makes, answering from a node description (``nvml_node.json``)."""

    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NO_PERMISSION = 4
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(f"NVML error {value}")
            self.value = value

    def __init__(
        self, node: dict[str, Any], *, init_error: int | None = None, lost: tuple[int, ...] = (), no_v3: bool = False
    ) -> None:
        self.node, self.init_error, self.lost, self.no_v3 = node, init_error, lost, no_v3
        self.events = list(node.get("xid_events", ()))
        self.shut = False
        self.registered: list[int] = []

    def _gpu(self, handle: int) -> dict[str, Any]:
        if handle in self.lost:
            raise self.NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return self.node["gpus"][handle]

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.node["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self._gpu(handle)["uuid"]

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return self._gpu(handle)["name"].encode()

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return type("Utilization", (), {"gpu": self._gpu(handle)["utilization"], "memory": 0})()

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        g = self._gpu(handle)
        return type(
            "Memory",
            (),
            {"used": g["memory_used"], "total": g["memory_total"], "free": g["memory_total"] - g["memory_used"]},
        )()

    def nvmlDeviceGetTotalEccErrors(self, handle: int, kind: int, counter: int) -> int:
        value = self._gpu(handle)["ecc_uncorrected"]
        if value is None:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        if self.no_v3:
            raise self.NVMLError(self.NVML_ERROR_FUNCTION_NOT_FOUND)
        return self.nvmlDeviceGetComputeRunningProcesses_v2(handle)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: int) -> list[Any]:
        return [
            type("Process", (), {"pid": pid, "usedGpuMemory": mem})() for pid, mem in self._gpu(handle)["processes"]
        ]

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: int, kinds: int, events: str) -> None:
        self.registered.append(handle)

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:
        if not self.events:
            time.sleep(min(timeout_ms, 50) / 1000)
            raise self.NVMLError(self.NVML_ERROR_TIMEOUT)
        index, xid = self.events.pop(0)
        return type("Event", (), {"device": index, "eventType": self.nvmlEventTypeXidCriticalError, "eventData": xid})()

    def nvmlEventSetFree(self, events: str) -> None:
        pass


# ------------------------------------------------------------------ skip paths, for real


def test_the_installed_nvml_without_a_driver_says_so_in_one_line() -> None:
    pynvml = pytest.importorskip("pynvml")
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(NvmlUnavailable, match=r"^no NVIDIA driver on this node \(libnvidia-ml.so.1 not found\)$"):
        read_nvml(pynvml, 0.0)


def test_a_cpu_process_on_a_machine_without_gpus_gets_no_state_and_no_note() -> None:
    reading = read_gpus([os.getpid()], listen=0.1, timeout=5.0)
    assert reading.gpus == {}
    assert reading.reason == ""  # it has not mapped libcuda: nothing worth telling


def test_a_cuda_process_is_told_why_there_is_no_gpu_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "loaded_library", lambda pid, marker: marker == b"/libcuda.so")
    reason = read_gpus([os.getpid()], listen=0.1, timeout=5.0).reason
    if importlib.util.find_spec("pynvml") is not None and not Path("/dev/nvidiactl").exists():
        assert reason == "no NVIDIA driver on this node (libnvidia-ml.so.1 not found)"
    monkeypatch.setitem(sys.modules, "pynvml", None)  # an interpreter without nvidia-ml-py
    assert read_gpus([os.getpid()]).reason == "nvidia-ml-py is not installed (pip install nvidia-ml-py)"


def test_without_nvidia_ml_py_hangdoc_still_imports_and_runs() -> None:
    code = (
        "import sys; sys.modules['pynvml'] = None\n"
        "from hangdoc.capture.read.gpu import read_gpus\n"
        "print(repr(read_gpus([1]).reason))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no traceback, no warning
    assert done.stdout.strip() == "''"


def test_a_hung_nvml_call_costs_its_deadline_once_then_is_said_to_be_stuck() -> None:
    release = threading.Event()
    t0 = time.monotonic()
    assert (
        in_worker(lambda: (release.wait(30), ())[1], 0.3) == "NVML did not answer within 0.3 s: a hung GPU or driver?"
    )
    assert time.monotonic() - t0 < 2.0
    assert in_worker(lambda: (), 0.2).startswith("NVML is still stuck in an earlier call")
    release.set()  # the driver "returns": the next call runs again
    deadline = time.monotonic() + 10
    while (got := in_worker(lambda: (), 1.0)) != () and time.monotonic() < deadline:
        time.sleep(0.05)
    assert got == ()


def test_libraries_are_read_from_the_process_maps(tmp_path: Path) -> None:
    lib = tmp_path / "libnccl.so.2"
    lib.write_bytes(b"\0" * 4096)
    code = (
        "import mmap, sys, time\n"
        "f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
        "print('ready', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(lib)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert loaded_library(proc.pid, b"/libnccl")
        assert not loaded_library(proc.pid, b"/libcuda.so")
        assert not loaded_library(2**22 + 1, b"/libnccl")  # no such process
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_a_process_has_at_least_its_own_pid_as_alias() -> None:
    assert pid_aliases(os.getpid())[0] == os.getpid()
    assert pid_aliases(2**22 + 1) == (2**22 + 1,)


# ------------------------------------------------------------------ what NVML answers


def test_a_node_read_through_nvml() -> None:
    nvml = FakeNvml(NODE)
    gpus = read_nvml(nvml, listen=0.3)  # type: ignore[arg-type]
    assert nvml.shut
    assert [g.state.utilization_percent for g in gpus] == [100, 100, 100, 0]
    first = gpus[0].state
    assert first.uuid == "GPU-5b3a2f4c-9d1e-4a7b-8c6d-0e1f2a3b4c50" and first.name == "NVIDIA H100 80GB HBM3"
    assert (first.memory_used_bytes, first.memory_total_bytes, first.ecc_uncorrected) == (44023414784, 85520809984, 0)
    assert gpus[3].state.ecc_uncorrected is None  # not supported: none, not 0
    assert gpus[3].state.xids == (79,) and all(g.state.xids == () for g in gpus[:3])
    assert gpus[1].processes == ((40101, 43486543872),)


def test_a_lost_gpu_is_marked_and_the_others_still_read() -> None:
    gpus = read_nvml(FakeNvml(NODE, lost=(2,)), listen=0.0)  # type: ignore[arg-type]
    assert gpus[2].state == GpuState(index=2, uuid="", lost=True)
    assert [g.state.lost for g in gpus] == [False, False, True, False]


def test_an_older_driver_s_processes_come_from_the_v2_call() -> None:
    gpus = read_nvml(FakeNvml(NODE, no_v3=True), listen=0.0)  # type: ignore[arg-type]
    assert gpus[0].processes == ((40100, 43486543872),)


def test_no_xid_listening_when_no_gpu_runs_a_process() -> None:
    idle = {"gpus": [dict(g, processes=[]) for g in NODE["gpus"]], "xid_events": [[0, 13]]}
    nvml = FakeNvml(idle)
    t0 = time.monotonic()
    gpus = read_nvml(nvml, listen=5.0)  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 1.0 and nvml.registered == []
    assert all(g.state.xids == () for g in gpus)


@pytest.mark.parametrize(
    ("code", "said"),
    [
        (12, "no NVIDIA driver on this node (libnvidia-ml.so.1 not found)"),
        (9, "the NVIDIA driver is not loaded on this node"),
        (4, "NVML refused this agent (no permission to the GPUs)"),
        (999, "NVML did not start: NVML error 999"),
    ],
)
def test_nvml_that_cannot_start_says_why(code: int, said: str) -> None:
    with pytest.raises(NvmlUnavailable) as err:
        read_nvml(FakeNvml(NODE, init_error=code), 0.0)  # type: ignore[arg-type]
    assert str(err.value) == said


# ------------------------------------------------------------------ tying GPUs to ranks


def _states() -> tuple[NvmlGpu, ...]:
    return read_nvml(FakeNvml(NODE), listen=0.0)  # type: ignore[arg-type]


def test_ranks_are_matched_by_pid() -> None:
    reading = attribute(_states(), {40100: (40100,), 40103: (40103,), 7: (7,)}, {}, exists=lambda p: True)
    assert reading.reason == ""
    assert [g.index for g in reading.gpus[40100]] == [0]
    assert reading.gpus[40103][0].utilization_percent == 0
    assert reading.gpus[40100][0].process_memory_bytes == 43486543872
    assert reading.gpus[40100][0].matched_by == "pid"
    assert 7 not in reading.gpus  # a process on no GPU: none


def test_a_containerised_rank_is_matched_by_its_pid_in_its_own_namespace() -> None:
    # the agent sees the rank as 812345, whose NSpid is "812345 40102": a driver that
    # translates pids into the caller's namespace lists 40102
    reading = attribute(_states(), {812345: (812345, 40102)}, {}, exists=lambda p: True)
    assert reading.gpus[812345][0].index == 2
    assert reading.gpus[812345][0].matched_by == "pid 40102 in its namespace"


def test_an_agent_in_another_pid_namespace_falls_back_to_gpu_uuids_and_says_so() -> None:
    visible = {11: ("GPU-5b3a2f4c-9d1e-4a7b-8c6d-0e1f2a3b4c53",), 12: ("0",), 13: ("GPU-5b3a2f4c",)}
    reading = attribute(_states(), {11: (11,), 12: (12,), 13: (13,)}, visible, exists=lambda p: False)
    assert [g.index for g in reading.gpus[11]] == [3]
    assert reading.gpus[11][0].matched_by == "CUDA_VISIBLE_DEVICES"
    assert 12 not in reading.gpus  # an index: CUDA's numbering need not be NVML's
    assert len(reading.gpus[13]) == 4  # a UUID prefix (CUDA takes them) matching every GPU
    assert "another pid namespace" in reading.reason and "40100" in reading.reason


def test_no_uuid_fallback_while_nvml_s_pids_are_processes_the_agent_sees() -> None:
    reading = attribute(
        _states(), {11: (11,)}, {11: ("GPU-5b3a2f4c-9d1e-4a7b-8c6d-0e1f2a3b4c53",)}, exists=lambda p: True
    )
    assert reading.gpus == {} and reading.reason == ""


def test_a_lost_gpu_is_said_even_when_no_rank_can_be_tied_to_it() -> None:
    lost = read_nvml(FakeNvml(NODE, lost=(3,)), listen=0.0)  # type: ignore[arg-type]
    reading = attribute(lost, {40103: (40103,)}, {}, exists=lambda p: True)
    assert 40103 not in reading.gpus
    assert reading.reason == "GPU 3 is lost (NVML: fallen off the bus or inaccessible)"
