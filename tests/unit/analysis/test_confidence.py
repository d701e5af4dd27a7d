"""How sure a verdict is, and the evidence it rests on (``hangdoc.analysis.confidence``).

Every rule of ``RULES`` has a snapshot built by hand on which it applies, and the test
``test_every_rule_is_exercised`` fails when a rule is added without one. The recorded
corpus (``tests/snapshots``) pins the confidence of real hangs: clean ones are high,
anything that rests on counters or an indirectly recognised op is medium.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
from support.factories import make_frame, make_rank, make_snapshot
from support.harness import JOBS_DIR, load_meta
from support.paths import TESTS

from hangdoc.analysis import classify
from hangdoc.analysis.analyse import analyse
from hangdoc.analysis.beyond import chains_of
from hangdoc.analysis.confidence import RULES, STILL_FOR, Case, weigh_stacks
from hangdoc.analysis.views import view_rank
from hangdoc.bundle import load_snapshot
from hangdoc.model import (
    CaptureErrorKind,
    Confidence,
    Diagnosis,
    JobSnapshot,
    ProcessState,
    RankSnapshot,
    ThreadWait,
    Unreachable,
    Verdict,
    WaitKind,
)

C10D = "torch/distributed/distributed_c10d.py"
LOOP = ["train.py:<module>:200", "train.py:main:150"]
HIGH, MEDIUM, LOW = Confidence.HIGH, Confidence.MEDIUM, Confidence.LOW


def in_op(op: str = "all_reduce", line: int = 40, inner: int = 2800) -> list[str]:
    return [*LOOP, f"train.py:train_step:{line}", f"{C10D}:{op}:{inner}"]


def waiting(rank: int, op: str = "all_reduce", line: int = 40, **kw: object) -> object:
    kw.setdefault("world_size", 4)
    return make_rank(rank, in_op(op, line), **kw)  # type: ignore[arg-type]


def four_waiting(**kw: object) -> JobSnapshot:
    return make_snapshot([waiting(r, **kw) for r in range(4)])


def diagnosed(snap: JobSnapshot) -> Diagnosis:
    return analyse(snap)


def has(d: Diagnosis, text: str) -> bool:
    return any(text in phrase for phrase in d.basis)


# -- snapshots, one or more per rule ----------------------------------------------------


def transport_hang() -> JobSnapshot:
    """Every rank in the same c10d all_reduce, 3 samples, nothing moves."""
    return four_waiting()


def minority_mismatch() -> JobSnapshot:
    return make_snapshot([waiting(0), waiting(1), waiting(2), waiting(3, "all_gather", 55)])


def even_mismatch() -> JobSnapshot:
    return make_snapshot([waiting(0), waiting(1), waiting(2, "all_gather", 55),
                          waiting(3, "all_gather", 55)])  # fmt: skip


def even_init_split() -> JobSnapshot:
    init = [*LOOP, "train.py:setup:10", f"{C10D}:init_process_group:1500"]
    group = [*LOOP, "train.py:setup:20", f"{C10D}:new_group:4800"]
    return make_snapshot([make_rank(r, init if r < 2 else group, world_size=4) for r in range(4)])


def unexplained() -> JobSnapshot:
    sleeping = [*LOOP, make_frame("train.py:idle:9", code="time.sleep(60)")]
    return make_snapshot({r: sleeping for r in range(2)})


def nothing_captured() -> JobSnapshot:
    return make_snapshot([], world_size=4)


def unseen_rank() -> JobSnapshot:
    timed_out = make_rank(3, error=CaptureErrorKind.TIMEOUT, world_size=4)
    in_d = ProcessState("disk-sleep", cpu_seconds=10.0, num_threads=9)
    stuck = dataclasses.replace(timed_out, samples=tuple(dataclasses.replace(s, state=in_d) for s in timed_out.samples))
    return make_snapshot([waiting(r) for r in range(3)] + [stuck])


def silent_node() -> JobSnapshot:
    return make_snapshot([waiting(0), waiting(1)], world_size=4,
                         unreachable=[Unreachable("node1:50051", "connection refused", (2, 3))])  # fmt: skip


def unread_bystander() -> JobSnapshot:
    denied = make_rank(3, error=CaptureErrorKind.PTRACE_DENIED, world_size=4)
    return make_snapshot([waiting(0), waiting(1), waiting(2, "all_gather", 55), denied])


def one_sample() -> JobSnapshot:
    return four_waiting(samples=1)


def indirect_op() -> JobSnapshot:
    """Every rank waits on ``work.wait()`` whose issuing call is not in the captured source."""
    stack = [*LOOP, make_frame("train.py:train_step:44", code="work.wait()")]
    return make_snapshot({r: stack for r in range(4)}, world_size=4)


def busy_straggler() -> JobSnapshot:
    spin = [*LOOP, "train.py:crop:70"]
    return make_snapshot([waiting(0), waiting(1), waiting(2),
                          make_rank(3, spin, world_size=4, cpu_per_sample=0.5)])  # fmt: skip


def idle_straggler(samples: int) -> JobSnapshot:
    lock = [*LOOP, make_frame("train.py:load:80", code="with self.lock:")]
    return make_snapshot([waiting(0, samples=samples, world_size=3),
                          waiting(1, samples=samples, world_size=3),
                          make_rank(2, lock, world_size=3, samples=samples)])  # fmt: skip


def moving_in_op() -> JobSnapshot:
    """A mismatch whose minority still moves data inside its op."""
    return make_snapshot([waiting(0), waiting(1), waiting(2),
                          waiting(3, "all_gather", 55, io_per_sample=1_000_000)])  # fmt: skip


def stack_moves_in_op() -> JobSnapshot:
    """A transport hang where one rank's stack changes inside torch, its op unchanged."""
    polling = make_rank(3, stacks=[in_op(inner=2800), in_op(inner=2810), in_op(inner=2800)],
                        world_size=4)  # fmt: skip
    return make_snapshot([waiting(0), waiting(1), waiting(2), polling])


