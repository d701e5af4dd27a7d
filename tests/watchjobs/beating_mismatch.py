"""A gloo job that marks its steps with ``hangdoc.step()`` and then hangs in a collective
mismatch: the last rank goes to a barrier at step 5 while the others all-reduce. For the
multi-node watch test (heartbeats read through the agents)."""

import datetime
import os
from pathlib import Path

import torch
import torch.distributed as dist

import hangdoc


def mark_ready(rank: int) -> None:
    ready = os.environ.get("HANGDOC_READY_DIR")
    if ready:
        tmp = Path(ready, f".ready.{rank}.{os.getpid()}")
        tmp.write_text(str(os.getpid()))
        tmp.rename(Path(ready, f"ready.{rank}"))


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    grad = torch.ones(1000)
    for step in range(100):
        with hangdoc.step(step):
            if step == 5:
                mark_ready(rank)
                if rank == world - 1:
                    dist.barrier()  # thinks training is over
            dist.all_reduce(grad)


if __name__ == "__main__":
    main()
