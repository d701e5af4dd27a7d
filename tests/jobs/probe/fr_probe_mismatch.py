# hangdoc-expect: verdict=collective_mismatch culprits=0
# hangdoc-launch: mode=torchrun nproc=3
"""A gloo job with torch's flight recorder on (``TORCH_FR_BUFFER_SIZE`` in its environment)
and nothing of hangdoc in it: ``hangdoc run -- torchrun ...`` starts the probe in every
rank. At step 3 rank 0's loss check raises, and in its handler rank 0 broadcasts a lower
learning rate while ranks 1-2 all_reduce their gradients. hangdoc reads the stacks and,
through each rank's probe, its flight recorder (collective #8 of the default group is a
broadcast on rank 0 and an all_reduce on ranks 1-2) and rank 0's live exception.
Not in the corpus (tests/live/test_probe_live.py runs it).
"""

import datetime
import math
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _ready import mark_ready


class LossDiverged(FloatingPointError):
    pass


def check(loss: float) -> None:
    if not math.isfinite(loss):
        raise LossDiverged("loss is not finite")


dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
rank = dist.get_rank()
grads = torch.ones(1000)
for step in range(5):
    dist.all_reduce(grads)
    if step == 3:
        mark_ready(rank)
        if rank == 0:
            try:
                check(float("nan"))
            except LossDiverged:
                dist.broadcast(torch.tensor([0.005]), src=0)  # lower the learning rate everywhere
        else:
            dist.all_reduce(grads)
    dist.all_reduce(torch.tensor([float(step)]))