def progress_by_ops() -> JobSnapshot:
    stacks = [in_op("all_reduce", 40), in_op("broadcast", 50), in_op("all_reduce", 40)]
    return make_snapshot([make_rank(r, stacks=stacks) for r in range(2)])


def size_unknown() -> JobSnapshot:
    """Two ranks in one all_reduce, and nothing says how many ranks the job has (dumps)."""
    return dataclasses.replace(make_snapshot([make_rank(r, in_op()) for r in range(2)]), world_size=None)


def progress_partly_seen() -> JobSnapshot:
    """Ranks 0-1 complete ops; ranks 2-3 are on a node that did not answer."""
    stacks = [in_op("all_reduce", 40), in_op("broadcast", 50), in_op("all_reduce", 40)]
    return make_snapshot(
        [make_rank(r, stacks=stacks, world_size=4) for r in range(2)],
        unreachable=[Unreachable("node1:50051", "connection refused", (2, 3))],
    )


def progress_by_wakeups() -> JobSnapshot:
    return make_snapshot([make_rank(r, in_op(), ctx_per_sample=8) for r in range(2)])


def data_moving() -> JobSnapshot:
    return make_snapshot([make_rank(r, in_op(), io_per_sample=2_000_000) for r in range(2)])


def working() -> JobSnapshot:
    compute = [*LOOP, "train.py:forward:12"]
    return make_snapshot([make_rank(r, compute, cpu_per_sample=0.5) for r in range(2)])


def working_partly_seen() -> JobSnapshot:
    """Ranks 0-1 compute; ranks 2-3 are on a node that did not answer: they may wait for them."""
    compute = [*LOOP, "train.py:forward:12"]
    return make_snapshot(
        [make_rank(r, compute, cpu_per_sample=0.5, world_size=4) for r in range(2)],
        unreachable=[Unreachable("node1:50051", "connection refused", (2, 3))],
    )


def rank_missing() -> JobSnapshot:
    return make_snapshot([waiting(r) for r in range(3)], world_size=4)


def rank_exited() -> JobSnapshot:
    return make_snapshot([waiting(0), waiting(1), waiting(2), waiting(3, gone_after=0)])


def cleanup() -> JobSnapshot:
    destroy = [*LOOP, "train.py:shutdown_all:90", f"{C10D}:destroy_process_group:2100"]
    return make_snapshot([waiting(0), waiting(1), waiting(2),
                          make_rank(3, destroy, world_size=4)])  # fmt: skip


def init_env_split() -> JobSnapshot:
    init = [*LOOP, "train.py:setup:10", f"{C10D}:init_process_group:1500"]
    return make_snapshot([make_rank(r, init, world_size=3,
                                    env={"MASTER_PORT": "29501" if r == 2 else "29500"})
                          for r in range(3)])  # fmt: skip


