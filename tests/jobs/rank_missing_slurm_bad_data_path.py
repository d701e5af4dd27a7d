# hangdoc-expect: verdict=rank_missing culprits=2
# hangdoc-launch: mode=slurm nproc=4 ready=0,1,3 spec=slurm
"""One Slurm task dies at start-up on a bad data path; the other three wait for it.

"The sbatch script exports MASTER_ADDR/MASTER_PORT and srun starts 4 tasks. Each task
opens its own shard before joining the process group. Shard 2 had been moved to cold
storage, so task 2 raised FileNotFoundError and exited. srun only printed 'task 2: Exited
with exit code 1' (and keeps the step alive while the other tasks run); tasks 0, 1 and 3
sat in init_process_group waiting for a rank 2 that no longer existed."
"""

import datetime
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

DATA_ROOT = Path(tempfile.gettempdir()) / "hangdoc-demo-shards"


def stage_shard(rank: int) -> None:
    """Stands in for the shared filesystem: every shard is there except shard 2."""
    DATA_ROOT.mkdir(exist_ok=True)
    if rank != 2:
        staged = DATA_ROOT / f".shard-{rank:05d}.{os.getpid()}"
        torch.save(torch.randn(64, 12), staged)
        staged.rename(DATA_ROOT / f"shard-{rank:05d}.pt")


def open_shard(rank: int) -> torch.Tensor:
    path = DATA_ROOT / f"shard-{rank:05d}.pt"
    if not path.exists():
        raise FileNotFoundError(f"[task {rank}] no such shard: {path}")
    return torch.load(path)


def main() -> None:
    rank = int(os.environ["SLURM_PROCID"])
    world = int(os.environ["SLURM_NTASKS"])
    stage_shard(rank)
    data = open_shard(rank)
    mark_ready(rank)
    dist.init_process_group(
        "gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        rank=rank, world_size=world, timeout=datetime.timedelta(minutes=30),
    )
    model = nn.Linear(12, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _epoch in range(100):
        for i in range(0, len(data), 16):
            loss = model(data[i:i + 16]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
            opt.step()


if __name__ == "__main__":
    main()
