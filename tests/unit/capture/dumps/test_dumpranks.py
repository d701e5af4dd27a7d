"""Which processes of a dump file are ranks, and their numbers (``capture.dumps.dumpranks``)."""

from __future__ import annotations

import pytest

from hangdoc.capture.dumps.dumped import text_frame
from hangdoc.capture.dumps.dumpranks import Hint, hint, not_a_rank, number, ray_actor
from hangdoc.model import RankSource, ThreadStack


@pytest.mark.parametrize(
    ("cmdline", "label", "rank", "env", "local", "world"),
    [
        ("RANK=3 WORLD_SIZE=8 python train.py", "", 3, True, None, 8),
        ("SLURM_PROCID=5 python train.py", "", 5, True, None, None),
        ("python train.py --rank 3 --world-size 4", "", 3, False, None, 4),
        ("python train.py --rank=3", "", 3, False, None, None),
        ("python train.py --global-rank=6", "", 6, False, None, None),
        ("python -u main.py --local_rank=2 --lr 3", "", None, False, 2, None),
        ("python main.py --local-rank 1", "", None, False, 1, None),
        ("LOCAL_RANK=1 python main.py", "", None, False, 1, None),
        ("python train.py --node_rank 1 --lora_rank 16", "", None, False, None, None),
        ("python train.py --rank=²", "", None, False, None, None),  # not ASCII digits
        ("python train.py", "=== rank 3 (pid 4711) ===", 3, False, None, None),
        ("python train.py", "[rank3]: dumping", 3, False, None, None),
        ("python train.py", "Rank 2:", 2, False, None, None),
        ("python train.py", "local_rank 2", None, False, None, None),
        ("python train.py", "rank 1 waits for rank 2", None, False, None, None),  # two ranks
    ],
)
def test_hints_from_command_line_and_label(cmdline, label, rank, env, local, world) -> None:
    found = hint(cmdline, label)
    assert (found.rank, found.rank_is_env, found.local_rank, found.world_size) == (rank, env, local, world)


def test_label_names_a_pid() -> None:
    assert hint("", "========== PID 4711 ==========").pid == 4711
    assert hint("", "pid 1 and pid 2").pid is None


def test_distinct_hints_are_used() -> None:
    found = number([hint("RANK=1 python t.py", ""), hint("python t.py --rank 0", "")])
    assert [r[:2] for r in found.ranks] == [(1, RankSource.ENV), (0, RankSource.INFERRED)]
    assert "command line" in found.note and "RANK=1" in found.ranks[0][2]


def test_labels_give_ranks_in_any_order() -> None:
    found = number([hint("", "== rank 2 =="), hint("", "== rank 0 =="), hint("", "== rank 1 ==")])
    assert [r[0] for r in found.ranks] == [2, 0, 1] and "the line before each dump" in found.note


def test_local_ranks_are_used_when_no_global_rank_shows() -> None:
    found = number([hint("python m.py --local_rank=1", ""), hint("python m.py --local_rank=0", "")])
    assert [r[0] for r in found.ranks] == [1, 0] and "one node assumed" in found.note


@pytest.mark.parametrize(
    ("hints", "why"),
    [
        ([Hint(rank=16), Hint(rank=16)], "processes show the same rank"),  # LoRA's --rank 16
        ([Hint(rank=1), Hint()], "ranks shown on only some processes"),
        ([Hint(), Hint()], "no process shows its rank"),
        ([Hint(local_rank=0), Hint(local_rank=0)], "no process shows its rank"),  # two nodes
    ],
)
def test_otherwise_the_file_order_is_used_and_said(hints, why) -> None:
    found = number(hints)
    assert [r[:2] for r in found.ranks] == [(0, RankSource.INFERRED), (1, RankSource.INFERRED)]
    assert why in found.note and "order of the dumps" in found.note


def test_world_size_only_when_all_agree() -> None:
    assert number([Hint(rank=0, world_size=4), Hint(rank=1)]).world_size == 4
    assert number([Hint(rank=0, world_size=4), Hint(rank=1, world_size=8)]).world_size is None


def _thread(*frames: tuple[str, str], name: str = "MainThread") -> ThreadStack:
    """A thread from (function, file as py-spy's text shows it), innermost first."""
    return ThreadStack(1, name, tuple(text_frame(f, path, 1) for f, path in reversed(frames)))


@pytest.mark.parametrize(
    ("thread", "cmdline", "why"),
    [
        (
            _thread(("_worker_loop", "torch/utils/data/_utils/worker.py"), ("run", "process.py")),
            "python t.py",
            "a DataLoader worker",
        ),
        (
            _thread(
                ("_invoke_run", "torch/distributed/elastic/agent/server/api.py"), ("main", "torch/distributed/run.py")
            ),
            "torchrun t.py",
            "torchrun",
        ),
        (
            _thread(
                ("ProcessContext.join", "torch/multiprocessing/spawn.py"),
                ("start_processes", "torch/multiprocessing/spawn.py"),
                ("main", "t.py"),
            ),
            "python t.py",
            "mp.spawn's parent",
        ),
        (_thread(("main_loop", "ray/_private/worker.py")), "ray::IDLE", "idle Ray worker"),
    ],
)
def test_processes_that_are_not_ranks(thread, cmdline, why) -> None:
    assert why in (not_a_rank([thread], cmdline) or "")


def test_ranks_are_ranks() -> None:
    spawned = _thread(
        ("all_reduce", "torch/distributed/distributed_c10d.py"),
        ("fn", "t.py"),
        ("_wrap", "torch/multiprocessing/spawn.py"),
    )
    assert not_a_rank([spawned], "python -c from multiprocessing.spawn import spawn_main") is None
    assert ray_actor("ray::RayTrainWorker._RayTrainWorker__execute") == "RayTrainWorker"
    assert ray_actor("python t.py") is None