def parted_paths() -> JobSnapshot:
    # three ops, no minority by op; ranks 0-1 in one training step, rank 2 left for eval
    step = [*LOOP, "loop.py:Loop.advance:300"]
    return make_snapshot(
        [
            make_rank(0, [*step, "loop.py:sync_sigterm:265", f"{C10D}:broadcast:2700"]),
            make_rank(1, [*step, "loop.py:backward:320", f"{C10D}:all_reduce:2800"]),
            make_rank(2, [*LOOP, "loop.py:Loop.on_advance_end:406", "eval.py:epoch_end:9", f"{C10D}:barrier:4100"]),
        ]
    )


def threads_race(arguments: bool) -> JobSnapshot:
    """Every rank: the main thread in a barrier, a checkpoint thread in an all_gather, both on
    WORLD; with ``arguments``, the call arguments say so, without, the call lines do."""
    wrapper = "torch/distributed/c10d_logger.py:_exception_logger.<locals>.wrapper:83"
    given = [(-2, {"group": "(default)"})] if arguments else []

    def rank(r: int) -> object:
        side = [
            "threading.py:Thread._bootstrap:995",
            "ckpt.py:save:12",
            make_frame("ckpt.py:gather:30", code="dist.all_gather(out, t)"),
            wrapper,
            f"{C10D}:all_gather:3100",
        ]
        return make_rank(
            r,
            [*LOOP, make_frame("train.py:main:160", code="dist.barrier()"), wrapper, f"{C10D}:barrier:4100"],
            world_size=2,
            arguments=given,
            threads={"ckpt": side},
            thread_arguments={"ckpt": given},
        )

    return make_snapshot([rank(0), rank(1)])


COMPILED = [
    *LOOP,
    make_frame("train.py:main:93", code="loss = compiled_loss(img, txt)"),
    "torch/_functorch/aot_autograd.py:aot_module_simplified.<locals>.forward:1277",
    "torch/fx/graph_module.py:_WrappedCall.__call__:493",
    "<eval_with_key>.3:forward:13",
    "torch/_ops.py:OpOverload.__call__:875",
    "torch/_ops.py:OpOverload.redispatch:882",
]


def compiled_graph(graph_op: str | None) -> JobSnapshot:
    """Ranks 0, 2, 3 idle in a compiled graph's C++ op; rank 1 in an eager all_reduce. With
    ``graph_op``, capture kept the graph's last collective node."""
    kept = [(-3, {"graph_op": graph_op})] if graph_op else []
    eager = make_rank(
        1,
        [*LOOP, make_frame("train.py:main:101", code="dist.all_reduce(stats)"), f"{C10D}:all_reduce:3252"],
        world_size=4,
    )
    return make_snapshot([make_rank(r, COMPILED, world_size=4, arguments=kept) for r in (0, 2, 3)] + [eager])


def few_moving() -> JobSnapshot:
    moving = [in_op("all_reduce", 40), in_op("broadcast", 50), in_op("all_reduce", 40)]
    return make_snapshot([make_rank(0, stacks=moving)] + [waiting(r) for r in (1, 2, 3)])


def groups_unseen(majority: str = "<ProcessGroup>", minority: str | None = None) -> JobSnapshot:
    # ranks 0-2 in an all_reduce on a group their caller passed, rank 3 in another op
    wrapper = "torch/distributed/c10d_logger.py:_exception_logger.<locals>.wrapper:83"

    def on_group(rank: int, line: int, group: str | None) -> object:
        return make_rank(
            rank,
            [*LOOP, f"train.py:train_step:{line}", wrapper, f"{C10D}:all_reduce:2800"],
            world_size=4,
            arguments=[(-2, {"group": group})] if group else [],
        )

    # rank 3's op says nothing of its group (no arguments, no line): it may be on WORLD
    return make_snapshot([*(on_group(r, 40, majority) for r in range(3)), on_group(3, 55, minority)])


