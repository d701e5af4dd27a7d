# hangdoc-expect: verdict=not_hung culprits=none
# hangdoc-launch: mode=spawn nproc=2
"""Healthy two-stage torch.distributed.pipelining job on the GPipe schedule, under spawn.

"A tabular regression model cut into two PipelineStages (a feature encoder on rank 0, a
deeper regressor and the loss on rank 1) and run with ScheduleGPipe: all forward
micro-batches first, then all backwards (the stages infer their p2p shapes with a
metadata handshake on the first step). Workers come from torch.multiprocessing.spawn.
The last stage spends most of every step in the schedule's irecv waits for the next
micro-batch, the first stage in the waits for the gradients -- that is how a pipeline
looks when it is fine."
"""

import datetime
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _ready import mark_ready
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

FEATURES, HIDDEN = 32, 96
BATCH, MICRO_BATCHES = 64, 8
MAX_STEPS = 40_000
WARMUP_STEPS = 3


def build_stage_module(stage_index: int) -> nn.Module:
    if stage_index == 0:
        return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.SiLU(), nn.Linear(HIDDEN, HIDDEN))
    return nn.Sequential(nn.SiLU(), nn.Linear(HIDDEN, HIDDEN), nn.SiLU(), nn.Linear(HIDDEN, 1))


def worker(rank: int, world_size: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(rank)
    module = build_stage_module(rank)
    stage = PipelineStage(module, stage_index=rank, num_stages=world_size,
                          device=torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=MICRO_BATCHES,
                             loss_fn=nn.functional.smooth_l1_loss)
    opt = torch.optim.SGD(module.parameters(), lr=1e-2, momentum=0.9)
    true_w = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(7))

    gen = torch.Generator().manual_seed(99)
    for step in range(MAX_STEPS):
        if step == WARMUP_STEPS:
            mark_ready(rank)
        x = torch.randn(BATCH, FEATURES, generator=gen)
        y = (x @ true_w).tanh() + 0.05 * torch.randn(BATCH, 1, generator=gen)
        opt.zero_grad()
        if stage.is_first:
            schedule.step(x)
        else:
            losses: list[torch.Tensor] = []
            schedule.step(target=y, losses=losses)
            if step % 200 == 0:
                print(f"step {step} loss {torch.stack(losses).mean().item():.4f}", flush=True)
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29516")
    nprocs = int(os.environ.get("HANGDOC_TEST_NPROC", "2"))
    mp.spawn(worker, args=(nprocs,), nprocs=nprocs)
