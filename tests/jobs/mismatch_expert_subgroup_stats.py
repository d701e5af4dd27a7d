# hangdoc-expect: verdict=collective_mismatch culprits=none
# hangdoc-launch: mode=slurm nproc=4 spec=port
"""A data-dependent collective on an expert-parallel subgroup that only one rank enters.

"Our toy MoE layer places expert 1 on ranks 2 and 3, which share an expert-parallel group.
To balance the router we all_reduce the expert's token counts inside that group -- but
only `if tokens_routed > 0`, to save a collective when the expert is idle. In step 0 the
router sent no tokens from rank 2's batch to expert 1, so rank 2 skipped the reduction and
went on to the gradient all_reduce over the whole world, together with ranks 0 and 1. Rank
3 routed a few tokens and waits in the expert-group all_reduce for rank 2. Submitted with
sbatch/srun, so the ranks come from SLURM_PROCID."

Culprits: none named from stacks. Rank 3 waits in a collective on a group its caller passed;
such a collective completes once every member has entered it, so a fellow member skipped it
(rank 2, in the WORLD all_reduce with ranks 0-1). The skipper is the one to blame, not rank
3 (issue 25: who waits for whom follows group membership), and stacks do not say which
ranks rank 3's group holds: hangdoc says so, at low confidence, and names no one.
"""

import datetime
import os

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

EXPERT_GROUPS = ([0, 1], [2, 3])


class TinyMoE(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.router = nn.Linear(dim, 2)
        self.experts = nn.ModuleList([nn.Linear(dim, dim) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        choice = self.router(x).argmax(dim=-1)
        out = torch.zeros_like(x)
        for idx, expert in enumerate(self.experts):
            mask = choice == idx
            out[mask] = expert(x[mask])
        return out + x, torch.bincount(choice, minlength=2)


def local_batch(rank: int, step: int) -> torch.Tensor:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * step + rank))
    if rank == 2:
        x[:, :] = -x.abs()  # this shard's first batch is all one kind of token
    return x


def main() -> None:
    rank = int(os.environ["SLURM_PROCID"])
    world = int(os.environ["SLURM_NTASKS"])
    addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(minutes=30))
    groups = [dist.new_group(ranks) for ranks in EXPERT_GROUPS]  # every rank creates both
    my_group = groups[0] if rank in EXPERT_GROUPS[0] else groups[1]

    torch.manual_seed(0)
    model = TinyMoE()
    with torch.no_grad():
        model.router.weight.zero_()
        model.router.weight[1, 0] = 1.0  # expert 1 gets tokens whose feature 0 is positive
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for step in range(500):
        out, counts = model(local_batch(rank, step))
        loss = out.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        tokens_routed = counts[1].float()
        if rank in EXPERT_GROUPS[1] and tokens_routed > 0:
            mark_ready(rank)
            dist.all_reduce(tokens_routed, group=my_group)
        mark_ready(rank)
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()


if __name__ == "__main__":
    main()
