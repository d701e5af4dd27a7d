"""Ops the stack does not spell out (issue 25): a pipelining schedule's send/recv waited on
in a helper of its own, and a compiled graph's functional collective, which runs with no
torch.distributed frame and no source. Frames as py-spy showed them on real jobs
(``tests/jobs/*pipelining*``, ``mismatch_compiled_funcol_gather``)."""

from __future__ import annotations

from dataclasses import replace

from support.factories import make_frame, make_rank, make_snapshot, make_thread

from hangdoc.analysis.analyse import analyse
from hangdoc.analysis.ops import COMPILED_MAYBE, recognise
from hangdoc.capture.read.pyspy import frame_locals
from hangdoc.model import Frame, FrameLocals, OpKind, Verdict

LOOP = ["train.py:<module>:140", "train.py:main:134"]
SCHEDULE = "torch/distributed/pipelining/schedules.py"
PIPELINE_WAIT = [
    *LOOP,
    f"{SCHEDULE}:PipelineScheduleSingle.step:785",
    f"{SCHEDULE}:Schedule1F1B._step_microbatches:1067",
    make_frame(f"{SCHEDULE}:_wait_batch_p2p:683", code="w.wait()"),
]
GRAPH = [
    *LOOP,
    "train.py:global_contrastive_loss:48",
    "torch/_functorch/aot_autograd.py:aot_module_simplified.<locals>.forward:1277",
    "torch/fx/graph_module.py:_WrappedCall.__call__:493",
    "<eval_with_key>.3:forward:13",
    "torch/_ops.py:OpOverload.__call__:875",
    "torch/_ops.py:OpOverload.redispatch:882",
]
NATIVE_WAIT = [
    Frame("c10d::wait_tensor", "/usr/lib/libtorch_cpu.so", None, native=True),
    Frame("c10d::Work::wait", "/usr/lib/libtorch_cpu.so", None, native=True),
    Frame("pthread_cond_wait", "/usr/lib/libc.so.6", None, native=True),
]


def test_a_pipeline_stage_waiting_on_its_batched_send_recv_is_in_a_p2p_op() -> None:
    op = recognise(make_thread(PIPELINE_WAIT))
    assert op is not None and (op.kind, op.name) == (OpKind.P2P, "batch_isend_irecv")
    assert op.call_site is not None and op.call_site.line == 134
    assert "pipelining schedule (_wait_batch_p2p)" in op.via


def test_torch_distributed_waiting_on_a_store_or_an_event_is_no_op() -> None:
    for code in ("self._store.wait([key])", "self._event.wait()", "cond.wait(timeout)"):
        stack = [*LOOP, make_frame("torch/distributed/elastic/agent/server/api.py:_monitor:90", code=code)]
        assert recognise(make_thread(stack)) is None, code


def test_a_stage_stuck_outside_the_schedule_is_the_straggler() -> None:
    stalled = make_rank(
        0,
        [
            *LOOP,
            "train.py:TokenStream.__next__:76",
            make_frame("queue.py:Queue.get:171", code="self.not_empty.wait()"),
            "threading.py:Condition.wait:327",
        ],
        world_size=3,
    )
    d = analyse(
        make_snapshot([stalled, make_rank(1, PIPELINE_WAIT, world_size=3), make_rank(2, PIPELINE_WAIT, world_size=3)])
    )
    assert (d.verdict, d.culprit_ranks) == (Verdict.STRAGGLER, (0,))


def test_a_compiled_graph_idle_in_a_c_op_is_its_collective_by_native_frames() -> None:
    op = recognise(make_thread([*GRAPH, *NATIVE_WAIT]))
    assert op is not None and (op.kind, op.name) == (OpKind.COLLECTIVE, "wait_tensor")
    assert op.call_site is not None and op.call_site.function == "global_contrastive_loss"
    kept = (FrameLocals(5, (("graph_op", "all_gather_into_tensor"),)),)  # the graph's frame
    op = recognise(replace(make_thread([*GRAPH, *NATIVE_WAIT]), locals=kept))
    assert op is not None and op.name == "all_gather_into_tensor"


def test_a_compiled_graph_with_neither_native_frames_nor_locals_is_maybe_a_collective() -> None:
    op = recognise(make_thread(GRAPH))
    assert op is not None and op.via == COMPILED_MAYBE
    assert recognise(make_thread(GRAPH, active=True)) is None  # computing, not waiting


