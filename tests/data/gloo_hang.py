# hangdoc-expect: verdict=collective_mismatch culprits=none
# hangdoc-launch: mode=direct nproc=2
"""A gloo job for discovery/capture tests: every launch mode, children that are not ranks.

After one warm-up all_reduce, rank 0 blocks in ``all_reduce`` and every other rank in
``barrier`` (gloo pairs neither, so all block until the 1 h timeout). Before blocking, rank
0 starts a persistent DataLoader worker (a fork child with rank 0's environment) and the
last rank starts a plain Python subprocess (a compile-worker-like child), so that tests can
check those are not counted as ranks. Tests launch it through ``tests/harness.py`` with the
mode they need (the header above is only a default).

The rank comes from RANK (direct, torchrun), SLURM_PROCID (fake_srun), or the spawn index
(``HANGDOC_TEST_NPROC`` set: ``torch.multiprocessing.spawn``).
"""

import datetime
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs"))

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch.utils.data import DataLoader, TensorDataset

CHILDREN = os.environ.get("GLOO_HANG_CHILDREN", "1") == "1"


def start_children(rank: int, world_size: int) -> list:
    keep = []
    if rank == 0:
        loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8, num_workers=1,
                            persistent_workers=True)
        batches = iter(loader)
        next(batches)
        keep.append(batches)
    if rank == world_size - 1:
        keep.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]))
    return keep


def run(rank: int, world_size: int) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(hours=1))
    tensor = torch.ones(1024)
    dist.all_reduce(tensor)
    keep = start_children(rank, world_size) if CHILDREN else []
    mark_ready(rank)
    if rank == 0:
        dist.all_reduce(tensor)
    else:
        dist.barrier()
    print(f"rank {rank}: unexpectedly completed", flush=True)
    time.sleep(3600)
    del keep


def spawned(index: int, world_size: int) -> None:
    run(index, world_size)


def main() -> None:
    if "HANGDOC_TEST_NPROC" in os.environ:
        import torch.multiprocessing as mp

        nproc = int(os.environ["HANGDOC_TEST_NPROC"])
        mp.spawn(spawned, args=(nproc,), nprocs=nproc)
        return
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "-1")))
    world_size = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "0")))
    run(rank, world_size)


if __name__ == "__main__":
    main()
