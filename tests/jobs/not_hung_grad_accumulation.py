# hangdoc-expect: verdict=not_hung culprits=none
# hangdoc-launch: mode=torchrun nproc=2
"""Healthy but slow: ~1.5-2 s of compute per optimizer step on each worker.

"Each optimizer step accumulates gradients over eight micro-batches on CPU before one
all_reduce, so the log only moves every couple of seconds and at any instant both
workers look busy in forward/backward. People kept asking whether it was stuck."
"""

import datetime
import os
import time

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

WIDTH = 1024
MICRO_BATCH = 384
ACCUMULATION = 8
MAX_STEPS = 500  # about 15 minutes
WARMUP_STEPS = 2


class ResidualMLP(nn.Module):
    def __init__(self, width: int, depth: int = 6) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
            for _ in range(depth)
        )
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return self.head(x).squeeze(-1)


def micro_batches(gen: torch.Generator):
    target = torch.randn(WIDTH, generator=gen) / WIDTH ** 0.5
    while True:
        x = torch.randn(MICRO_BATCH, WIDTH, generator=gen)
        yield x, torch.tanh(x @ target)


def main() -> None:
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    model = ResidualMLP(WIDTH)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    data = micro_batches(torch.Generator().manual_seed(rank))

    for step in range(MAX_STEPS):
        if step == WARMUP_STEPS:
            mark_ready(rank)
        started = time.monotonic()
        opt.zero_grad()
        for _ in range(ACCUMULATION):
            x, y = next(data)
            loss = nn.functional.mse_loss(model(x), y) / ACCUMULATION
            loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= world_size
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item() * ACCUMULATION:.4f} "
                  f"({time.monotonic() - started:.1f}s)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
