"""GPU state and NCCL's RAS report in a saved snapshot: they round-trip exactly, a bundle
written before they existed still loads (with none), and bad values are refused."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from support.factories import make_rank, make_snapshot
from support.paths import TESTS

from hangdoc.bundle import load_snapshot, save_snapshot, snapshot_from_dict, snapshot_to_dict
from hangdoc.capture.read.ncclras import read_ras_report
from hangdoc.errors import BundleError
from hangdoc.model import GpuState, JobSnapshot

pytestmark = [pytest.mark.timeout(30)]
AR = ["train.py:main:10", "torch/distributed/distributed_c10d.py:all_reduce:2800"]


def with_devices() -> JobSnapshot:
    snap = make_snapshot([make_rank(r, AR) for r in range(4)])
    gpus = {
        r: (
            GpuState(
                index=r,
                uuid=f"GPU-{r}",
                name="NVIDIA H100",
                utilization_percent=100 if r else 0,
                memory_used_bytes=2**34,
                memory_total_bytes=80 * 2**30,
                process_memory_bytes=2**33,
                xids=(79, 79) if r == 3 else (),
                ecc_uncorrected=0,
                lost=r == 2,
                matched_by="pid 7 in its namespace",
            ),
        )
        for r in range(4)
    }
    report = read_ras_report(
        (TESTS / "data" / "gpu" / "ncclras_2.28.9_dead_rank.json").read_text(), source="ncclras on node0"
    )
    return dataclasses.replace(
        snap, ras=report, ranks=tuple(dataclasses.replace(r, gpus=gpus[r.rank]) for r in snap.ranks)
    )


@pytest.mark.parametrize("name", ["snap.json", "snap.json.gz"])
def test_gpu_state_and_ras_round_trip(tmp_path: Path, name: str) -> None:
    snap = with_devices()
    save_snapshot(snap, tmp_path / name)
    assert load_snapshot(tmp_path / name) == snap


def test_a_bundle_from_before_gpu_state_loads_with_none() -> None:
    old = snapshot_to_dict(make_snapshot([make_rank(r, AR) for r in range(2)]))
    text = json.dumps(old)
    assert '"gpus"' not in text and '"ras"' not in text  # defaults are left out: old bundles look the same
    snap = snapshot_from_dict(json.loads(text))
    assert snap.ras is None and all(r.gpus == () for r in snap.ranks)


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        (("ranks", 0, "gpus", 0, "utilization_percent"), 101, "out of range"),
        (("ras", "communicators", 0, "ranks", 0, "comm_rank"), -1, "out of range"),
        (("ras", "communicators", 0, "size"), 2**40, "out of range"),
        (("ranks", 0, "gpus", 0, "xids"), "79", "expected a list"),
    ],
)
def test_bad_device_values_are_refused(path: tuple[object, ...], value: object, said: str) -> None:
    data = snapshot_to_dict(with_devices())
    where = data["snapshot"]
    for key in path[:-1]:
        where = where[key]  # type: ignore[index]
    where[path[-1]] = value  # type: ignore[index]
    with pytest.raises(BundleError, match=said):
        snapshot_from_dict(data)
