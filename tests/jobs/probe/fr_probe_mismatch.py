# hangdoc-expect: verdict=collective_mismatch culprits=0
# hangdoc-launch: mode=torchrun nproc=3
"""A gloo job run with torch's flight recorder on and hangdoc's in-process probe started
(``hangdoc.probe.start()``, one line): at step 3 rank 0 broadcasts a new learning rate while
ranks 1-2 all_reduce their gradients. hangdoc reads the stacks and, through the probe, each
rank's flight recorder: collective #8 of the default group is a broadcast on rank 0 and an
all_reduce on ranks 1-2. Not in the corpus (tests/live/test_probe_live.py runs it).
"""

import datetime
import os
import sys
from pathlib import Path

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # before torch is imported

import torch
import torch.distributed as dist

import hangdoc.probe

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _ready import mark_ready

hangdoc.probe.start()
dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
rank = dist.get_rank()
grads = torch.ones(1000)
for step in range(5):
    dist.all_reduce(grads)
    if step == 3:
        mark_ready(rank)
        if rank == 0:
            dist.broadcast(torch.tensor([0.005]), src=0)
        else:
            dist.all_reduce(grads)
    dist.all_reduce(torch.tensor([float(step)]))
