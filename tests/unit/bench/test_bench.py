"""The benchmarks still run: a bench that nobody runs rots (one did, for a whole issue)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.paths import REPO

BENCHES = sorted(p.name for p in (REPO / "bench").glob("bench_*.py"))


@pytest.mark.parametrize("script", BENCHES)
def test_every_bench_starts(script: str) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout


def test_accuracy_on_the_recorded_corpus() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_accuracy.py"), "--recorded"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    recorded = len(list((REPO / "tests" / "snapshots").glob("*.json.gz")))
    # each recorded job as recorded and moved under a directory whose name contains "torch"
    assert f"Right verdict and culprits: {2 * recorded} of {2 * recorded}." in result.stdout


def test_a_live_captures_snapshot_decoded_with_shared_values_is_the_same_bundle() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_decoded.py"), "--sizes", "48"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]  # it fails on different bytes or verdicts
    rows = {line.split("|")[2].strip(): line.split("|") for line in result.stdout.splitlines() if "| 48 |" in line}
    assert set(rows) == {"separate", "shared"}
    threads = {mode: int(cells[5].split("(")[0].replace(",", "")) for mode, cells in rows.items()}
    assert threads["shared"] * 3 == threads["separate"]  # 3 samples, none of them changed