def test_three_ranks_in_a_compiled_gather_name_the_rank_in_the_eager_all_reduce() -> None:
    """Was: straggler [0, 2, 3], high ("idle outside any op")."""
    eager = make_rank(
        1,
        [
            *LOOP,
            make_frame("train.py:main:101", code="dist.all_reduce(stats)"),
            "torch/distributed/distributed_c10d.py:all_reduce:3252",
        ],
        world_size=4,
    )
    d = analyse(make_snapshot([make_rank(r, GRAPH, world_size=4) for r in (0, 2, 3)] + [eager]))
    assert (d.verdict, d.culprit_ranks) == (Verdict.COLLECTIVE_MISMATCH, (1,))
    assert d.confidence.value == "low"


def test_capture_keeps_the_last_collective_node_a_graph_has_bound() -> None:
    raw = {
        "name": "forward",
        "filename": "<eval_with_key>.3",
        "line": 13,
        "locals": [
            {"name": "primals_1", "repr": "<Tensor at 0x7f>"},
            {"name": "all_reduce_1", "repr": "None"},  # freed: run before
            {"name": "all_gather_into_tensor", "repr": "<Tensor at 0x7f>"},
            {"name": "wait_tensor", "repr": "None"},
            {"name": "secret", "repr": "'hunter2'"},
        ],
    }
    assert frame_locals(4, raw) == FrameLocals(4, (("graph_op", "all_gather_into_tensor"),))
    raw["locals"] = [{"name": "primals_1", "repr": "<Tensor at 0x7f>"}]
    assert frame_locals(4, raw) is None


DCP = "torch/distributed/checkpoint"
SAVE = [
    *LOOP,
    f"{DCP}/state_dict_saver.py:save:180",
    f"{DCP}/state_dict_saver.py:_save_state_dict:513",
    f"{DCP}/utils.py:_DistWrapper.all_reduce:245",
]


def test_the_job_s_code_called_back_inside_a_torch_distributed_op_is_not_in_the_op() -> None:
    """DCP's ``_DistWrapper.all_reduce`` runs the job's storage writer on each rank, then
    gathers: a rank blocked in its writer is outside any op (was: in all_reduce, every rank
    in one op, a transport hang)."""
    writer = make_rank(
        1,
        [
            *SAVE[:-1],
            f"{DCP}/utils.py:_DistWrapper.all_reduce:241",
            f"{DCP}/state_dict_saver.py:_save_state_dict.<locals>.write_data:500",
            "train.py:MirroringWriter.write_data:55",
            make_frame("queue.py:Queue.put:140", code="self.not_full.wait()"),
            "threading.py:Condition.wait:327",
        ],
        world_size=3,
    )
    gathering = [
        *SAVE,
        "torch/distributed/distributed_c10d.py:gather_object:3631",
        "torch/distributed/distributed_c10d.py:all_gather:4287",
    ]
    op = recognise(make_thread(gathering))
    assert op is not None and op.kind is OpKind.COLLECTIVE
    assert recognise(writer.samples[-1].threads[0]) is None
    d = analyse(make_snapshot([make_rank(0, gathering, world_size=3), writer, make_rank(2, gathering, world_size=3)]))
    assert (d.verdict, d.culprit_ranks) == (Verdict.STRAGGLER, (1,))


def test_a_side_thread_on_a_group_of_its_own_is_no_race() -> None:
    """The fix the race finding gives: the side thread's collective on a passed group and
    the main thread's on WORLD are two groups, not a race; every rank in the barrier is
    the transport reading, not the race."""
    side = [
        "threading.py:Thread._bootstrap:995",
        "ckpt.py:save:12",
        make_frame("ckpt.py:gather:30", code="dist.all_gather(out, t, group=ckpt_group)"),
        "torch/distributed/distributed_c10d.py:all_gather:3100",
    ]
    main = [
        *LOOP,
        make_frame("train.py:main:160", code="dist.barrier()"),
        "torch/distributed/distributed_c10d.py:barrier:4100",
    ]
    d = analyse(make_snapshot([make_rank(r, main, world_size=2, threads={"ckpt": side}) for r in (0, 1)]))
    assert d.verdict is Verdict.NCCL_TIMEOUT and d.culprit_ranks == ()
    assert "two threads" not in d.summary
