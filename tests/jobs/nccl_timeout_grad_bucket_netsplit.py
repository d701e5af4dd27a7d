# hangdoc-expect: verdict=nccl_timeout culprits=none
# hangdoc-launch: mode=netns nproc=3 cut=1
"""Three-node regression run that froze when the top-of-rack switch rebooted.

"Each node runs one worker. We average gradients ourselves (one flat bucket per step,
all_reduce, unflatten), it has worked for months. Last night the switch the three nodes
hang off went away mid-epoch. No error, no crash: the step counter stopped, every worker
sat in the bucket all_reduce, and the job burned its reservation for hours."
"""

import datetime
import os

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(nn.Module):
    def __init__(self, features: int = 24) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


def make_shard(rank: int, samples: int = 4096, features: int = 24) -> TensorDataset:
    gen = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(samples, features, generator=gen)
    true_w = torch.linspace(-1, 1, features)
    y = x @ true_w + 0.1 * torch.randn(samples, generator=gen)
    return TensorDataset(x, y)


def average_gradients(model: nn.Module, world_size: int) -> None:
    """One flat bucket instead of an all_reduce per parameter: fewer round trips."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    bucket = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(bucket, op=dist.ReduceOp.SUM)
    bucket /= world_size
    offset = 0
    for g in grads:
        g.copy_(bucket[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def main() -> None:
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)  # same init everywhere, like DDP's broadcast
    model = Regressor()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(make_shard(rank), batch_size=64, shuffle=True, drop_last=True)

    step = 0
    for epoch in range(1000):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            average_gradients(model, world_size)
            opt.step()
            step += 1
            if step == 3:
                mark_ready(rank)
            if rank == 0 and step % 50 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