def left_groups(code: bool) -> JobSnapshot:
    """Ranks 0-3 and 4-7 in all_reduce on passed groups at two places (two tensor-parallel
    groups), rank 8 at an epoch-end barrier; with ``code``, the call lines say which op runs
    on which group (no arguments); without, only the merged tree's shape says who left."""

    def site(line: int, text: str) -> object:
        return make_frame(f"train.py:train_step:{line}", code=text if code else None)

    def tp(rank: int, line: int) -> object:
        return make_rank(
            rank,
            [*LOOP, "train.py:step:90", site(line, "dist.all_reduce(x, group=tp_group)"), f"{C10D}:all_reduce:2800"],
            world_size=9,
        )

    barrier = make_rank(
        8,
        [*LOOP, make_frame("train.py:epoch_end:120", code="dist.barrier()" if code else None), f"{C10D}:barrier:4100"],
        world_size=9,
    )
    return make_snapshot([*(tp(r, 40) for r in range(4)), *(tp(r, 55) for r in range(4, 8)), barrier])


GPU = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
AT_ITEM = [*LOOP, make_frame("train.py:train_step:40", code="loss_value = loss.item()")]


def device_one_site() -> JobSnapshot:
    """Every rank spins at the same ``.item()`` on a GPU (tests/unit/analysis/test_host_sync)."""
    return make_snapshot(
        [make_rank(r, AT_ITEM, world_size=4, active=True, cpu_per_sample=0.5, env=GPU) for r in range(4)]
    )


def device_straggler() -> JobSnapshot:
    """Ranks 0-2 wait for their devices at ``.item()``; rank 3 is on a lock, watched long."""
    lock = [*LOOP, make_frame("data.py:next_batch:80", code="with self._lock:")]
    return make_snapshot(
        [
            *(
                make_rank(r, AT_ITEM, world_size=4, samples=24, active=True, cpu_per_sample=0.5, env=GPU)
                for r in range(3)
            ),
            make_rank(3, lock, world_size=4, samples=24, env=GPU),
        ]
    )


def maybe_device() -> JobSnapshot:
    """Rank 3 spins at ``.item()`` and nothing shows a GPU: read as computing, doubted."""
    return make_snapshot(
        [waiting(0), waiting(1), waiting(2), make_rank(3, AT_ITEM, world_size=4, active=True, cpu_per_sample=0.5)]
    )


def from_dump(code: str | None) -> JobSnapshot:
    """As a dump file gives it: one sample each, no counters; rank 3 on the job's line 70,
    whose text is ``code`` (None: not in the dump)."""

    def bare(snap):  # type: ignore[no-untyped-def]
        return dataclasses.replace(snap, samples=tuple(dataclasses.replace(s, state=None) for s in snap.samples))

    line = [*LOOP, make_frame("train.py:crop:70", code=code)]
    return make_snapshot(
        [bare(waiting(r, samples=1)) for r in range(3)]
        + [bare(make_rank(3, line, world_size=4, samples=1, active=True))]
    )


# (snapshot, verdict, confidence, phrases the basis must hold)
READING = ["train.py:<module>:90", "train.py:main:60", "train.py:fetch:52", "socket.py:SocketIO.readinto:706"]


def _with_waits(snap: RankSnapshot, waits: tuple[ThreadWait, ...]) -> RankSnapshot:
    return dataclasses.replace(snap, samples=tuple(dataclasses.replace(s, waits=waits) for s in snap.samples))


def waiting_outside(*, runs: bool = False, via_loop: bool = False) -> JobSnapshot:
    """Ranks 0-1 read from a server process (pid 800) that holds a lock, or runs; or from a
    front end (pid 700) whose event loop's one onward connection leads to that server."""
    server_pid = 800
    first = 700 if via_loop else server_pid
    ranks = [
        _with_waits(make_rank(r, READING), (ThreadWait(1000 + r, "recvfrom", WaitKind.SOCKET, 5, "s", (first,)),))
        for r in (0, 1)
    ]
    locked = ["server.py:run:10", "server.py:step:20"]
    server = make_rank(
        None,
        locked,
        pid=server_pid,
        samples=2,
        rank_source=None,
        stacks=[locked, ["server.py:run:11"]] if runs else None,
    )
    lock_line = dataclasses.replace(server.samples[-1].threads[0].frames[-1], code="with self.lock:")
    if not runs:
        server = dataclasses.replace(
            server,
            samples=tuple(
                dataclasses.replace(
                    s, threads=(dataclasses.replace(s.threads[0], frames=(s.threads[0].frames[0], lock_line)),)
                )
                for s in server.samples
            ),
        )
    server = _with_waits(server, (ThreadWait(server_pid, "futex", WaitKind.THREAD),))
    beyond = [server]
    if via_loop:
        front = make_rank(None, ["front.py:<module>:5", "selectors.py:EpollSelector.select:468"], pid=700, samples=2)
        loop = ThreadWait(700, "epoll_wait", WaitKind.POLL, 3, "3 pipes and sockets", (1000, 1001, server_pid))
        beyond.append(
            _with_waits(dataclasses.replace(front, process=dataclasses.replace(front.process, rank=None)), (loop,))
        )
    return dataclasses.replace(make_snapshot(ranks), beyond=tuple(beyond))


