# hangdoc-expect: verdict=collective_mismatch culprits=0
# hangdoc-launch: mode=torchrun nproc=4
"""Only the logging rank launches the async grad-norm all_reduce, then waits on its handle.

"To log the global gradient norm without stalling the step we launch the all_reduce with
async_op=True, run the optimizer step, and only then call work.wait(). The logging code is
under `if rank == 0`, so ranks 1-3 never launched that all_reduce: they went on to the
next step, where rank 0 broadcasts the curriculum sampler's batch order. Rank 0 sat in
work.wait() a few lines below the all_reduce, ranks 1-3 in the broadcast waiting for rank 0."
"""

import datetime

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

LOG_EVERY = 5
POOL = 512
BATCH = 32


class CurriculumSampler:
    """Rank 0 picks which examples the step uses, easiest first."""

    def __init__(self, difficulty: torch.Tensor) -> None:
        self.order = difficulty.argsort()
        self.cursor = 0

    def next_indices(self) -> torch.Tensor:
        idx = self.order[self.cursor:self.cursor + BATCH]
        self.cursor = (self.cursor + BATCH) % (POOL - BATCH)
        return idx


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(0)
    pool_x = torch.randn(POOL, 20, generator=gen)
    pool_y = pool_x[:, :5].sum(dim=1, keepdim=True)
    sampler = CurriculumSampler(pool_y.abs().squeeze(1)) if rank == 0 else None
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 40), nn.SiLU(), nn.Linear(40, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    for step in range(10_000):
        indices = sampler.next_indices() if rank == 0 else torch.empty(BATCH, dtype=torch.long)
        mark_ready(rank)
        dist.broadcast(indices, src=0)
        shard = indices[rank::world]
        loss = nn.functional.mse_loss(model(pool_x[shard]), pool_y[shard])
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world

        norm_work = None
        if rank == 0 and (step + 1) % LOG_EVERY == 0:
            norm_sq = sum(p.grad.pow(2).sum() for p in model.parameters()).reshape(1)
            norm_work = dist.all_reduce(norm_sq, async_op=True)
        opt.step()
        if norm_work is not None:
            mark_ready(rank)
            norm_work.wait()
            print(f"step {step} loss {loss.item():.4f} grad_norm {norm_sq.sqrt().item():.4f}",
                  flush=True)


if __name__ == "__main__":
    main()
