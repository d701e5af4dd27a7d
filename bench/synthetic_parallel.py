"""Synthetic snapshots of model-parallel jobs (Megatron-style), where ranks legitimately wait
at different places, for the scale tests of culprits that explain the structure.

``bench/synthetic.py`` builds data-parallel jobs, where every rank runs the same collectives
on WORLD. Here the ranks form process groups their code passes to each collective
(``group=get_tensor_model_parallel_group()``), and different groups sit at different places
of one training step: one tensor-parallel group in attention's all_reduce, another in the
MLP's, another in the recomputation of a checkpointed layer during backward. Every group is
whole at its place, so nothing there is wrong; an *outlier* is a few ranks of one group that
went on to the epoch-end ``barrier()`` on WORLD (no group): their group waits for them in
its all_reduce, and they wait for every rank.

Shapes (``SHAPES``)::

    tp  tensor-parallel groups of ``group`` contiguous ranks, each group at one of 8
        places: attention or MLP all_reduce, in the forward or in the recomputation of
        a checkpointed layer, on the plain or the sequence-parallel path
    pp  pipeline stages (contiguous blocks): the first stage's tensor-parallel groups in
        their all_reduce, the later stages receiving activations (``recv`` on the
        pipeline group) at one of two schedule phases
    ep  expert-parallel groups of ``group`` contiguous ranks in the MoE token dispatcher's
        all_to_all_single, at the dispatch or the combine, forward or recompute

``outliers`` ranks (default 3) of the middle group are at the WORLD barrier instead; 0 gives
a healthy structure with no one outside it. ``code``: the frames carry their source lines
(a live capture) or not (a dump file without them); no snapshot here carries call arguments
(the first bundle format). The places of the groups are spread unevenly (a fixed
multiplicative hash of the group's number), so no place holds a majority of the job.

    from synthetic_parallel import parallel_snapshot, outlier_ranks
    snapshot = parallel_snapshot(10_000, "tp")
    culprits = outlier_ranks(10_000, "tp")
"""

from __future__ import annotations

import functools
import gc
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hangdoc.model import (
    Frame,
    JobSnapshot,
    ProcessState,
    RankProcess,
    RankSnapshot,
    RankSource,
    Sample,
    Stack,
    ThreadStack,
)

SHAPES = ("tp", "pp", "ep")
RANKS_PER_NODE = 8
PP_STAGES = 4

SITE = "/opt/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
MEG = "/workspace/Megatron-LM/megatron"
PRETRAIN = "/workspace/Megatron-LM/pretrain_gpt.py"
C10D = f"{SITE}/torch/distributed/distributed_c10d.py"
LOGGER = f"{SITE}/torch/distributed/c10d_logger.py"
MODULE = f"{SITE}/torch/nn/modules/module.py"
AUTOGRAD = f"{SITE}/torch/autograd"

F = tuple[str, str, int, str]  # function, file, line, source line


@functools.cache
def _frame(function: str, filename: str, line: int, code: str | None) -> Frame:
    return Frame(function, filename, line, code=code)


def _stack(frames: tuple[F, ...], code: bool) -> Stack:
    return _interned(frames, code)


@functools.cache
def _interned(frames: tuple[F, ...], code: bool) -> Stack:
    return tuple(_frame(fn, file, line, text if code else None) for fn, file, line, text in frames)


_TRUNK: tuple[F, ...] = (
    ("<module>", PRETRAIN, 310, "pretrain("),
    ("pretrain", f"{MEG}/training/training.py", 386, "iteration, num_floating_point_operations_so_far = train("),
    ("train", f"{MEG}/training/training.py", 1463, "train_step(forward_step_func,"),
    ("train_step", f"{MEG}/training/training.py", 753, "losses_reduced = forward_backward_func("),
)
_NO_PIPE = (
    "forward_backward_no_pipelining",
    f"{MEG}/core/pipeline_parallel/schedules.py",
    441,
    "output_tensor, num_tokens = forward_step(",
)
_WITH_PIPE = (
    "forward_backward_pipelining_without_interleaving",
    f"{MEG}/core/pipeline_parallel/schedules.py",
    1561,
    "",
)


def _call() -> tuple[F, ...]:
    """Calling a module: ``module(x)``."""
    return (
        ("_wrapped_call_impl", MODULE, 1736, "return self._call_impl(*args, **kwargs)"),
        ("_call_impl", MODULE, 1747, "return forward_call(*args, **kwargs)"),
    )


