"""The flight recorder on real hung gloo jobs (``tests/jobs/flight/``), where the stacks
alone get the culprit wrong:

* ``fr_empty_bucket``: three ranks all_reduce gradient buckets in one loop and rank 2's
  bucket at step 2 is empty; every rank sits at the same line, so the stacks read a
  transport hang;
* ``fr_skipped_broadcast``: rank 1 skips a learning-rate broadcast; ranks 1-2 sit at the
  all_reduce line and rank 0 at the broadcast, so the stacks blame rank 0.

``hangdoc diagnose`` reads each rank's dump through its probe and names the right rank with
the sequence number, saying it overrode the stacks; ``hangdoc analyze`` of the dumps the
job wrote (torch's own pickle, under ``TORCH_FR_DUMP_TEMP_FILE``'s names) says the same."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.harness import launch, load_meta
from support.paths import REPO, TESTS

pytestmark = pytest.mark.timeout(180)
JOBS = TESTS / "jobs" / "flight"
CASES = {
    "fr_empty_bucket": (
        [2],
        "nccl_timeout:",
        8,
        (
            "collective mismatch (flight recorder): rank 2 called all_reduce Float[0] as collective #8 of "
            "default_pg (0) while ranks 0-1 called all_reduce Float[5]: same op, different sizes"
        ),
        (
            "rank 2 recorded all_reduce Float[0] as collective #8 of default_pg (0)",
            (
                "rank 2 finished its side of collective #8 and waits in collective #9 (all_reduce Float[3]) of "
                "default_pg (0)"
            ),
        ),
    ),
    "fr_skipped_broadcast": (
        [1],
        "collective_mismatch (culprits 0):",
        5,
        (
            "collective mismatch (flight recorder): rank 1 called all_reduce Float[1000] as collective #5 of "
            "default_pg (0) while ranks 0,2 called broadcast Float[1]"
        ),
        (
            "rank 1 recorded all_reduce Float[1000] as collective #5 of default_pg (0)",
            (
                "rank 1 issued as collective #5 the call rank 2 issued as #6 (all_reduce Float[1000]): rank 1 looks to "
                "have skipped collective #5 of default_pg (0) (broadcast Float[1]), "
                "which shifts every later number by 1"
            ),
        ),
    ),
}


def _hangdoc(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "hangdoc", *args, "--json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_flight_recorder_names_the_rank_the_stacks_cannot(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    culprits, stacks_read, seq, summary, evidence = CASES[name]
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", str(dumps / "nccl_trace_rank_"))
    meta = load_meta(JOBS / f"{name}.py")
    with launch(meta, tmp_path) as job:
        job.wait_ready(90)
        report = _hangdoc("diagnose", job.job_spec())
        deadline = time.monotonic() + 20
        while len(list(dumps.glob("nccl_trace_rank_*"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
    assert (report["verdict"], report["culprit_ranks"], report["summary"]) == ("collective_mismatch", culprits, summary)
    assert report["basis"][0] == f"flight recorder: collective #{seq} of default_pg (0) differs between ranks"
    assert set(evidence) <= set(report["evidence"])
    overridden = [e for e in report["evidence"] if e.endswith("the flight recorder overrides it")]
    assert len(overridden) == 1 and overridden[0].startswith(f"the stacks alone read {stacks_read}")

    files = _hangdoc("analyze", str(dumps))
    assert (files["verdict"], files["culprit_ranks"], files["summary"]) == ("collective_mismatch", culprits, summary)
    assert set(evidence) <= set(files["evidence"])
    assert files["confidence"] == "medium"  # dumps alone: whether they still wait is not shown
