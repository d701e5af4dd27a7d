# hangdoc-expect: verdict=not_hung culprits=none
# hangdoc-launch: mode=slurm nproc=3
"""Healthy recommender whose steps are dominated by one huge gradient all_reduce.

"The item embedding table is 3M x 64 floats (768 MB) and we all_reduce its dense
gradient every step. Compute is well under a second; for most of each 2-3 s step all
three tasks sit inside the same all_reduce while the bytes move, so most stack dumps
look identical. It is not hung: the step counter advances."
"""

import datetime
import os
import time

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

ITEMS = 3_000_000
DIM = 64
MAX_STEPS = 400  # about 15 minutes
WARMUP_STEPS = 2


class TwoTower(nn.Module):
    def __init__(self, user_features: int = 24) -> None:
        super().__init__()
        self.items = nn.EmbeddingBag(ITEMS, DIM, mode="mean")
        self.user = nn.Sequential(nn.Linear(user_features, 128), nn.ReLU(), nn.Linear(128, DIM))

    def forward(self, users: torch.Tensor, histories: torch.Tensor) -> torch.Tensor:
        return (self.user(users) * self.items(histories)).sum(-1)


def batches(task: int, size: int = 256, history: int = 20):
    gen = torch.Generator().manual_seed(task)
    while True:
        users = torch.randn(size, 24, generator=gen)
        histories = torch.randint(0, ITEMS, (size, history), generator=gen)
        clicked = torch.bernoulli(torch.full((size,), 0.1), generator=gen)
        yield users, histories, clicked


def main() -> None:
    torch.set_num_threads(1)
    task, ntasks = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=task,
                            world_size=ntasks, timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    model = TwoTower()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    data = batches(task)

    for step in range(MAX_STEPS):
        if step == WARMUP_STEPS:
            mark_ready(task)
        started = time.monotonic()
        users, histories, clicked = next(data)
        loss = nn.functional.binary_cross_entropy_with_logits(model(users, histories), clicked)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        synced = time.monotonic()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= ntasks
        opt.step()
        if task == 0:
            now = time.monotonic()
            print(f"step {step} loss {loss.item():.4f} step {now - started:.1f}s "
                  f"(all_reduce {now - synced:.1f}s)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
