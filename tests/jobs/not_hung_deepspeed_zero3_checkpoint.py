# hangdoc-expect: verdict=not_hung culprits=none
# hangdoc-launch: mode=torchrun nproc=3 settle=2
"""Healthy DeepSpeed ZeRO-3 run that checkpoints often, on every rank as it must.

"A small regression MLP under ZeRO stage 3 (parameters partitioned, all-gathered in every
forward and backward, gradients reduce-scattered), CPU workers on gloo under torchrun.
Batches come from a reader that takes a few tens of milliseconds. Every 25 steps every
rank calls `engine.save_checkpoint()` -- barriers, a tag check and each rank writing its
own partition. Slow and bursty, never stuck: hangdoc must not call it hung."

(On CPU, DeepSpeed JIT-compiles a shared-memory all_reduce kernel for inference when its
communication backend starts: two minutes of g++ on a fresh machine. Training never uses
it, so the job marks that op unavailable before `init_distributed`, as our CI image does.)
"""

import datetime
import os
import tempfile
import time
import warnings

import deepspeed
import deepspeed.comm as ds_dist
import deepspeed.ops
import torch
from _ready import mark_ready
from torch import nn

warnings.filterwarnings("ignore")
MAX_STEPS = 12_000  # about 15 minutes on two shared cores
WARMUP_STEPS = 3
SAVE_EVERY = 25
READ_LATENCY = 0.03  # seconds per batch
CKPT_DIR = os.path.join(tempfile.gettempdir(), "hangdoc-corpus", "deepspeed-z3")
CONFIG = {
    "train_micro_batch_size_per_gpu": 16,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "steps_per_print": 1_000_000,
}


def read_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    time.sleep(READ_LATENCY)
    gen = torch.Generator().manual_seed(step * 13 + rank)
    x = torch.randn(16, 32, generator=gen)
    return x, x[:, :8].sum(dim=1, keepdim=True)


def main() -> None:
    torch.set_num_threads(1)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no JIT build at start
    deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(hours=1))
    rank = ds_dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(),
                          nn.Linear(128, 1))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=CONFIG)
    for step in range(1, MAX_STEPS + 1):
        if step == WARMUP_STEPS + 1:
            mark_ready(rank)
        x, y = read_batch(rank, step)
        loss = nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        if step % SAVE_EVERY == 0:
            engine.save_checkpoint(CKPT_DIR, tag="last")  # on every rank
            if rank == 0:
                print(f"step {step} loss {loss.item():.4f} saved", flush=True)


if __name__ == "__main__":
    main()
