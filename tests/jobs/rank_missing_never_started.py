# hangdoc-expect: verdict=rank_missing culprits=3
# hangdoc-launch: mode=direct nproc=3 world=4 ranks=0,1,2
"""Fine-tuning on 4 workers, but the hostfile listed the last worker twice.

"Our launcher script loops over the hostfile and starts one process per line. Someone
edited the hostfile and the fourth worker ended up as a duplicate entry, which the script
skips, so only ranks 0-2 were ever started with WORLD_SIZE=4. Nothing printed an error:
the three processes just sat there after 'building model' until we killed them."
"""

import datetime
import os

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn


class Classifier(nn.Module):
    def __init__(self, features: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def setup_distributed() -> tuple[int, int]:
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    print(f"[rank {rank}] building model, joining {world_size} workers", flush=True)
    mark_ready(rank)
    dist.init_process_group(
        backend="gloo", init_method="env://", rank=rank, world_size=world_size,
        timeout=datetime.timedelta(minutes=30),
    )
    return rank, world_size


def main() -> None:
    torch.manual_seed(0)
    model = Classifier()
    rank, world_size = setup_distributed()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step in range(100):
        x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        opt.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
