# hangdoc-expect: verdict=collective_mismatch culprits=0
# hangdoc-launch: mode=spawn nproc=3 settle=2
"""A launcher that is itself rank 0: the first process starts the other ranks as children
with ``LOCAL_RANK`` 1, 2, ``WORLD_SIZE=3`` and the rendezvous (``MASTER_ADDR``/``MASTER_PORT``)
in their environment but no ``RANK``, then joins them as rank 0; every process passes its
rank to ``init_process_group`` in code. After one all_reduce, rank 0 blocks in
``all_reduce`` and the others in ``barrier`` (gloo pairs neither).

Not in the corpus (``tests/live/test_pid_widen_live.py`` runs it): discovery must find the
parent as rank 0 and the world size from ``WORLD_SIZE``, whichever pid names the job.
"""

import datetime
import os
import subprocess
import sys
import time
from pathlib import Path

WORLD_SIZE = 3


def start_local_ranks() -> list:
    """Local ranks 1.. as children, started before torch is imported here (2 shared cores)."""
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    env["WORLD_SIZE"] = str(WORLD_SIZE)
    return [subprocess.Popen([sys.executable, __file__], env={**env, "LOCAL_RANK": str(local)})
            for local in range(1, WORLD_SIZE)]


def run(rank: int) -> None:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from _ready import mark_ready

    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE,
                            timeout=datetime.timedelta(hours=1))
    tensor = torch.ones(1024)
    dist.all_reduce(tensor)
    mark_ready(rank)
    if rank == 0:
        dist.all_reduce(tensor)
    else:
        dist.barrier()
    print(f"rank {rank}: unexpectedly completed", flush=True)
    time.sleep(3600)


def main() -> None:
    local = os.environ.get("LOCAL_RANK")
    if local is None:  # the launcher: it starts the others, then is rank 0
        children = start_local_ranks()
        run(0)
        for child in children:
            child.wait()
    else:
        run(int(local))


if __name__ == "__main__":
    main()
