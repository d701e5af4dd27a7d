# hangdoc-expect: verdict=not_hung culprits=none
# hangdoc-launch: mode=spawn nproc=3
"""Healthy but lopsided: one worker reads its shard from a slow mount, ~3 s per batch.

"Worker 2 landed on the node whose dataset mount goes over the old NFS gateway. Every
step, workers 0 and 1 finish in a fraction of a second and then sit in the gradient
all_reduce for about three seconds until worker 2's batch arrives. Slow, but it moves:
the loss goes down one step every ~3 s."
"""

import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _ready import mark_ready
from torch import nn

MAX_STEPS = 300  # about 15 minutes at ~3 s per step
WARMUP_STEPS = 2


class ShardReader:
    """Reads fixed-size batches of (features, label) from this worker's shard."""

    def __init__(self, rank: int, seconds_per_batch: float) -> None:
        self.gen = torch.Generator().manual_seed(rank)
        self.seconds_per_batch = seconds_per_batch

    def read_batch(self, size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.seconds_per_batch)  # network filesystem round trips
        x = torch.randn(size, 40, generator=self.gen)
        return x, (x[:, 0] * x[:, 1] > 0).long()


def mount_latency(rank: int) -> float:
    return 3.0 if rank == 2 else 0.05


def run(rank: int, world_size: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    reader = ShardReader(rank, mount_latency(rank))

    for step in range(MAX_STEPS):
        if step == WARMUP_STEPS:
            mark_ready(rank)
        x, y = reader.read_batch()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= world_size
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    nprocs = int(os.environ.get("HANGDOC_TEST_NPROC", "3"))
    mp.spawn(run, args=(nprocs,), nprocs=nprocs)
