"""Discovery on real gloo jobs under torchrun, direct launch, mp.spawn and a Slurm-style launcher."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.harness import RunningJob
from support.jobs import JOB, children_of, ready_pids, running

from hangdoc.capture.find.discover import discover
from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.errors import JobNotFound
from hangdoc.model import Note, NoteKind, RankSource

# ------------------------------------------------------------------ real jobs


@pytest.fixture(scope="module")
def torchrun_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningJob]:
    with running("torchrun", tmp_path_factory.mktemp("torchrun")) as job:
        yield job


@pytest.mark.timeout(120)
def test_torchrun_job_by_endpoint(torchrun_job: RunningJob) -> None:
    pids = ready_pids(torchrun_job)
    found = discover(parse_job_spec(f"127.0.0.1:{torchrun_job.port}"))
    assert [(r.rank, r.pid) for r in found.ranks] == [(0, pids[0]), (1, pids[1])]
    assert found.world_size == 2
    for r in found.ranks:
        assert r.rank_source is RankSource.ENV
        assert r.rank_evidence == f"RANK={r.rank}"
        assert (r.world_size, r.local_rank) == (2, r.rank)
        assert r.launcher_pid == torchrun_job.launcher.pid
        assert r.env_get("MASTER_PORT") == str(torchrun_job.port)
        assert r.env_get("TORCHELASTIC_RUN_ID") is not None
        assert r.env_get("HANGDOC_TEST_TAG") is None  # not a distributed variable
        assert r.cmdline[-1] == str(JOB)
    # rank 0's DataLoader worker and rank 1's subprocess are there, but not ranks
    workers = children_of(pids[0]) + children_of(pids[1])
    assert len(workers) == 2
    assert all(str(w) in " ".join(n.words() for n in found.notes) for w in workers)
    assert set(workers) <= {pid for n in found.notes if n.kind is NoteKind.NOT_RANKS for pid in n.pids}
    assert f"MASTER_PORT={torchrun_job.port}" in found.searched


@pytest.mark.timeout(120)
def test_torchrun_job_by_other_names_of_this_host(torchrun_job: RunningJob) -> None:
    import socket

    expected = sorted(ready_pids(torchrun_job).values())
    for host in ("localhost", socket.gethostname()):
        found = discover(parse_job_spec(f"{host}:{torchrun_job.port}"))
        assert sorted(r.pid for r in found.ranks) == expected


@pytest.mark.timeout(120)
def test_torchrun_job_by_launcher_pid(torchrun_job: RunningJob) -> None:
    pids = ready_pids(torchrun_job)
    found = discover(parse_job_spec(f"pid:{torchrun_job.launcher.pid}"))
    assert [(r.rank, r.pid) for r in found.ranks] == [(0, pids[0]), (1, pids[1])]


@pytest.mark.timeout(120)
def test_pid_of_one_rank_takes_in_its_job_on_this_node(torchrun_job: RunningJob) -> None:
    pids = ready_pids(torchrun_job)
    found = discover(parse_job_spec(f"pid:{pids[1]}"))
    assert [(r.rank, r.pid) for r in found.ranks] == [(0, pids[0]), (1, pids[1])]
    assert (
        Note(
            f"pid {pids[1]} is rank 1 of the job at 127.0.0.1:{torchrun_job.port}; took in its 2 ranks on this node",
            NoteKind.WIDENED,
        )
        in found.notes
    )


@pytest.mark.timeout(120)
def test_pid_of_a_dataloader_worker_is_not_a_rank(torchrun_job: RunningJob) -> None:
    rank0 = ready_pids(torchrun_job)[0]
    (worker,) = children_of(rank0)
    with pytest.raises(JobNotFound, match=rf"child of rank 0 \(pid {rank0}\)"):
        discover(parse_job_spec(f"pid:{worker}"))


@pytest.mark.timeout(120)
def test_direct_job_by_endpoint(tmp_path: Path) -> None:
    with running("direct", tmp_path) as job:
        pids = ready_pids(job)
        found = discover(parse_job_spec(f"localhost:{job.port}"))
    assert [(r.rank, r.pid, r.rank_source) for r in found.ranks] == [
        (0, pids[0], RankSource.ENV),
        (1, pids[1], RankSource.ENV),
    ]
    assert found.world_size == 2
    assert {r.launcher_pid for r in found.ranks} == {None}  # started by this test itself


@pytest.mark.timeout(120)
def test_spawn_job_gets_inferred_ranks(tmp_path: Path) -> None:
    with running("spawn", tmp_path) as job:
        pids = ready_pids(job)
        parent = job.launcher.pid
        helpers = children_of(parent)
        found = discover(parse_job_spec(f"127.0.0.1:{job.port}"))
        by_pid = discover(parse_job_spec(f"pid:{parent}"))
    # the spawn index (the rank each child really has) matches the inferred one
    assert [(r.rank, r.pid) for r in found.ranks] == [(0, pids[0]), (1, pids[1])]
    assert by_pid.ranks == found.ranks
    assert found.world_size == 2
    for r in found.ranks:
        assert r.rank_source is RankSource.INFERRED
        assert r.rank_evidence.startswith(f"inferred: spawn child #{r.rank} of pid {parent}")
        assert r.launcher_pid == parent
    assert len(helpers) == 3  # the resource tracker and the two ranks
    assert any("inferred from their start order" in n.words() for n in found.notes)
    assert any("child of rank 0" in n.words() for n in found.notes)  # rank 0's DataLoader worker


@pytest.mark.timeout(120)
def test_slurm_job_by_job_id(tmp_path: Path) -> None:
    with running("slurm", tmp_path) as job:
        pids = ready_pids(job)
        job_id = psutil.Process(pids[0]).environ()["SLURM_JOB_ID"]
        found = discover(parse_job_spec(f"slurm:{job_id}"))
        step = discover(parse_job_spec(f"slurm:{job_id}.0"))
        with pytest.raises(JobNotFound, match=f"no process has SLURM_JOB_ID={job_id} SLURM_STEP_ID=5"):
            discover(parse_job_spec(f"slurm:{job_id}.5"))
    assert [(r.rank, r.pid, r.rank_evidence) for r in found.ranks] == [
        (0, pids[0], "SLURM_PROCID=0"),
        (1, pids[1], "SLURM_PROCID=1"),
    ]
    assert step.ranks == found.ranks
    assert found.world_size == 2
    assert {r.launcher_pid for r in found.ranks} == {job.launcher.pid}  # fake_srun
