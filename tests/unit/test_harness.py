"""The corpus harness itself: header parsing, every launch mode, and that kill() leaves nothing.

Uses a tiny job (no torch) that works under every launch mode: it finds its rank the way
the mode hands it over, marks itself ready and sleeps. The torchrun case matters most:
torchrun puts its workers in their own sessions, so killing the launcher alone leaks them.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from support.harness import JOBS_DIR, _tagged_pids, corpus, launch, load_meta
from support.tinyjob import write_job


def test_load_meta_defaults_and_optional_keys(tmp_path: Path) -> None:
    meta = load_meta(write_job(tmp_path, "mode=direct nproc=3 world=4 ranks=0,1,3 ready=0,1"))
    assert (meta.verdict, meta.culprits, meta.mode) == ("not_hung", (), "direct")
    assert (meta.nproc, meta.world, meta.ranks, meta.ready) == (3, 4, (0, 1, 3), (0, 1))
    assert (meta.spec, meta.cut, meta.settle) == ("port", False, 1.0)


def test_load_meta_rejects_inconsistent_header(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="spec=pid needs a launcher"):
        load_meta(write_job(tmp_path, "mode=direct nproc=2 spec=pid"))


def test_corpus_headers_parse() -> None:
    metas = corpus()
    assert all(meta.path.parent == JOBS_DIR for meta in metas)
    assert all(len(meta.ready) >= 1 for meta in metas)
    assert len({meta.name for meta in metas}) == len(metas)


def test_slurm_tasks_see_only_slurm_variables(tmp_path: Path) -> None:
    meta = load_meta(write_job(tmp_path, "mode=slurm nproc=2"))
    with launch(meta, tmp_path / "run") as job:
        job.wait_ready(timeout=45)
        out = job.output()
    assert "rank=0 world=None slurm=0" in out
    assert "rank=1 world=None slurm=1" in out
    assert f"master=127.0.0.1:{job.port}" in out


def test_wait_ready_reports_a_job_that_died(tmp_path: Path) -> None:
    script = write_job(tmp_path, "mode=direct nproc=2")
    script.write_text(script.read_text().replace("mark_ready(rank)", "raise SystemExit(3)"))
    with launch(load_meta(script), tmp_path / "run") as job, \
            pytest.raises(AssertionError, match="exited with code 3"):
        job.wait_ready(timeout=30)


def test_wait_ready_reports_a_slurm_task_that_died(tmp_path: Path) -> None:
    script = write_job(tmp_path, "mode=slurm nproc=3")
    script.write_text(script.read_text().replace(
        "mark_ready(rank)", "if rank == 1:\n        raise SystemExit(3)\n    mark_ready(rank)"))
    started = time.monotonic()
    with launch(load_meta(script), tmp_path / "run") as job, \
            pytest.raises(AssertionError, match="task 1: Exited with exit code 3"):
        job.wait_ready(timeout=60)
    assert time.monotonic() - started < 30  # noticed at once, not at the timeout


def test_kill_is_idempotent_and_finds_orphans(tmp_path: Path) -> None:
    meta = load_meta(write_job(tmp_path, "mode=direct nproc=1"))
    with launch(meta, tmp_path / "run") as job:
        job.wait_ready(timeout=30)
        env = dict(os.environ, HANGDOC_TEST_TAG=job.tag)
        # A daemonised grandchild: its own session, reparented away from the harness.
        subprocess.run(["setsid", "-f", "sleep", "300"], env=env, check=True)
        time.sleep(0.3)
        assert len(_tagged_pids(job.tag)) == 2
        job.kill()
        assert _tagged_pids(job.tag) == set()
    job.kill()

