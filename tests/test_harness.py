"""The corpus harness itself: header parsing, every launch mode, and that kill() leaves nothing.

Uses a tiny job (no torch) that works under every launch mode: it finds its rank the way
the mode hands it over, marks itself ready and sleeps. The torchrun case matters most:
torchrun puts its workers in their own sessions, so killing the launcher alone leaks them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from harness import JOBS_DIR, _tagged_pids, corpus, launch, load_meta

TINY_JOB = textwrap.dedent('''\
    # hangdoc-expect: verdict=not_hung culprits=none
    # hangdoc-launch: {launch}
    """A job that only sleeps, for testing the harness."""
    import os
    import sys
    import time

    from _ready import mark_ready


    def worker(rank):
        print(f"rank={{rank}} world={{os.environ.get('WORLD_SIZE')}} "
              f"slurm={{os.environ.get('SLURM_PROCID')}} "
              f"master={{os.environ.get('MASTER_ADDR')}}:{{os.environ.get('MASTER_PORT')}}",
              flush=True)
        mark_ready(rank)
        time.sleep(600)


    if __name__ == "__main__":
        if "HANGDOC_TEST_NPROC" in os.environ:
            import multiprocessing as mp
            ctx = mp.get_context("spawn")
            procs = [ctx.Process(target=worker, args=(r,))
                     for r in range(int(os.environ["HANGDOC_TEST_NPROC"]))]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
        else:
            worker(int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "-1"))))
''')


def write_job(tmp_path: Path, launch_line: str) -> Path:
    script = tmp_path / "job" / "tiny_job.py"
    script.parent.mkdir()
    script.write_text(TINY_JOB.format(launch=launch_line))
    shutil.copy(JOBS_DIR / "_ready.py", script.parent / "_ready.py")
    return script


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


@pytest.mark.live
@pytest.mark.timeout(60)
@pytest.mark.parametrize("launch_line,nproc", [
    ("mode=direct nproc=2", 2),
    ("mode=torchrun nproc=2", 2),
    ("mode=spawn nproc=2", 2),
    ("mode=slurm nproc=3", 3),
])
def test_launch_then_kill_leaves_no_tagged_process(tmp_path: Path, launch_line: str,
                                                   nproc: int) -> None:
    meta = load_meta(write_job(tmp_path, launch_line))
    with launch(meta, tmp_path / "run") as job:
        job.wait_ready(timeout=45)
        pids = job.pids()
        assert len(pids) >= nproc, job.output()
        assert job.launcher.pid in pids
        assert _tagged_pids(job.tag) == set(pids)
        spec = job.job_spec()
    assert _tagged_pids(job.tag) == set()
    assert not any(_exists(pid) for pid in pids)
    assert spec == (f"127.0.0.1:{job.port}" if meta.mode == "direct"
                    else f"pid:{job.launcher.pid}")
    for rank in range(nproc):
        assert f"rank={rank} " in job.output()


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


@pytest.mark.netns
@pytest.mark.live
@pytest.mark.timeout(90)
def test_netns_job_gets_namespaces_and_cleans_them_up(tmp_path: Path) -> None:
    meta = load_meta(write_job(tmp_path, "mode=netns nproc=2"))
    with launch(meta, tmp_path / "run") as job:
        job.wait_ready(timeout=45)
        prefix = job.nodes.prefix
        assert _namespaces(prefix) == {job.nodes.ns(0), job.nodes.ns(1)}
        assert job.master_addr == job.nodes.ip(0) != "127.0.0.1"
        assert f"master={job.master_addr}:{job.port}" in job.output()
    assert _tagged_pids(job.tag) == set()
    assert _namespaces(prefix) == set()


def _namespaces(prefix: str) -> set[str]:
    """This job's namespaces only: other tests may be using namespaces at the same time."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    names = {line.split()[0] for line in out.stdout.splitlines() if line.strip()}
    return {name for name in names if name.startswith(prefix)}


def _exists(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.live
@pytest.mark.timeout(60)
def test_torchrun_sets_master_for_workers_only(tmp_path: Path) -> None:
    meta = load_meta(write_job(tmp_path, "mode=torchrun nproc=2"))
    with launch(meta, tmp_path / "run") as job:
        job.wait_ready(timeout=45)
        launcher_env = Path(f"/proc/{job.launcher.pid}/environ").read_bytes()
        output = job.output()
    assert b"MASTER_PORT=" not in launcher_env
    assert f"master=127.0.0.1:{job.port}" in output