def _forward_to_block(recompute: bool) -> tuple[F, ...]:
    """From the schedule to the transformer block: the forward step, or a backward that
    recomputes a checkpointed layer."""
    if not recompute:
        return (
            (
                "forward_step",
                f"{MEG}/core/pipeline_parallel/schedules.py",
                275,
                "output_tensor, loss_func = forward_step_func(data_iterator, model)",
            ),
            ("forward_step", PRETRAIN, 215, "output_tensor = model(tokens, position_ids, attention_mask,"),
            *_call(),
            ("forward", f"{MEG}/core/models/gpt/gpt_model.py", 264, "hidden_states = self.decoder("),
            *_call(),
            ("forward", f"{MEG}/core/transformer/transformer_block.py", 536, "hidden_states, context = layer("),
        )
    return (
        (
            "backward_step",
            f"{MEG}/core/pipeline_parallel/schedules.py",
            363,
            "custom_backward(output_tensor[0], output_tensor_grad[0])",
        ),
        (
            "custom_backward",
            f"{MEG}/core/pipeline_parallel/schedules.py",
            166,
            "Variable._execution_engine.run_backward(",
        ),
        ("apply", f"{AUTOGRAD}/function.py", 307, "return user_fn(self, *args)"),
        ("backward", f"{MEG}/core/tensor_parallel/random.py", 292, "outputs = ctx.run_function(*detached_inputs)"),
        ("custom_forward", f"{MEG}/core/transformer/transformer_block.py", 337, "hidden_states, context = layer("),
    )


def _tp_reduce(place: int) -> tuple[F, ...]:
    """A tensor-parallel all_reduce at one of 8 places of a transformer layer."""
    recompute, mlp, seq = bool(place & 4), bool(place & 2), bool(place & 1)
    layer: tuple[F, ...] = (
        *_call(),
        (
            "forward",
            f"{MEG}/core/transformer/transformer_layer.py",
            416 if mlp else 388,
            "mlp_output_with_bias = self.mlp(pre_mlp_layernorm_output)"
            if mlp
            else "attention_output_with_bias = self.self_attention(",
        ),
        *_call(),
        (
            "forward",
            f"{MEG}/core/transformer/{'mlp' if mlp else 'attention'}.py",
            140 if mlp else 669,
            "output, output_bias = self.linear_fc2(intermediate_parallel)"
            if mlp
            else "output, bias = self.linear_proj(core_attn_out)",
        ),
        *_call(),
        (
            "forward",
            f"{MEG}/core/tensor_parallel/layers.py",
            1107,
            "output_ = reduce_scatter_to_sequence_parallel_region(output_parallel)"
            if seq
            else "output_ = reduce_from_tensor_model_parallel_region(output_parallel)",
        ),
    )
    if seq:
        tail: tuple[F, ...] = (
            (
                "reduce_scatter_to_sequence_parallel_region",
                f"{MEG}/core/tensor_parallel/mappings.py",
                495,
                "return _ReduceScatterToSequenceParallelRegion.apply(input_)",
            ),
            ("apply", f"{AUTOGRAD}/function.py", 575, "return super().apply(*args, **kwargs)"),
            (
                "forward",
                f"{MEG}/core/tensor_parallel/mappings.py",
                322,
                "return _reduce_scatter_along_first_dim(input_)",
            ),
            (
                "_reduce_scatter_along_first_dim",
                f"{MEG}/core/tensor_parallel/mappings.py",
                151,
                "dist_reduce_scatter_func(output, input_.contiguous(), group=group)",
            ),
            ("wrapper", LOGGER, 81, "return func(*args, **kwargs)"),
            ("reduce_scatter_tensor", C10D, 4202, "work.wait()"),
        )
    else:
        tail = (
            (
                "reduce_from_tensor_model_parallel_region",
                f"{MEG}/core/tensor_parallel/mappings.py",
                470,
                "return _ReduceFromModelParallelRegion.apply(input_)",
            ),
            ("apply", f"{AUTOGRAD}/function.py", 575, "return super().apply(*args, **kwargs)"),
            ("forward", f"{MEG}/core/tensor_parallel/mappings.py", 248, "return _reduce(input_)"),
            (
                "_reduce",
                f"{MEG}/core/tensor_parallel/mappings.py",
                30,
                "torch.distributed.all_reduce(input_.contiguous(), group=get_tensor_model_parallel_group())",
            ),
            ("wrapper", LOGGER, 81, "return func(*args, **kwargs)"),
            ("all_reduce", C10D, 2806, "work.wait()"),
        )
    return (*_forward_to_block(recompute), *layer, *tail)


