"""``hangdoc watch`` on real tiny training jobs: DDP over gloo on CPU, launched by torchrun.

Each test wraps ``torchrun ... tests/watchjobs/ddp_train.py`` in ``hangdoc watch`` as a
separate process, exactly as a user would, and reads what the watchdog leaves behind.
Every process started carries a test tag in its environment and is killed at the end,
whatever happened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.harness import corpus, free_port, is_running, kill_tagged, launch, tagged_pids
from support.paths import TESTS

pytestmark = [pytest.mark.timeout(240)]

TRAIN = TESTS / "watchjobs" / "ddp_train.py"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


class WatchRun:
    """``python -m hangdoc watch ARGS -- torchrun ... ddp_train.py JOB_ARGS`` in the background."""

    def __init__(self, tmp: Path, watch_args: list[str], nproc: int, job_args: list[str]) -> None:
        self.tag = uuid.uuid4().hex
        self.out = tmp / "hangs"
        self.stdout = tmp / "stdout.txt"
        self.stderr = tmp / "stderr.txt"
        env = dict(os.environ, HANGDOC_TEST_TAG=self.tag, OMP_NUM_THREADS="1")
        argv = [
            sys.executable,
            "-m",
            "hangdoc",
            "watch",
            "--out",
            str(self.out),
            *watch_args,
            "--",
            TORCHRUN,
            "--nproc-per-node",
            str(nproc),
            "--master-port",
            str(free_port()),
            str(TRAIN),
            *job_args,
        ]
        with open(self.stdout, "wb") as out, open(self.stderr, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"watch did not end within {timeout} s; stderr:\n{self.err()[-4000:]}") from None

    def err(self) -> str:
        return self.stderr.read_text(errors="replace")

    def reports(self) -> list[Path]:
        return sorted(self.out.glob("hang-*")) if self.out.exists() else []

    def report(self) -> dict:
        found = self.reports()
        assert len(found) == 1, f"expected one hang report, found {found}; stderr:\n{self.err()[-4000:]}"
        return json.loads((found[0] / "report.json").read_text())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        kill_tagged(self.tag)


@pytest.fixture
def watch_run(tmp_path: Path) -> Iterator:
    runs: list[WatchRun] = []

    def start(watch_args: list[str], nproc: int, job_args: list[str]) -> WatchRun:
        run = WatchRun(tmp_path, watch_args, nproc, job_args)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.close()


def _within_bar(watch: dict) -> None:
    """Detection latency: the silence when the stall was detected is at most the stall
    timeout plus one check interval."""
    assert watch["silence_seconds"] > watch["timeout_seconds"]
    assert watch["silence_seconds"] <= watch["timeout_seconds"] + watch["check_interval"], watch


def test_mismatch_hang_fires_and_kill_leaves_nothing(watch_run) -> None:
    run = watch_run(
        ["--stall-after", "3", "--on-hang", "kill", "--kill-grace", "3"], 3, ["--hang", "mismatch", "--at", "8"]
    )
    code = run.wait(150)
    assert code == 124, run.err()[-3000:]
    report = run.report()
    assert report["verdict"] == "collective_mismatch"
    assert report["culprit_ranks"] == [2]
    assert report["watch"]["signal"] == "output"
    assert report["watch"]["timeout_seconds"] == 3.0  # --stall-after (also the warm-up timeout)
    _within_bar(report["watch"])
    assert "confirmed by diagnosis" in report["watch"]["fired_because"]
    hang_dir = run.reports()[0]
    assert (hang_dir / "snapshot.json.gz").stat().st_size > 0
    assert "collective_mismatch" in (hang_dir / "report.txt").read_text()
    assert "HANG collective_mismatch (culprit ranks 2)" in run.err()
    assert tagged_pids(run.tag) == set(), "--on-hang kill left processes behind"


def test_lock_hang_with_heartbeats_learned_timeout_and_exec(watch_run, tmp_path: Path) -> None:
    marker = tmp_path / "paged.txt"
    hook = f"exec {sys.executable} -c 'import sys; open(sys.argv[1], \"w\").write(sys.argv[2])' {marker} {{report}}"
    run = watch_run(
        ["--warmup-steps", "3", "--min-stall", "2", "--warmup-timeout", "60", "--max-window", "4", "--on-hang", hook],
        2,
        ["--hang", "lock", "--at", "40", "--steps", "100", "--heartbeat"],
    )
    deadline = time.monotonic() + 150
    # the hook creates the file before it writes it: wait for its text, not its name
    while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline and run.proc.poll() is None:
        time.sleep(0.2)
    assert marker.exists() and marker.read_text(), (
        f"the --on-hang exec command did not run; stderr:\n{run.err()[-4000:]}"
    )
    hang_dir = Path(marker.read_text())
    assert hang_dir.parent == run.out
    report = json.loads((hang_dir / "report.json").read_text())
    assert report["verdict"] == "straggler"
    assert report["culprit_ranks"] == [1]
    watch = report["watch"]
    assert watch["signal"] == "heartbeat"
    assert watch["timeout_basis"].startswith("learned")
    assert watch["last_step"] == 40
    assert [d.split(" (pid")[0] for d in watch["details"]] == ["rank 0", "rank 1"], watch["details"]
    assert all(d.endswith("at step 40, inside a step") for d in watch["details"]), watch["details"]
    _within_bar(watch)
    # --on-hang exec keeps watching; the job is still there, hung
    assert run.proc.poll() is None
    assert len(tagged_pids(run.tag)) >= 3  # watch, torchrun, 2 ranks
    run.proc.terminate()  # passed on to torchrun, which ends its workers
    code = run.wait(60)
    assert code != 0 and code != 124
    assert "command exited with status" in run.err()


def test_healthy_jittery_run_never_fires(watch_run) -> None:
    port = free_port()
    # --min-stall 5, not less: after the last step torchrun takes over 2 s to exit when both
    # cores are busy, and a silence then (no rank left to diagnose) is reported as unknown
    run = watch_run(
        ["--step-regex", r"step (\d+) loss", "--warmup-steps", "5", "--min-stall", "5", "--metrics-port", str(port)],
        2,
        ["--jitter", "--steps", "300"],
    )
    scraped = ""
    deadline = time.monotonic() + 120
    while run.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        except OSError:
            continue
        if "hangdoc_watch_last_step{" in text:
            scraped = text
    code = run.wait(60)
    assert code == 0, run.err()[-3000:]
    assert run.reports() == [], run.err()[-3000:]
    assert "HANG" not in run.err()
    assert "training done" in run.stdout.read_text()
    from prometheus_client.parser import text_string_to_metric_families

    metrics = {s.name: s for f in text_string_to_metric_families(scraped) for s in f.samples}
    assert metrics["hangdoc_watch_info"].labels["signal"] == "step_line"
    assert metrics["hangdoc_watch_last_step"].value > 100
    assert metrics["hangdoc_watch_stalled"].value == 0
    assert metrics["hangdoc_watch_steps_per_second"].value > 5


def test_long_but_progressing_pause_is_not_a_hang(watch_run) -> None:
    # rank 0 spends 7 s saving a checkpoint (on CPU, writing) while rank 1 waits in a barrier.
    # The pause comes after warm-up (step 6 of 5 warm-up steps); the warm-up timeout is long
    # so that torchrun starting its workers on a loaded machine (seconds without output, no
    # rank yet: a stall that cannot be diagnosed) is not what this test measures.
    run = watch_run(
        ["--stall-after", "2", "--warmup-timeout", "60", "--max-window", "3", "--max-postpone", "6"],
        2,
        ["--pause", "7", "--at", "6", "--steps", "14"],
    )
    code = run.wait(150)
    assert code == 0, run.err()[-3000:]
    assert run.reports() == [], run.err()[-3000:]
    err = run.err()
    assert "stall suspected" in err
    assert "not a hang" in err or "not yet" in err
    assert "training done" in run.stdout.read_text()


# ----------------------------------------------------- attach to a real hung job


@pytest.mark.timeout(180)
def test_attach_samples_stacks_fires_and_kills(tmp_path: Path) -> None:
    meta = next(m for m in corpus() if m.name == "cleanup_trainer_exit_barrier")
    out = tmp_path / "hangs"
    with launch(meta, tmp_path / "job") as job:
        job.wait_ready()
        pids = job.pids()
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "hangdoc",
                "watch",
                job.job_spec(),
                "--stall-after",
                "2",
                "--check-interval",
                "1",
                "--on-hang",
                "kill",
                "--kill-grace",
                "3",
                "--out",
                str(out),
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=150,
        )
        assert result.returncode == 124, result.stderr[-3000:]
        assert all(not is_running(pid) for pid in pids), "--on-hang kill left job processes"
    (hang,) = list(out.iterdir())
    report = json.loads((hang / "report.json").read_text())
    assert report["verdict"] == meta.verdict == "cleanup_deadlock"
    assert report["culprit_ranks"] == sorted(meta.culprits)
    assert report["watch"]["signal"] == "stacks"
    assert report["watch"]["silence_seconds"] <= report["watch"]["timeout_seconds"] + report["watch"]["check_interval"]
