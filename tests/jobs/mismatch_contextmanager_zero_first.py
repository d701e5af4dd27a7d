# hangdoc-expect: verdict=collective_mismatch culprits=0
# hangdoc-launch: mode=torchrun nproc=3
"""A `@contextmanager` whose barrier after `yield` is the normal path, on one rank only.

"We prepare the dataset cache on rank 0 first, like `torch_distributed_zero_first` in many
training repos: the other ranks wait at a barrier before `yield`, rank 0 does the work and
then meets them at a barrier after `yield`. A refactor moved the other ranks' call out of
the `with` block (they read a prebuilt cache), so only rank 0 still enters it. Rank 0 waits
in the barrier after `yield` -- the context manager's normal exit, not cleanup -- while
ranks 1 and 2 have gone on to the gradient all_reduce."
"""

import datetime
import os
from contextlib import contextmanager

import torch
import torch.distributed as dist
from _ready import mark_ready


@contextmanager
def zero_first(rank: int):
    if rank != 0:
        dist.barrier()
    yield
    if rank == 0:
        mark_ready(rank)
        dist.barrier()


def main() -> None:
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    if rank == 0:
        with zero_first(rank):
            cache = torch.arange(16.0)
    else:
        cache = torch.arange(16.0)  # the prebuilt cache
    for _step in range(500):
        grad = cache * 0.5
        if rank != 0:
            mark_ready(rank)
        dist.all_reduce(grad)


if __name__ == "__main__":
    main()