def _ep_all_to_all(place: int) -> tuple[F, ...]:
    """The MoE token dispatcher's all_to_all on the expert-parallel group: dispatch or
    combine, forward or recompute."""
    recompute, combine = bool(place & 2), bool(place & 1)
    return (
        *_forward_to_block(recompute),
        *_call(),
        (
            "forward",
            f"{MEG}/core/transformer/transformer_layer.py",
            416,
            "mlp_output_with_bias = self.mlp(pre_mlp_layernorm_output)",
        ),
        *_call(),
        (
            "forward",
            f"{MEG}/core/transformer/moe/moe_layer.py",
            150 if combine else 142,
            "output, mlp_bias = self.token_dispatcher.token_unpermutation(expert_output, mlp_bias)"
            if combine
            else "dispatched_input, tokens_per_expert = self.token_dispatcher.token_permutation(",
        ),
        (
            "token_unpermutation" if combine else "token_permutation",
            f"{MEG}/core/transformer/moe/token_dispatcher.py",
            640 if combine else 560,
            "permutated_local_input_tokens = all_to_all(" if combine else "global_input_tokens = all_to_all(",
        ),
        (
            "all_to_all",
            f"{MEG}/core/tensor_parallel/mappings.py",
            541,
            "return _AllToAll.apply(group, input_, output_split_sizes_, input_split_sizes)",
        ),
        ("apply", f"{AUTOGRAD}/function.py", 575, "return super().apply(*args, **kwargs)"),
        (
            "forward",
            f"{MEG}/core/tensor_parallel/mappings.py",
            428,
            (
                "torch.distributed.all_to_all_single(output, input, output_split_sizes=output_split_sizes, "
                "input_split_sizes=input_split_sizes, group=group)"
            ),
        ),
        ("wrapper", LOGGER, 81, "return func(*args, **kwargs)"),
        ("all_to_all_single", C10D, 4388, "work.wait()"),
    )


def _pp_recv(phase: int) -> tuple[F, ...]:
    """A later pipeline stage receiving from the one before it, in warm-up or steady state."""
    return (
        (
            "recv_forward",
            f"{MEG}/core/pipeline_parallel/schedules.py",
            1452 if phase else 1390,
            "input_tensor = recv_forward(recv_tensor_shapes, config)",
        ),
        (
            "recv_forward",
            f"{MEG}/core/pipeline_parallel/schedules.py",
            1208,
            "input_tensors.append(p2p_communication.recv_forward(tensor_shape, config))",
        ),
        (
            "recv_forward",
            f"{MEG}/core/pipeline_parallel/p2p_communication.py",
            407,
            "input_tensor, _, _ = _communicate(",
        ),
        ("_communicate", f"{MEG}/core/pipeline_parallel/p2p_communication.py", 352, "reqs = p2p_func("),
        (
            "_p2p_ops",
            f"{MEG}/core/pipeline_parallel/p2p_communication.py",
            215,
            "torch.distributed.recv(tensor=tensor_recv_prev, src=prev_pipeline_rank, group=group)",
        ),
        ("wrapper", LOGGER, 81, "return func(*args, **kwargs)"),
        ("recv", C10D, 2391, "pg.recv([tensor], group_src_rank, tag).wait()"),
    )


_BARRIER: tuple[F, ...] = (
    ("<module>", PRETRAIN, 310, "pretrain("),
    ("pretrain", f"{MEG}/training/training.py", 386, "iteration, num_floating_point_operations_so_far = train("),
    ("train", f"{MEG}/training/training.py", 1529, "torch.distributed.barrier()"),
    ("wrapper", LOGGER, 81, "return func(*args, **kwargs)"),
    ("barrier", C10D, 4159, "work.wait()"),
)

_PIN: tuple[F, ...] = (
    ("_bootstrap", f"{STDLIB}/threading.py", 1002, "self._bootstrap_inner()"),
    ("_bootstrap_inner", f"{STDLIB}/threading.py", 1045, "self.run()"),
    ("run", f"{STDLIB}/threading.py", 982, "self._target(*self._args, **self._kwargs)"),
    ("_pin_memory_loop", f"{SITE}/torch/utils/data/_utils/pin_memory.py", 54, "do_one_step()"),
    ("get", f"{STDLIB}/multiprocessing/queues.py", 113, "if not self._poll(timeout):"),
)