CASES: dict[str, tuple[Callable[[], JobSnapshot], Verdict, Confidence, tuple[str, ...]]] = {
    "waiting_outside": (waiting_outside, Verdict.EXTERNAL_WAIT, HIGH, (
        "each rank's wait followed past the ranks, to pid 800",)),
    "waiting_outside_on_one_that_runs": (lambda: waiting_outside(runs=True), Verdict.EXTERNAL_WAIT, MEDIUM, (
        "the ranks wait on pid 800, which runs: slow work or a loop looks the same for a while",)),
    "waiting_outside_through_an_event_loop": (lambda: waiting_outside(via_loop=True), Verdict.EXTERNAL_WAIT, MEDIUM, (
        "ranks 0-1: a link of the wait read from stacks, not named by the kernel's tables",)),
    "transport_hang": (transport_hang, Verdict.NCCL_TIMEOUT, HIGH, (
        "stacks of all 4 ranks in 3 samples agree",
        "every op read from a torch.distributed frame",
        "no waiting rank's CPU, bytes or stack moved over 1.0 s")),
    "minority_mismatch": (minority_mismatch, Verdict.COLLECTIVE_MISMATCH, HIGH, (
        "rank 3 named by its stack: the minority op",)),
    "even_mismatch": (even_mismatch, Verdict.COLLECTIVE_MISMATCH, LOW, (
        "ranks split evenly between 2 ops: no minority to blame",)),
    "even_init_split": (even_init_split, Verdict.INIT_DEADLOCK, LOW, (
        "ranks split evenly between 2 init calls",)),
    "unexplained": (unexplained, Verdict.UNKNOWN, LOW, (
        "no rank is in a distributed op and nothing moves: native frames (--native)",)),
    "nothing_captured": (nothing_captured, Verdict.UNKNOWN, LOW, ("no rank could be captured",)),
    "unseen_rank": (unseen_rank, Verdict.STRAGGLER, LOW, (
        "rank 3 could not be read (py-spy timed out; process in uninterruptible sleep (D)",
        "culprit by elimination, not by a stack")),
    "size_unknown": (size_unknown, Verdict.NCCL_TIMEOUT, LOW, (
        "the job's size is unknown: ranks not captured may be elsewhere",)),
    "progress_partly_seen": (progress_partly_seen, Verdict.NOT_HUNG, MEDIUM, (
        "1 of 2 nodes did not answer: ranks 2-3 unknown",)),
    "working_partly_seen": (working_partly_seen, Verdict.NOT_HUNG, LOW, (
        "the ranks not seen may be waiting for the ones that move: no op completed",)),
    "silent_node": (silent_node, Verdict.UNKNOWN, LOW, (
        "stacks of ranks 0-1 in 3 samples",
        "1 of 2 nodes did not answer: ranks 2-3 unknown")),
    "unread_bystander": (unread_bystander, Verdict.COLLECTIVE_MISMATCH, MEDIUM, (
        "rank 3 could not be read: what it does is unknown",)),
    "one_sample": (one_sample, Verdict.NCCL_TIMEOUT, MEDIUM, (
        "stacks of all 4 ranks in 1 sample agree", "ranks 0-3 read in 1 sample only")),
    "indirect_op": (indirect_op, Verdict.NCCL_TIMEOUT, MEDIUM, (
        ("ranks 0-3: wait recognised by Work.wait (issuing call not in the captured source); "
         "the call that issued it is not on the stack"),)),
    "busy_straggler": (busy_straggler, Verdict.STRAGGLER, MEDIUM, (
        "rank 3 named by its stack: outside any distributed op",
        "rank 3 still works (CPU, I/O or stack): it may be slow, not stuck")),
    "idle_straggler_short": (lambda: idle_straggler(3), Verdict.STRAGGLER, MEDIUM, (
        "rank 2 idle for only 1.0 s: a slow read or lock may still return",)),
    "idle_straggler_long": (lambda: idle_straggler(24), Verdict.STRAGGLER, HIGH, (
        "rank 2 stayed off CPU, without I/O, on one stack over 11.5 s: stuck, not slow",)),
    "moving_in_op": (moving_in_op, Verdict.COLLECTIVE_MISMATCH, MEDIUM, (
        "rank 3 still moves data or stack inside its op: the op may yet complete",)),
    "stack_moves_in_op": (stack_moves_in_op, Verdict.NCCL_TIMEOUT, MEDIUM, (
        "rank 3 still moves data or stack inside its op",)),
    "progress_by_ops": (progress_by_ops, Verdict.NOT_HUNG, HIGH, (
        "ranks 0-1 went through different distributed ops between samples",)),
    "progress_by_wakeups": (progress_by_wakeups, Verdict.NOT_HUNG, MEDIUM, (
        "ranks 0-1 stayed in one op: progress rests on wake-up counters",)),
    "data_moving": (data_moving, Verdict.NOT_HUNG, MEDIUM, (
        "progress rests on byte and CPU counters",)),
    "working": (working, Verdict.NOT_HUNG, MEDIUM, (
        "no rank is in a distributed op: progress rests on CPU and changing stacks",)),
    "rank_missing": (rank_missing, Verdict.RANK_MISSING, HIGH, (
        "rank 3 of world size 4 has no process",)),
    "rank_exited": (rank_exited, Verdict.RANK_MISSING, HIGH, (
        "rank 3 exited during the capture",)),
    "cleanup": (cleanup, Verdict.CLEANUP_DEADLOCK, HIGH, (
        "rank 3 named by its stack: on a cleanup path",)),
    "init_env_split": (init_env_split, Verdict.INIT_DEADLOCK, HIGH, (
        "rank 2 named by the rendezvous environment (MASTER_PORT)",)),
    "parted_paths": (parted_paths, Verdict.COLLECTIVE_MISMATCH, MEDIUM, (
        "rank 2 named by where the stacks part: the smaller path (Loop.on_advance_end",
        "the ops name no minority")),
    "groups_unseen": (groups_unseen, Verdict.COLLECTIVE_MISMATCH, MEDIUM, (
        "ranks 0-2 wait on a process group their caller passed",)),
    # the other side: the majority's op is on WORLD, which waits for rank 3; rank 3 waits on
    # its passed group for members who are in the WORLD op (they skipped its collective):
    # those are the ones to blame, and stacks do not name them
    "world_majority": (lambda: groups_unseen("(default)", "<ProcessGroup>"), Verdict.COLLECTIVE_MISMATCH, LOW, (
        "rank 3 wait on a process group whose other members wait in the others' op",)),
    # rank 8 on WORLD left a structure of passed groups read from the call lines
    "groups_from_lines": (lambda: left_groups(True), Verdict.COLLECTIVE_MISMATCH, MEDIUM, (
        "rank 8 named by the ops' process groups: on WORLD",
        "read from the call lines (`group=`), not from call arguments")),
    # no line, no argument: rank 8 is named by the tree's shape alone
    "tree_shape": (lambda: left_groups(False), Verdict.COLLECTIVE_MISMATCH, LOW, (
        "rank 8 named by the merged call tree",
        "the culprits rest on the merged tree's shape alone")),
    "threads_race": (lambda: threads_race(True), Verdict.COLLECTIVE_MISMATCH, HIGH, (
        "ranks 0-1 named by their stacks: two threads in collectives on one process group",)),
    "race_from_lines": (lambda: threads_race(False), Verdict.COLLECTIVE_MISMATCH, MEDIUM, (
        "read from the call lines (no `group=` passed)",)),
    "maybe_compiled": (lambda: compiled_graph(None), Verdict.COLLECTIVE_MISMATCH, LOW, (
        "ranks 0,2-3 are idle in a C++ op of a compiled graph, read as a collective",)),
    "compiled_node": (lambda: compiled_graph("all_gather_into_tensor"), Verdict.COLLECTIVE_MISMATCH,
                      MEDIUM, (("all_gather_into_tensor recognised by compiled graph (<eval_with_key>.3): "
                                "its last collective node"),)),
    "few_moving": (few_moving, Verdict.NOT_HUNG, MEDIUM, (
        "only rank 0 completed ops while ranks 1-3 waited throughout",)),
    "device_one_site": (device_one_site, Verdict.NCCL_TIMEOUT, LOW, (
        "ranks 0-3 wait for device work at a host sync: stacks cannot tell which collective",
        "no waiting rank's bytes or stack moved over 1.0 s (ranks 0-3 at a host sync")),
    "device_straggler": (device_straggler, Verdict.STRAGGLER, MEDIUM, (
        "ranks 0-2 wait for device work at a host sync, not in a torch.distributed frame",)),
    "maybe_device": (maybe_device, Verdict.STRAGGLER, LOW, (
        ("rank 3 spins on one line that waits for a GPU if its tensors are on one "
         "(`loss_value = loss.item()`)"),)),
    "line_unseen": (lambda: from_dump(None), Verdict.STRAGGLER, LOW, (
        ("rank 3 is on a line of the job that capture does not show (train.py:70): if it waits "
         "for a GPU"),)),
    # the other side: the line is known and waits for nothing
    "line_seen": (lambda: from_dump("crops = [crop(x) for x in batch]"), Verdict.STRAGGLER, MEDIUM, (
        "ranks 0-3 read in 1 sample only",)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_confidence_and_basis(name: str) -> None:
    build, verdict, confidence, phrases = CASES[name]
    d = diagnosed(build())
    assert d.verdict is verdict, d.summary
    assert d.confidence is confidence, d.basis
    for phrase in phrases:
        assert has(d, phrase), (phrase, d.basis)


def _case(snap: JobSnapshot) -> Case:
    views = [view_rank(r, snap) for r in snap.ranks if r.rank is not None]
    unknown = sorted(r for u in snap.unreachable for r in u.ranks)
    chains = chains_of(snap, views)
    found = classify.decide(views, [], unknown, chains=chains)
    if snap.world_size and not unknown:  # the missing ranks, as analyse finds them
        present = {v.rank for v in views}
        found = classify.decide(views, sorted(set(range(snap.world_size)) - present), unknown, chains=chains)
    known = bool(snap.world_size or any(r.process.world_size for r in snap.ranks))
    return Case.of(found, views, unknown, len(snap.unreachable), world_known=known)


def test_every_rule_is_exercised() -> None:
    """Each rule applies on at least one of the snapshots above, at its own level."""
    hit: dict[str, set[Confidence]] = {}
    for build, _, confidence, _ in CASES.values():
        case = _case(build())
        for cap, rule in RULES:
            if rule(case) is not None:
                hit.setdefault(rule.__name__, set()).add(confidence)
                assert confidence is cap or (cap is MEDIUM and confidence is LOW), rule.__name__
    assert set(hit) == {rule.__name__ for _, rule in RULES}


def test_high_when_no_rule_applies_and_the_lowest_rule_wins() -> None:
    assert weigh_stacks(_case(transport_hang()).found, _case(transport_hang()).views).confidence is HIGH
    # medium (one sample) and low (elimination) together: low
    snap = dataclasses.replace(
        unseen_rank(), ranks=tuple(dataclasses.replace(r, samples=r.samples[:1]) for r in unseen_rank().ranks)
    )
    d = diagnosed(snap)
    assert d.confidence is LOW
    assert has(d, "read in 1 sample only") and has(d, "culprit by elimination")


def test_basis_says_what_it_rests_on_before_what_lowers_it() -> None:
    d = diagnosed(silent_node())
    assert d.basis[0].startswith("stacks of ")
    assert d.basis[-1] == "1 of 2 nodes did not answer: ranks 2-3 unknown"


def test_ranks_not_asked_are_unknown_too() -> None:
    case = _case(transport_hang())
    judged = weigh_stacks(case.found, case.views, unknown=[4, 5, 6, 7], silent_nodes=0)
    assert judged.confidence is LOW  # a hang said of part of the job
    assert "ranks 4-7 not seen" in judged.basis
    assert not any(p.startswith("stacks of all") for p in judged.basis)  # not every rank was read


def test_an_ambiguous_verdict_is_not_high_until_watched_long_enough() -> None:
    assert STILL_FOR <= 12.0  # the default --max-window reaches it
    short, long = diagnosed(idle_straggler(3)), diagnosed(idle_straggler(24))
    assert short.ambiguous and long.ambiguous
    assert (short.confidence, long.confidence) == (MEDIUM, HIGH)


def test_confidence_members_say_what_they_mean() -> None:
    assert [c.value for c in Confidence] == ["high", "medium", "low"]
    body = ast.parse(inspect.getsource(Confidence)).body[0].body  # type: ignore[attr-defined]
    documented = {
        stmt.targets[0].id
        for stmt, doc in itertools.pairwise(body)
        if isinstance(stmt, ast.Assign)
        and isinstance(doc, ast.Expr)
        and isinstance(doc.value, ast.Constant)
        and isinstance(doc.value.value, str)
    }
    assert documented == {c.name for c in Confidence}


def test_a_diagnosis_nobody_weighed_claims_no_certainty() -> None:
    d = Diagnosis(Verdict.NCCL_TIMEOUT, (), "", (), (), (), ())
    assert d.confidence is LOW and d.basis == ()


# -- the recorded corpus ------------------------------------------------------------------

SNAPSHOTS = TESTS / "snapshots"
RECORDED = sorted(SNAPSHOTS.glob("*.json.gz"))

# what each recording of a real hung job comes out as; a change here is a change of the
# rules, to be made on purpose
RECORDED_CONFIDENCE = {
    "cleanup_atexit_barrier": HIGH,
    "cleanup_finally_checkpoint": HIGH,
    "cleanup_trainer_exit_barrier": HIGH,
    "init_lazy_metrics_group": HIGH,
    "init_rank0_pool_worker_killed": HIGH,
    "mismatch_async_grad_norm": MEDIUM,  # op recognised from a Work.wait line
    "mismatch_contextmanager_zero_first": HIGH,
    "mismatch_ddp_uneven_epoch_end": MEDIUM,  # DDP's all_reduce from native frames
    "mismatch_dtensor_tp_sampler_empty_batch": MEDIUM,  # DTensor funcol waits, not the calls
    "mismatch_expert_subgroup_stats": LOW,  # the members rank 3 waits for are not named
    "mismatch_funcol_skipped_batch": MEDIUM,  # functional-collective waits, not the calls
    "mismatch_new_subgroups_monitored_barrier": MEDIUM,  # groups read from call lines
    "mismatch_pipeline_schedule_p2p": HIGH,
    "mismatch_uneven_shards_eval_gather": HIGH,
    "mismatch_wrapper_two_callers": LOW,  # rank 3 in its pair's op: who skipped, unknown
    "nccl_timeout_grad_bucket_netsplit": HIGH,
    "nccl_timeout_retrieval_eval_allgather": HIGH,
    "nccl_timeout_teacher_broadcast": HIGH,
    "not_hung_big_embedding_allreduce": HIGH,
    "not_hung_checkpoint_barrier": MEDIUM,  # CPU and changing stacks, no op completed
    "not_hung_fast_steps": HIGH,
    "not_hung_grad_accumulation": MEDIUM,  # CPU and changing stacks, no op completed
    "not_hung_pipelining_interleaved": HIGH,
    "not_hung_uneven_slow_reader": MEDIUM,  # wake-up counters
    "rank_missing_never_started": HIGH,
    "rank_missing_slurm_bad_data_path": HIGH,
    "straggler_crop_retry_spin": MEDIUM,  # the culprit spins on CPU: may be slow
    "straggler_dcp_mirror_queue_full": HIGH,
    "straggler_dist_breakpoint_rank0": HIGH,
    "straggler_fifo_shard_reader": HIGH,
    "straggler_forked_worker_lock": HIGH,
    "straggler_lock_order_deadlock_curriculum": HIGH,  # a deadlock seen in every sample
    "straggler_prefetch_lock_checkpoint": HIGH,
    "straggler_stale_cache_lock": HIGH,
}


def _name(path: Path) -> str:
    return path.name.removesuffix(".json.gz")


@pytest.mark.parametrize("path", RECORDED, ids=_name)
def test_recorded_confidence(path: Path) -> None:
    snapshot = load_snapshot(path)  # saved before confidence existed: analysis recomputes it
    d = analyse(snapshot)
    assert d.basis, d.summary
    assert d.verdict.value == load_meta(JOBS_DIR / f"{_name(path)}.py").verdict  # unchanged
    expected = RECORDED_CONFIDENCE.get(_name(path))  # a recording added since: no pin yet
    if expected is not None:
        assert d.confidence is expected, d.basis
