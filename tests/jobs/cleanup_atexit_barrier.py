# hangdoc-expect: verdict=cleanup_deadlock culprits=0
# hangdoc-launch: mode=spawn nproc=3
"""Rank 0 crashes while logging; an atexit hook keeps it alive, waiting at a barrier.

"We start workers with torch.multiprocessing.spawn and register an atexit hook that waits
for every rank at a barrier and then destroys the process group, so that no rank tears
down gloo while another is still reducing. After a refactor renamed the scheduler's 'lr'
key, rank 0 -- the only rank that logs -- raised a KeyError on the very first step. The
traceback was printed, but the process never exited: the interpreter was running our
atexit hook, stuck in the barrier, while ranks 1 and 2 waited in the gradient all_reduce.
spawn() only reports a failure once a process has exited, so nothing else happened."
"""

import atexit
import datetime
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _ready import mark_ready
from torch import nn


def shutdown_distributed(rank: int) -> None:
    mark_ready(rank)
    dist.barrier()
    dist.destroy_process_group()


class MetricLogger:
    def __init__(self, every: int = 10) -> None:
        self.every = every
        self.rows: list[str] = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if step % self.every == 0:
            self.rows.append(f"step={step} loss={metrics['loss']:.4f} lr={metrics['lr']:.2e}")
            print(self.rows[-1], flush=True)


def worker(rank: int, world_size: int) -> None:
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    atexit.register(shutdown_distributed, rank)
    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
    logger = MetricLogger()
    for step in range(1000):
        x = torch.randn(32, 8)
        loss = nn.functional.mse_loss(model(x), x)
        opt.zero_grad()
        loss.backward()
        if rank == 0:
            logger.log(step, {"loss": loss.item(), "learning_rate": sched.get_last_lr()[0]})
        mark_ready(rank)
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        opt.step()
        sched.step()


def main() -> None:
    nprocs = int(os.environ.get("HANGDOC_TEST_NPROC", "3"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    mp.spawn(worker, args=(nprocs,), nprocs=nprocs, join=True)


if __name__ == "__main__":
    main()
