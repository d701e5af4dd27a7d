# hangdoc-expect: verdict=collective_mismatch culprits=none
# hangdoc-launch: mode=torchrun nproc=4
"""One in-house collective wrapper, called from two different lines: a mismatch hidden
behind a single call site.

"All our collectives go through `reduce_mean()` in the training script, which averages a
tensor over a group. Every step the loss is averaged over the whole world; ranks 2 and 3
also share a data-parallel replica whose router statistics are averaged over their pair.
Rank 3's batch was flagged as skipped, so it went straight to the router statistics while
ranks 0-2 were averaging the loss. Rank 2 waits for rank 3 in the world all_reduce, rank 3
for rank 2 in the pair's. py-spy shows every rank inside `reduce_mean` at the same line."

Culprits: none named from stacks. They show rank 3 in its pair's all_reduce and ranks 0-2 in
the world's: the same shape as `mismatch_expert_subgroup_stats`, where the rank in the pair's
op is the victim (its fellow member skipped the pair's op). Here rank 3 skipped the world's
op instead; only the order each rank issued its ops (the flight recorder's sequence numbers)
tells the two apart, so hangdoc names no one, at low confidence, and says what would.
"""

import datetime
import os

import torch
import torch.distributed as dist
from _ready import mark_ready

PAIR = [2, 3]


def reduce_mean(t: torch.Tensor, group=None) -> torch.Tensor:
    dist.all_reduce(t, group=group)
    return t / dist.get_world_size(group)


def main() -> None:
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    pair = dist.new_group(PAIR)  # every rank creates it
    for step in range(500):
        loss = torch.tensor([float(rank + step)])
        skipped = rank == 3 and step == 1  # a bad batch on rank 3
        if step == 1:
            mark_ready(rank)
        if not skipped:
            loss = reduce_mean(loss)
        if rank in PAIR:
            stats = torch.ones(4) * rank
            stats = reduce_mean(stats, group=pair)


if __name__ == "__main__":
    main()
