"""Discovery: which processes are ranks, with what number, under which launcher.

Here on hand-built process tables (fast, every shape) and on this node's own process
table; the same rules on real gloo jobs under every launcher are in
``tests/live/test_discover_live.py``.
"""

from __future__ import annotations

import subprocess
import time

import psutil
import pytest
from support.harness import free_port
from support.tables import PY, SPAWN, TORCHRUN, TRACKER, proc, table

from hangdoc.capture.find.discover import discover
from hangdoc.capture.find.hosts import same_host
from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.capture.find.processes import (
    PF_KTHREAD,
    ProcessTable,
    python_target,
    read_process_table,
    stat_flags,
)
from hangdoc.capture.find.rankselect import select_ranks
from hangdoc.errors import JobNotFound, UsageError
from hangdoc.model import NoteKind, RankSource

# ------------------------------------------------------------------ hand-built tables


def ranks_of(tab: ProcessTable, scope: list[int] | None = None) -> dict[int, int | None]:
    """pid -> rank of what select_ranks calls a rank."""
    chosen = select_ranks(tab, scope if scope is not None else list(tab.procs))
    return {r.proc.pid: r.rank for r in chosen.ranks}


def test_torchrun_workers_are_ranks_and_their_children_are_not() -> None:
    tab = table(
        proc(10, 1, ("/bin/bash",)),
        proc(11, 10, TORCHRUN),
        proc(12, 11, (PY, "-u", "train.py"), {"RANK": "0", "WORLD_SIZE": "2"}),
        proc(13, 11, (PY, "-u", "train.py"), {"RANK": "1", "WORLD_SIZE": "2"}),
        proc(14, 12, (PY, "-u", "train.py"), {"RANK": "0", "WORLD_SIZE": "2"}),  # DataLoader
        proc(15, 13, (PY, "-m", "torch._inductor.compile_worker"), {"RANK": "1"}),
        proc(16, 14, (PY, "-u", "train.py"), {"RANK": "0"}),  # a worker's own child
    )
    selection = select_ranks(tab, list(tab.procs))
    assert {r.proc.pid: r.rank for r in selection.ranks} == {12: 0, 13: 1}
    assert selection.rejected[11] == "launcher torchrun"
    assert selection.rejected[14] == "child of rank 0 (pid 12)"
    assert selection.rejected[15] == "child of rank 1 (pid 13)"
    assert selection.rejected[16].startswith("child of rank 0")
    assert selection.rejected[10] == "not Python"


def test_python_launcher_with_slurm_rank_above_torch_ranks_is_a_launcher() -> None:
    # torchrun-like Python launcher under srun: it has SLURM_PROCID, its workers have RANK.
    slurm = {"SLURM_PROCID": "0", "SLURM_JOB_ID": "7"}
    tab = table(
        proc(20, 1, (PY, "my_launcher.py"), slurm),
        proc(21, 20, (PY, "train.py"), {**slurm, "RANK": "0"}),
        proc(22, 20, (PY, "train.py"), {**slurm, "RANK": "1"}),
    )
    selection = select_ranks(tab, list(tab.procs))
    assert {r.proc.pid: r.rank for r in selection.ranks} == {21: 0, 22: 1}
    assert 20 in selection.launchers
    assert [r.evidence for r in selection.ranks] == ["RANK=0", "RANK=1"]


