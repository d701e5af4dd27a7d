# hangdoc-expect: verdict=collective_mismatch culprits=1
# hangdoc-launch: mode=direct nproc=3
"""A learning-rate broadcast skipped on one rank, with torch's flight recorder on: every
other step rank 0 broadcasts the learning rate after the gradient all_reduce; at step 2
rank 1 skips it (it read the schedule from a stale config). Its collective numbers drift
by one at once: its step-3 gradient all_reduce is its #5, the others' #5 is the broadcast.
Rank 2 takes the broadcast and goes on to the step-3 all_reduce (#6); rank 0 waits in the
broadcast, rank 1 in the all_reduce. The stacks see ranks 1-2 at the all_reduce line and
rank 0 at the broadcast: they blame rank 0. The flight recorder names rank 1, and that it
issued as #5 what rank 2 issued as #6.

The dumps are served by ``hangdoc.probe.start()`` and written, as in ``fr_empty_bucket.py``,
by a stall watchdog to ``$TORCH_FR_DUMP_TEMP_FILE<rank>`` (gloo writes none itself).
Not in the corpus (``tests/live/test_flight_live.py`` runs it).
"""

import datetime
import os
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # before torch is imported

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist

import hangdoc.probe

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _ready import mark_ready

STALL = 2.0  # seconds in one collective before the watchdog writes the dump
last_progress = time.monotonic()


def dump_on_stall(rank: int) -> None:
    """Write torch's flight recorder dump once, when a collective has taken ``STALL`` seconds."""
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
    if not prefix:
        return
    while time.monotonic() - last_progress < STALL:
        time.sleep(0.2)
    path = Path(f"{prefix}{rank}")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(c10d._dump_fr_trace(True, False, False))
    tmp.replace(path)


hangdoc.probe.start()
dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
rank = dist.get_rank()
threading.Thread(target=dump_on_stall, args=(rank,), daemon=True).start()
grads = torch.ones(1000)
for step in range(6):
    if step == 2:
        mark_ready(rank)
    last_progress = time.monotonic()
    dist.all_reduce(grads)
    if step % 2 == 0 and not (rank == 1 and step == 2):  # rank 1: a stale schedule
        last_progress = time.monotonic()
        dist.broadcast(torch.tensor([0.1 / (step + 1)]), src=0)
