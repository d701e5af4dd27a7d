"""Analysis on hand-built snapshots: every verdict rule, its culprits, its evidence."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support.factories import make_frame, make_rank, make_snapshot

from hangdoc.analysis.analyse import analyse
from hangdoc.analysis.ops import recognise
from hangdoc.model import (
    CaptureErrorKind,
    Frame,
    OpKind,
    RankSnapshot,
    SourceFile,
    ThreadStack,
    Unreachable,
    Verdict,
)

C10D = "torch/distributed/distributed_c10d.py"
LOGGER = "torch/distributed/c10d_logger.py:wrapper:83"


def in_c10d(op: str, site: str, outer: tuple[str, ...] = ("train.py:<module>:200", "train.py:main:150")):
    return [*outer, site, LOGGER, f"{C10D}:{op}:2800"]


def test_mismatch_names_minority_and_call_sites() -> None:
    snap = make_snapshot(
        [make_rank(r, in_c10d("all_gather", "metrics.py:gather_metrics:12"), world_size=4) for r in (0, 1, 2)]
        + [make_rank(3, in_c10d("all_reduce", "model.py:sync:88"), world_size=4)]
    )
    d = analyse(snap)
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH
    assert d.culprit_ranks == (3,)
    assert "rank 3 is in all_reduce (model.py:88)" in d.summary
    assert "ranks 0-2 are in all_gather (metrics.py:12)" in d.summary
    assert any("metrics.py:12" in e.words() for e in d.evidence)


def test_same_collective_everywhere_and_quiet_is_transport() -> None:
    snap = make_snapshot([make_rank(r, in_c10d("all_reduce", "train.py:step:40")) for r in range(4)])
    d = analyse(snap)
    assert d.verdict is Verdict.NCCL_TIMEOUT
    assert d.culprit_ranks == ()


def test_same_collective_with_bytes_moving_is_not_hung() -> None:
    snap = make_snapshot(
        [
            make_rank(r, in_c10d("all_reduce", "train.py:step:40"), cpu_per_sample=0.4, io_per_sample=50_000_000)
            for r in range(4)
        ]
    )
    d = analyse(snap)
    assert d.verdict is Verdict.NOT_HUNG


def test_rank_whose_op_changes_means_progress() -> None:
    a = in_c10d("all_reduce", "train.py:step:40")
    b = ["train.py:<module>:200", "train.py:main:150", "train.py:forward:20"]
    snap = make_snapshot([make_rank(0, stacks=[a, b, a]), make_rank(1, a), make_rank(2, a)])
    assert analyse(snap).verdict is Verdict.NOT_HUNG


def test_busy_rank_outside_collective_is_straggler() -> None:
    loop = ["train.py:<module>:200", "train.py:main:150", "data.py:augment:77"]
    snap = make_snapshot(
        [make_rank(r, in_c10d("all_reduce", "train.py:step:40")) for r in (0, 1, 3)]
        + [make_rank(2, loop, active=True, cpu_per_sample=0.5)]
    )
    d = analyse(snap)
    assert d.verdict is Verdict.STRAGGLER
    assert d.culprit_ranks == (2,)
    assert d.ambiguous is True
    assert any("data.py:77" in e.words() and "computing" in e.words() for e in d.evidence)


def test_lock_blocked_rank_names_the_thread() -> None:
    locked = ["train.py:<module>:200", "train.py:main:150", "threading.py:acquire:120"]
    snap = make_snapshot(
        [
            make_rank(0, in_c10d("all_reduce", "train.py:step:40")),
            make_rank(1, locked, threads={"logger": ["logger.py:flush:30"]}),
        ]
    )
    d = analyse(snap)
    assert d.verdict is Verdict.STRAGGLER
    assert d.culprit_ranks == (1,)
    assert any(
        "blocked on a lock" in e.words() and "'MainThread'" in e.words() and "'logger'" in e.words() for e in d.evidence
    )


def test_missing_rank_from_world_size() -> None:
    init = ["train.py:<module>:10", f"{C10D}:init_process_group:1500"]
    snap = make_snapshot([make_rank(r, init, world_size=4) for r in range(3)])
    d = analyse(snap)
    assert d.verdict is Verdict.RANK_MISSING
    assert d.culprit_ranks == (3,)


def test_unreachable_node_ranks_are_unknown_not_missing() -> None:
    site = in_c10d("all_reduce", "train.py:step:40")
    snap = make_snapshot(
        [make_rank(r, site, world_size=4) for r in (0, 1)],
        unreachable=[Unreachable("node2:7420", "connection refused", (2, 3))],
    )
    d = analyse(snap)
    assert d.verdict is not Verdict.RANK_MISSING
    assert 2 not in d.culprit_ranks and 3 not in d.culprit_ranks
    assert d.partial
    assert "partial evidence" in d.summary


def test_exited_rank_is_missing() -> None:
    site = in_c10d("all_reduce", "train.py:step:40")
    snap = make_snapshot(
        [make_rank(r, site, world_size=3) for r in (0, 1)]
        + [make_rank(2, site, world_size=3, error=CaptureErrorKind.PROCESS_GONE)]
    )
    d = analyse(snap)
    assert d.verdict is Verdict.RANK_MISSING
    assert d.culprit_ranks == (2,)


def test_new_group_skipped_by_one_rank_is_init_deadlock() -> None:
    new_group = [
        "train.py:<module>:10",
        "train.py:setup:30",
        f"{C10D}:new_group:5000",
        f"{C10D}:_new_group_with_tag:5100",
    ]
    snap = make_snapshot(
        [make_rank(r, new_group) for r in (0, 1, 2)] + [make_rank(3, in_c10d("all_reduce", "train.py:step:40"))]
    )
    d = analyse(snap)
    assert d.verdict is Verdict.INIT_DEADLOCK
    assert d.culprit_ranks == (3,)


def test_init_with_disagreeing_port_names_the_odd_rank() -> None:
    init = ["train.py:<module>:10", f"{C10D}:init_process_group:1500"]
    snap = make_snapshot(
        [make_rank(r, init, world_size=3, env={"MASTER_PORT": "29500"}) for r in (0, 1)]
        + [make_rank(2, init, world_size=3, env={"MASTER_PORT": "29501"})]
    )
    d = analyse(snap)
    assert d.verdict is Verdict.INIT_DEADLOCK
    assert d.culprit_ranks == (2,)
    assert any("MASTER_PORT=29501" in e.words() for e in d.evidence)


def test_exit_handler_is_cleanup() -> None:
    # after an uncaught exception, atexit handlers run with no <module> frame below them
    atexit_stack = ["train.py:_sync_on_exit:55", LOGGER, f"{C10D}:barrier:4100"]
    snap = make_snapshot([make_rank(0, in_c10d("all_reduce", "train.py:step:40")), make_rank(1, atexit_stack)])
    d = analyse(snap)
    assert d.verdict is Verdict.CLEANUP_DEADLOCK
    assert d.culprit_ranks == (1,)


def test_exit_dunder_is_cleanup() -> None:
    exit_stack = [
        "train.py:<module>:200",
        "train.py:main:150",
        "trainer.py:__exit__:60",
        "trainer.py:close:70",
        LOGGER,
        f"{C10D}:barrier:4100",
    ]
    snap = make_snapshot(
        [make_rank(r, in_c10d("all_reduce", "train.py:step:40")) for r in (0, 2, 3)] + [make_rank(1, exit_stack)]
    )
    d = analyse(snap)
    assert d.verdict is Verdict.CLEANUP_DEADLOCK
    assert d.culprit_ranks == (1,)
    assert any("trainer.py" in e.words() for e in d.evidence)


def test_finally_block_is_cleanup_from_captured_source() -> None:
    stack = ["/job/train.py:<module>:20", "/job/train.py:main:16", LOGGER, f"{C10D}:barrier:4100"]
    src = SourceFile(
        "/job/train.py",
        (
            (10, "def main():"),
            (11, "    try:"),
            (12, "        for batch in data:"),
            (13, "            step(batch)"),
            (14, "    finally:"),
            (15, "        # sync before exit"),
            (16, "        dist.barrier()"),
        ),
    )
    snap = make_snapshot([make_rank(0, in_c10d("all_reduce", "train.py:step:40")), make_rank(1, stack)])
    assert analyse(snap).verdict is Verdict.COLLECTIVE_MISMATCH  # without the source: no cleanup
    d = analyse(replace(snap, sources=(src,)))
    assert d.verdict is Verdict.CLEANUP_DEADLOCK
    assert d.culprit_ranks == (1,)


def test_work_wait_names_the_async_collective() -> None:
    frame = make_frame("/job/train.py:step:23", code="work.wait()")
    thread = ThreadStack(1, "MainThread", (make_frame("/job/train.py:<module>:40"), frame))
    src = SourceFile(
        "/job/train.py",
        (
            (20, "def step(t):"),
            (21, "    work = dist.all_reduce(t, async_op=True)"),
            (22, "    compute()"),
            (23, "    work.wait()"),
        ),
    )
    snap = make_snapshot({0: []})
    op = recognise(thread, replace(snap, sources=(src,)))
    assert op is not None and op.name == "all_reduce" and op.kind is OpKind.COLLECTIVE
    assert op.call_site == frame
    assert "line 21" in op.via


def test_ddp_backward_recognised_from_native_frames() -> None:
    frames = tuple(
        make_frame(f)
        for f in [
            "train.py:<module>:9",
            "train.py:main:30",
            "torch/_tensor.py:backward:600",
            "torch/autograd/graph.py:_engine_run_backward:800",
        ]
    )
    lib = "/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so"
    native = tuple(
        Frame(name, lib, None, native=True)
        for name in ("torch::autograd::Engine::execute", "c10d::Reducer::mark_variable_ready", "c10d::Work::wait")
    )
    op = recognise(ThreadStack(1, "MainThread", frames + native))
    assert op is not None and op.name == "all_reduce" and op.via == "native frames"
    assert op.call_site is not None and op.call_site.location == "train.py:30"


def test_functional_collective_wait() -> None:
    stack = [
        "train.py:<module>:9",
        "train.py:main:30",
        "torch/distributed/_functional_collectives.py:__torch_dispatch__:700",
        "torch/distributed/_functional_collectives.py:wait_tensor:140",
    ]
    op = recognise(ThreadStack(1, "MainThread", tuple(make_frame(f) for f in stack)))
    assert op is not None and op.kind is OpKind.COLLECTIVE and op.via == "functional collective wait"


def test_both_ranks_receiving_is_p2p_mismatch() -> None:
    def recv(r: int, peer: int) -> RankSnapshot:
        return make_rank(
            r,
            [
                "pipe.py:<module>:50",
                make_frame(f"/job/pipe.py:stage:{20 + r}", code=f"dist.recv(buf, src={peer})"),
                f"{C10D}:recv:2400",
            ],
        )

    d = analyse(make_snapshot([recv(0, 1), recv(1, 0)]))
    assert d.verdict is Verdict.COLLECTIVE_MISMATCH
    assert d.culprit_ranks == (0, 1)
    assert any("receives from rank 1" in e.words() for e in d.evidence)


@pytest.mark.parametrize("verdict", list(Verdict))
def test_every_verdict_has_next_steps(verdict: Verdict) -> None:
    from hangdoc.analysis.wording import NEXT_STEPS

    assert NEXT_STEPS[verdict]


def test_waiter_whose_thread_keeps_waking_is_progressing() -> None:
    # a slow-but-healthy job: the waiters are always caught in the same all_reduce, but each
    # step their main thread wakes (the collective completes) and waits again
    site = in_c10d("all_reduce", "train.py:step:40")
    sleeping = ["train.py:<module>:200", "train.py:main:150", "reader.py:read_batch:33"]
    snap = make_snapshot(
        [make_rank(r, site, ctx_per_sample=6) for r in (0, 1)] + [make_rank(2, sleeping, ctx_per_sample=4)]
    )
    d = analyse(snap)
    assert d.verdict is Verdict.NOT_HUNG
    assert any("woke" in e.words() for e in d.evidence)


def test_switches_from_hangdocs_own_pauses_are_not_progress() -> None:
    site = in_c10d("all_reduce", "train.py:step:40")
    snap = make_snapshot([make_rank(r, site, ctx_per_sample=2, samples=9) for r in range(3)])
    assert analyse(snap).verdict is Verdict.NCCL_TIMEOUT


def test_ranks_on_other_nodes_are_unknown_not_missing() -> None:
    # node 0 of a 2-node torchrun job: ranks 4-7 live on node 1, which nobody asked
    site = in_c10d("all_reduce", "train.py:step:40")
    env = {"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8", "GROUP_RANK": "0"}
    snap = make_snapshot([make_rank(r, site, world_size=8, env=env) for r in range(4)])
    d = analyse(snap)
    assert d.verdict is not Verdict.RANK_MISSING
    assert d.partial
    assert any("nodes that were not asked" in e.words() for e in d.evidence)


def test_missing_local_rank_of_multi_node_job_is_still_missing() -> None:
    site = in_c10d("all_reduce", "train.py:step:40")
    env = {"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8", "GROUP_RANK": "0"}
    snap = make_snapshot([make_rank(r, site, world_size=8, env=env) for r in (0, 1, 3)])
    d = analyse(snap)
    assert d.verdict is Verdict.RANK_MISSING
    assert d.culprit_ranks == (2,)


def test_polling_wait_is_not_progress() -> None:
    # the TCPStore server polls hundreds of times a second while waiting for a peer
    init = ["train.py:<module>:10", f"{C10D}:init_process_group:1500", f"{C10D}:_create_c10d_store:300"]
    snap = make_snapshot([make_rank(0, init, world_size=3, ctx_per_sample=300), make_rank(1, init, world_size=3)])
    d = analyse(snap)
    assert d.verdict is Verdict.RANK_MISSING
    assert d.culprit_ranks == (2,)


def test_rank_joining_a_thread_in_exit_is_cleanup() -> None:
    joining = [
        "train.py:<module>:200",
        "train.py:main:150",
        "trainer.py:__exit__:60",
        "threading.py:join:1100",
        "threading.py:_wait_for_tstate_lock:1140",
    ]
    snap = make_snapshot(
        [make_rank(r, in_c10d("all_reduce", "train.py:step:40")) for r in (0, 1)] + [make_rank(2, joining)]
    )
    d = analyse(snap)
    assert d.verdict is Verdict.CLEANUP_DEADLOCK
    assert d.culprit_ranks == (2,)
    assert any("trainer.py:60" in e.words() for e in d.evidence)


def test_op_is_named_by_the_api_the_user_called() -> None:
    stack = [
        "pipe.py:<module>:9",
        "pipe.py:run_stage:30",
        "torch/distributed/pipelining/stage.py:_shape_inference:500",
        f"{C10D}:recv_object_list:3300",
        f"{C10D}:recv:2400",
    ]
    op = recognise(ThreadStack(1, "MainThread", tuple(make_frame(f) for f in stack)))
    assert op is not None and op.name == "recv_object_list" and op.kind is OpKind.P2P
    assert op.call_site is not None and op.call_site.location == "pipe.py:30"


def test_retry_sleep_in_except_block_is_straggler_not_cleanup() -> None:
    stack = ["/job/train.py:<module>:90", "/job/train.py:main:80", "/job/lock.py:acquire:39"]
    src = SourceFile(
        "/job/lock.py",
        (
            (30, "    def acquire(self):"),
            (31, "        while True:"),
            (32, "            try:"),
            (33, "                fd = os.open(self.path, os.O_CREAT | os.O_EXCL)"),
            (34, "                return fd"),
            (35, "            except FileExistsError:"),
            (36, "                if time.time() > self.deadline:"),
            (37, "                    raise"),
            (38, "                # someone else holds it"),
            (39, "                time.sleep(self.poll)"),
        ),
    )
    snap = make_snapshot(
        [make_rank(r, in_c10d("all_reduce", "train.py:step:40")) for r in (0, 1)] + [make_rank(2, stack)]
    )
    d = analyse(replace(snap, sources=(src,)))
    assert d.verdict is Verdict.STRAGGLER
    assert d.culprit_ranks == (2,)


def test_ranks_reading_data_outside_any_collective_are_not_hung() -> None:
    reading = ["train.py:<module>:200", "train.py:main:150", "data.py:load_shard:20"]
    snap = make_snapshot([make_rank(r, reading, io_per_sample=8_000_000) for r in range(3)])
    assert analyse(snap).verdict is Verdict.NOT_HUNG


def test_ranks_idle_outside_any_collective_is_unknown() -> None:
    idle = ["train.py:<module>:200", "train.py:main:150", "queue.py:get:180"]
    d = analyse(make_snapshot([make_rank(r, idle) for r in range(3)]))
    assert d.verdict is Verdict.UNKNOWN
    assert d.culprit_ranks == ()


def test_unevenly_placed_ranks_on_unasked_nodes_are_unknown() -> None:
    # node1 holds ranks 1 and 2 (not the block 2-3): its local world is full, so the
    # absent ranks 0 and 3 live on nodes nobody asked
    site = in_c10d("all_reduce", "train.py:step:40")
    env = {"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4", "GROUP_RANK": "1"}
    snap = make_snapshot([make_rank(r, site, world_size=4, env=env, host="node1") for r in (1, 2)])
    d = analyse(snap)
    assert d.verdict is not Verdict.RANK_MISSING
    assert 3 not in d.culprit_ranks and d.partial