def test_rank_variables_in_priority_order() -> None:
    tab = table(
        proc(30, 1, (PY, "a.py"), {"SLURM_PROCID": "4", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0"}),
        proc(
            31,
            1,
            (PY, "b.py"),
            {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1"},
        ),
        proc(32, 1, (PY, "c.py"), {"PMI_RANK": "6", "PMI_SIZE": "8"}),
        proc(33, 1, (PY, "d.py"), {"PMIX_RANK": "7", "RANK": "x"}),
        proc(34, 1, (PY, "e.py"), {"RANK": "3", "SLURM_PROCID": "0", "WORLD_SIZE": "8"}),
    )
    chosen = {
        r.proc.pid: (r.rank, r.evidence, r.world_size, r.local_rank) for r in select_ranks(tab, list(tab.procs)).ranks
    }
    assert chosen == {
        30: (4, "SLURM_PROCID=4", 8, 0),
        31: (5, "OMPI_COMM_WORLD_RANK=5", 8, 1),
        32: (6, "PMI_RANK=6", 8, None),
        33: (7, "PMIX_RANK=7", None, None),
        34: (3, "RANK=3", 8, None),
    }


def test_spawn_children_get_inferred_ranks_in_start_order() -> None:
    master = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    tab = table(
        proc(40, 1, (PY, "train.py"), master, t=1.0),
        proc(41, 40, TRACKER, master, t=2.0),
        proc(45, 40, SPAWN, master, t=3.0),  # started first despite the higher pid
        proc(42, 40, SPAWN, master, t=3.5),
        proc(43, 40, SPAWN, master, t=3.5),
        proc(44, 42, SPAWN, master, t=9.0),  # a DataLoader worker of a spawn rank
        proc(46, 40, (PY, "-m", "tensorboard.main"), master, t=4.0),
    )
    selection = select_ranks(tab, list(tab.procs))
    inferred = {r.proc.pid: r for r in selection.ranks if r.source is RankSource.INFERRED}
    assert {pid: r.rank for pid, r in inferred.items()} == {45: 0, 42: 1, 43: 2}
    assert inferred[42].evidence == "inferred: spawn child #1 of pid 40, ordered by start time"
    assert {r.world_size for r in inferred.values()} == {3}
    assert 40 in selection.launchers
    assert selection.rejected[41] == "multiprocessing resource tracker"
    assert selection.rejected[44].startswith("child of rank 1")
    assert any("inferred from their start order" in n.words() for n in selection.notes)
    assert {NoteKind.SPAWN_ORDER, NoteKind.NOT_RANKS} <= {n.kind for n in selection.notes}
    (workers,) = [n for n in selection.notes if n.kind is NoteKind.NOT_RANKS]
    assert workers.pids == (44,) and workers.listed.startswith("pid 44 (child of rank 1")


def test_fork_started_siblings_running_the_same_command_are_inferred() -> None:
    cmd = (PY, "launch_all.py")
    tab = table(
        proc(50, 1, cmd, t=1.0),
        proc(52, 50, cmd, t=2.0),
        proc(51, 50, cmd, t=2.0),
    )
    assert ranks_of(tab) == {51: 0, 52: 1}


def test_lone_python_process_without_rank_is_a_rank_of_unknown_number() -> None:
    tab = table(proc(60, 1, (PY, "train.py"), {"MASTER_PORT": "1"}))
    selection = select_ranks(tab, [60])
    assert [(r.proc.pid, r.rank, r.source) for r in selection.ranks] == [(60, None, None)]
    assert "no rank in its start-up environment" in selection.notes[0].words()
    assert selection.notes[0].kind is NoteKind.NO_RANK


def test_forkserver_is_a_helper_but_its_workers_are_candidates() -> None:
    fs = (PY, "-c", "from multiprocessing.forkserver import main; main(8, 9)")
    tab = table(
        proc(70, 1, (PY, "train.py"), t=1.0),
        proc(71, 70, fs, t=2.0),
        proc(72, 71, fs, t=3.0),
        proc(73, 71, fs, t=4.0),
    )
    selection = select_ranks(tab, list(tab.procs))
    assert {r.proc.pid: r.rank for r in selection.ranks} == {72: 0, 73: 1}
    assert selection.rejected[71] == "multiprocessing forkserver"


def test_ranks_are_sorted_with_unknown_last_and_duplicates_noted() -> None:
    tab = table(
        proc(80, 1, (PY, "x.py"), {"RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "9"}),
        proc(81, 1, (PY, "x.py"), {"RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "9"}),
        proc(82, 1, (PY, "y.py"), {"MASTER_ADDR": "h", "MASTER_PORT": "9"}),
        proc(83, 1, (PY, "x.py"), {"RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "9"}),
    )
    found = discover(parse_job_spec("h:9"), host="node7", table=tab)
    assert [(r.rank, r.pid) for r in found.ranks] == [(0, 81), (1, 80), (1, 83), (None, 82)]
    assert any("rank 1 is claimed by 2 processes (pids 80, 83)" in n.words() for n in found.notes)
    (claimed,) = [n for n in found.notes if n.kind is NoteKind.RANK_CLAIMED]
    assert claimed.pids == (80, 83) and claimed.node == ""  # one node: the Discovery names none
    assert {r.host for r in found.ranks} == {"node7"}


def test_endpoint_spec_compares_local_names_loosely() -> None:
    tab = table(
        proc(90, 1, (PY, "x.py"), {"RANK": "0", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}),
        proc(91, 1, (PY, "x.py"), {"RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}),
        proc(92, 1, (PY, "x.py"), {"RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29501"}),
        proc(93, 1, (PY, "x.py"), {"RANK": "0", "MASTER_ADDR": "10.255.1.2", "MASTER_PORT": "29500"}),
    )
    import socket

    for host in ("127.0.0.1", "localhost", socket.gethostname()):
        found = discover(parse_job_spec(f"{host}:29500"), table=tab)
        assert sorted(r.pid for r in found.ranks) == [90, 91], host


def test_same_host() -> None:
    assert same_host("localhost", "127.0.0.1")
    assert same_host("[::1]", "localhost")
    assert same_host("Node1.", "node1")
    assert not same_host("10.255.1.2", "10.255.1.3")
    assert not same_host("10.255.1.2", "127.0.0.1")


def test_env_is_selected_and_redacted() -> None:
    env = {
        "RANK": "0",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "9",
        "NCCL_DEBUG": "INFO",
        "HF_TOKEN": "hf_secret",
        "HOME": "/root",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "NCCL_IB_AUTH_KEY": "k",
        "LS_COLORS": "x",
    }
    tab = table(proc(95, 1, (PY, "x.py", "--hf-token", "abc"), env))
    (rank,) = discover(parse_job_spec("h:9"), table=tab).ranks
    assert dict(rank.env) == {
        "RANK": "0",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "9",
        "NCCL_DEBUG": "INFO",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "NCCL_IB_AUTH_KEY": "<redacted>",
    }
    assert rank.cmdline == (PY, "x.py", "--hf-token", "<redacted>")


def test_matches_without_ranks_explain_why() -> None:
    tab = table(
        proc(100, 1, ("/bin/bash", "run.sh"), {"MASTER_ADDR": "h", "MASTER_PORT": "9"}),
        proc(101, 100, TORCHRUN, {"MASTER_ADDR": "h", "MASTER_PORT": "9"}),
    )
    with pytest.raises(
        JobNotFound,
        match=r"matched 2 processes but none is a rank: "
        r"pid 100 \(bash\): not Python; pid 101",
    ):
        discover(parse_job_spec("h:9"), table=tab)


def test_no_match_says_what_was_searched_and_what_exists() -> None:
    tab = table(proc(110, 1, (PY, "x.py"), {"RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "9"}))
    tab.unreadable = 3
    with pytest.raises(JobNotFound) as info:
        discover(parse_job_spec("h:10"), host="n1", table=tab)
    assert str(info.value) == (
        "no process has MASTER_ADDR=h MASTER_PORT=10; searched 1 "
        "processes, 3 unreadable on n1; endpoints seen here: h:9 (1)"
    )


def test_ray_jobs_are_found_only_by_agents_placed_as_ray_actors(monkeypatch) -> None:
    # a standalone agent (or `hangdoc diagnose` with --agents) has no Ray node of its own:
    # it says how a ray: job is diagnosed instead of guessing from the process table
    monkeypatch.delenv("HANGDOC_RAY_NODE_ID", raising=False)
    monkeypatch.delenv("HANGDOC_RAY_ADDRESS", raising=False)
    with pytest.raises(UsageError, match="Ray jobs are found by the agents hangdoc places as Ray actors"):
        discover(parse_job_spec("ray:02000000"), table=table())


@pytest.mark.parametrize(
    ("cmdline", "target"),
    [
        ((PY, "train.py", "--x"), "train.py"),
        ((PY, "-u", "-W", "ignore", "train.py"), "train.py"),
        ((PY, "-m", "torch.distributed.run", "x.py"), "-m torch.distributed.run"),
        ((PY, "-mtorch.distributed.run"), "-m torch.distributed.run"),
        ((PY, "-B", "-c", "pass"), "-c"),
        ((PY,), None),
    ],
)
def test_python_target(cmdline: tuple[str, ...], target: str | None) -> None:
    assert python_target(cmdline) == target


def test_read_process_table_sees_this_node() -> None:
    tab = read_process_table()
    me = psutil.Process()
    assert me.pid not in tab.procs  # hangdoc never counts itself
    assert me.ppid() in tab.procs or me.ppid() == 1
    # no kernel threads (by their PF_KTHREAD flag: "parent is pid 2" is no test in a container)
    assert not any((stat_flags(p) or 0) & PF_KTHREAD for p in tab.procs)


@pytest.mark.timeout(60)
def test_unused_endpoint_is_job_not_found() -> None:
    port = free_port()
    with pytest.raises(JobNotFound) as info:
        discover(parse_job_spec(f"127.0.0.1:{port}"))
    message = str(info.value)
    assert message.startswith(f"no process has MASTER_ADDR=127.0.0.1 MASTER_PORT={port}; searched ")
    assert "unreadable" in message
    assert "\n" not in message


@pytest.mark.timeout(60)
def test_pid_that_does_not_exist_is_job_not_found() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    with pytest.raises(JobNotFound, match=f"no process with pid {child.pid} on "):
        discover(parse_job_spec(f"pid:{child.pid}"))


@pytest.mark.timeout(60)
def test_pid_of_a_non_python_process_is_job_not_found() -> None:
    sleeper = subprocess.Popen(["sleep", "100"])
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(sleeper.pid).name() != "sleep" and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(JobNotFound, match=rf"pid {sleeper.pid} \(sleep\): not Python"):
            discover(parse_job_spec(f"pid:{sleeper.pid}"))
    finally:
        sleeper.kill()
        sleeper.wait()
