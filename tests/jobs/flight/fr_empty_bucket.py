# hangdoc-expect: verdict=collective_mismatch culprits=2
# hangdoc-launch: mode=direct nproc=3
"""Gradient buckets all_reduced in one loop, with torch's flight recorder on: at step 2
rank 2's bucket of an expert that got no tokens is an empty tensor (``torch.empty(0)``
where ``zeros_like`` was meant). gloo sends nothing for it, so rank 2's side of collective
#8 returns at once and rank 2 waits in the next bucket (#9) while ranks 0-1 wait for its
data in #8 -- all three at the same line, so the stacks read a transport hang. The flight
recorder shows #8 as all_reduce Float[5] on ranks 0-1 and Float[0] on rank 2.

The job serves its dumps two ways: ``hangdoc.probe.start()`` (``hangdoc diagnose`` asks
it), and files: gloo in torch 2.13 writes no dump of its own (no dump on timeout, no
``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``), so a stall watchdog thread writes torch's own pickle
(``_dump_fr_trace``) to ``$TORCH_FR_DUMP_TEMP_FILE<rank>`` once a bucket has taken 2 s.
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

SIZES = (7, 5, 3)  # the buckets' lengths
STALL = 2.0  # seconds in one bucket before the watchdog writes the dump
last_progress = time.monotonic()


def dump_on_stall(rank: int) -> None:
    """Write torch's flight recorder dump once, when a bucket has taken ``STALL`` seconds."""
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
for step in range(3):
    buckets = [torch.empty(0) if (rank == 2 and step == 2 and i == 1) else torch.ones(n)
               for i, n in enumerate(SIZES)]
    if step == 2:
        mark_ready(rank)
    for bucket in buckets:
        last_progress = time.monotonic()
        dist.all_reduce(bucket)
