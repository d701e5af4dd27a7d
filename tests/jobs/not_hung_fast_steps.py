# hangdoc-expect: verdict=not_hung culprits=none
# hangdoc-launch: mode=direct nproc=2
"""Healthy click-through-rate model: tens of small steps per second on two workers.

"Nothing is wrong with this one; it is the job we point hangdoc at to make sure it does
not cry wolf. Each step reads a small batch of records (a few milliseconds of I/O),
runs a tiny MLP and all_reduces the gradients."
"""

import datetime
import os
import time

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

MAX_STEPS = 40_000  # about 15 minutes at ~45 steps/s
WARMUP_STEPS = 3


class ClickLog(IterableDataset):
    """Endless stream of (dense features, clicked) records from this worker's log files."""

    def __init__(self, rank: int, read_latency: float = 0.004) -> None:
        self.rank = rank
        self.read_latency = read_latency

    def __iter__(self):
        gen = torch.Generator().manual_seed(self.rank)
        weights = torch.linspace(-2, 2, 13)
        while True:
            time.sleep(self.read_latency)  # one record from the log reader
            features = torch.randn(13, generator=gen)
            clicked = torch.bernoulli(torch.sigmoid(features @ weights), generator=gen)
            yield features, clicked


def main() -> None:
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(13, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
    loader = DataLoader(ClickLog(rank), batch_size=4)

    seen = torch.zeros(1)
    for step, (features, clicked) in enumerate(loader):
        if step == MAX_STEPS:
            break
        if step == WARMUP_STEPS:
            mark_ready(rank)
        logits = model(features).squeeze(-1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, clicked)
        opt.zero_grad()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= world_size
        opt.step()
        seen += len(clicked)
        if step % 500 == 0:
            total = seen.clone()
            dist.all_reduce(total)
            if rank == 0:
                print(f"step {step} records {int(total.item())} loss {loss.item():.3f}",
                      flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
