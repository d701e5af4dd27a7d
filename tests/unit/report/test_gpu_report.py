"""GPU lines in the reports: shown when NVML gave state, absent otherwise; NCCL's RAS report
in the JSON only when one was had."""

from __future__ import annotations

import dataclasses
import json
from io import StringIO

import pytest
from rich.console import Console
from support.factories import make_rank, make_snapshot
from support.paths import TESTS

from hangdoc.analysis.analyse import analyse
from hangdoc.capture.read.ncclras import read_ras_report
from hangdoc.model import GpuState, JobSnapshot
from hangdoc.report.json_report import render_json
from hangdoc.report.terminal import render

pytestmark = [pytest.mark.timeout(30)]
AR = ["train.py:main:10", "train.py:step:40", "torch/distributed/distributed_c10d.py:all_reduce:2800"]
SLEEPING = ["train.py:main:10", "train.py:load:77", "time.py:sleep"]


def snapshot(gpus: bool) -> JobSnapshot:
    snap = make_snapshot([make_rank(r, AR) for r in range(3)] + [make_rank(3, SLEEPING)])
    if not gpus:
        return snap
    states = {
        r: GpuState(
            index=r,
            uuid=f"GPU-{r}",
            name="NVIDIA H100",
            utilization_percent=0 if r == 3 else 100,
            memory_used_bytes=41 * 2**30,
            memory_total_bytes=80 * 2**30,
            xids=(79,) if r == 3 else (),
        )
        for r in range(4)
    }
    return dataclasses.replace(snap, ranks=tuple(dataclasses.replace(r, gpus=(states[r.rank],)) for r in snap.ranks))


def terminal(snap: JobSnapshot) -> str:
    console = Console(file=StringIO(), width=120, color_system=None)
    render(analyse(snap), snap, console)
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_the_terminal_report_lists_each_rank_s_gpu() -> None:
    text = terminal(snapshot(gpus=True))
    assert "\nGPUs\n" in text
    assert "rank 0: GPU 0 (NVIDIA H100): 100% busy, 41.0/80.0 GiB" in text
    assert "rank 3: GPU 3 (NVIDIA H100): 0% busy, 41.0/80.0 GiB, XID 79" in text


def test_no_gpu_section_without_gpu_state() -> None:
    text = terminal(snapshot(gpus=False))
    assert "GPUs" not in text and "NVML" not in text


def test_the_json_report_has_gpus_and_ras_only_when_captured() -> None:
    plain = snapshot(gpus=False)
    data = json.loads(render_json(analyse(plain), plain))
    assert all("gpus" not in r for r in data["ranks"]) and "nccl_ras" not in data
    report = read_ras_report(
        (TESTS / "data" / "gpu" / "ncclras_2.28.9_dead_rank.json").read_text(), source="ncclras on node0"
    )
    rich = dataclasses.replace(snapshot(gpus=True), ras=report)
    data = json.loads(render_json(analyse(rich), rich))
    rank3 = next(r for r in data["ranks"] if r["rank"] == 3)
    assert rank3["gpus"] == [
        {
            "index": 3,
            "uuid": "GPU-3",
            "name": "NVIDIA H100",
            "utilization_percent": 0,
            "memory_used_bytes": 41 * 2**30,
            "memory_total_bytes": 80 * 2**30,
            "process_memory_bytes": None,
            "xids": [79],
            "ecc_uncorrected": None,
            "lost": False,
            "matched_by": "pid",
        }
    ]
    ras = data["nccl_ras"]
    assert ras["nccl_version"] == "2.28.9" and ras["timeouts"] == 2
    assert ras["communicators"][0]["missing_ranks"] == [
        {"rank": 3, "host": "10.0.0.11", "pid": 40103, "unresponsive": True, "dead": True}
    ]
    assert ras["communicators"][0]["launched"] == {"0": 1534, "1": 1534, "2": 1534}
    assert list(data).index("nccl_ras") == list(data).index("notes") + 1