def _place_of(group: int, places: int) -> int:
    """The place of a group: a fixed multiplicative hash, so the groups spread unevenly and
    no place gets them in runs."""
    return (group * 2_654_435_761 >> 7) % places


def _main(shape: str, rank: int, world: int, group: int, outliers: int) -> tuple[F, ...]:
    if rank in _outliers(world, shape, group, outliers):
        return _BARRIER
    if shape == "tp":
        return (*_TRUNK, _NO_PIPE, *_tp_reduce(_place_of(rank // group, 8)))
    if shape == "ep":
        return (*_TRUNK, _NO_PIPE, *_ep_all_to_all(_place_of(rank // group, 4)))
    stage = (rank // group) * PP_STAGES // (world // group)  # whole groups to a stage
    if stage == 0:  # the first stage computes: its tensor-parallel groups in their all_reduce
        return (*_TRUNK, _WITH_PIPE, *_tp_reduce(_place_of(rank // group, 4)))
    return (*_TRUNK, _WITH_PIPE, *_pp_recv(_place_of(rank // group, 2)))


@functools.cache
def _outliers(world: int, shape: str, group: int, outliers: int) -> frozenset[int]:
    start = (world // group // 2) * group
    if shape == "pp":  # a group of the first stage, where groups compute
        start = (world // group // PP_STAGES // 2) * group
    return frozenset(range(start, start + outliers))


def outlier_ranks(world: int, shape: str, *, group: int = 8, outliers: int = 3) -> tuple[int, ...]:
    """The ranks at the WORLD barrier: the culprits the analysis must name."""
    return tuple(sorted(_outliers(world, shape, group, outliers)))


@functools.cache
def _samples(frames: tuple[F, ...], code: bool, samples: int) -> tuple[Sample, ...]:
    """The samples every rank with ``frames`` shows (one object: a bundle interns them)."""
    threads = (
        ThreadStack(1, "MainThread", _stack(frames, code), 100),
        ThreadStack(2, "Thread-1 (_pin_memory_loop)", _stack(_PIN, code), 101),
    )
    state = ProcessState(
        status="sleeping",
        cpu_seconds=300.0,
        num_threads=40,
        read_chars=9_000_000,
        write_chars=400_000,
        ctx_switches=5_000,
        rss_bytes=6 * 2**30,
    )
    return tuple(Sample(t=round(i * 0.5, 6), threads=threads, state=state) for i in range(samples))


def _process(rank: int, world: int) -> RankProcess:
    node, local = divmod(rank, RANKS_PER_NODE)
    env = (
        ("LOCAL_RANK", str(local)),
        ("LOCAL_WORLD_SIZE", str(RANKS_PER_NODE)),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("RANK", str(rank)),
        ("WORLD_SIZE", str(world)),
    )
    return RankProcess(
        pid=50_000 + local,
        host=f"node{node:05d}",
        rank=rank,
        rank_source=RankSource.ENV,
        rank_evidence=f"RANK={rank}",
        world_size=world,
        local_rank=local,
        cmdline=("python", PRETRAIN),
        env=env,
    )


def parallel_snapshot(
    world: int, shape: str = "tp", *, group: int = 8, outliers: int = 3, code: bool = True, samples: int = 2
) -> JobSnapshot:
    """A ``world``-rank job of ``shape`` (see the module doc), ``outliers`` ranks of its
    middle group at the WORLD barrier."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; one of {', '.join(SHAPES)}")
    if world % group or world < PP_STAGES * group:
        raise ValueError(f"the world ({world}) is not {PP_STAGES} or more groups of {group} ranks")
    collecting = gc.isenabled()
    gc.disable()
    try:
        ranks = tuple(
            RankSnapshot(_process(r, world), _samples(_main(shape, r, world, group, outliers), code, samples))
            for r in range(world)
        )
    finally:
        if collecting:
            gc.enable()
    return JobSnapshot(
        spec="10.0.0.1:29500",
        ranks=ranks,
        world_size=world,
        window_seconds=0.5 * (samples - 1),
        captured_at="2025-06-01T12:00:00Z",
        hangdoc_version="synthetic",
    )
