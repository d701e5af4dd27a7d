# hangdoc-expect: verdict=straggler culprits=0
# hangdoc-launch: mode=spawn nproc=3
"""A torch.distributed.breakpoint() left behind a loss-spike check: rank 0 sits in pdb,
reading a stdin that never sends anything, while ranks 1 and 2 wait in the barrier that
breakpoint() issues after the debugger.

"Last month we chased loss spikes with `if loss > SPIKE: dist.breakpoint()` -- pdb on rank
0 only, the other ranks wait at a barrier until you `continue` -- and the check stayed in.
Our launcher starts each node with `ssh node 'python train.py'` (no -t). Without a tty,
the remote stdin is a pipe from sshd that stays open as long as the session and never
carries a byte: nobody sees pdb's prompt and nobody can answer it. At step 12 a corrupted
sample on rank 2's shard (raw uint16 pixel values instead of [0, 1], from a bad decode)
blew the averaged loss up; every rank saw the spike in the all_reduced loss and called
dist.breakpoint(). Rank 0 printed '!!! ATTENTION !!!' into a log nobody was watching and
has been in pdb's cmdloop ever since; ranks 1 and 2 wait in dist.barrier() inside
breakpoint()."

Truth: a straggler. Rank 0 is outside torch.distributed -- in pdb, blocked reading stdin
(its frames: worker -> torch.distributed.breakpoint -> bdb trace_dispatch -> pdb
interaction -> cmd.cmdloop, reading the pipe; it has not reached breakpoint()'s barrier
yet). Ranks 1 and 2 wait for it in that barrier. Rank 2's bad sample only triggered the
check; it is not what the others wait for.
"""

import datetime
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _ready import mark_ready
from torch import nn

SPIKE = 50.0
PIXELS, CLASSES = 3 * 8 * 8, 10


def shard_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.rand(32, PIXELS, generator=gen)
    y = torch.randint(0, CLASSES, (32,), generator=gen)
    if rank == 2 and step == 12:
        x[5] *= 65535  # a frame decoded with the wrong scale: raw uint16, not [0, 1]
    return x, y


def worker(rank: int, world_size: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(PIXELS, 128), nn.ReLU(), nn.Linear(128, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10_000):
        x, y = shard_batch(rank, step)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean_loss /= world_size
        if mean_loss > SPIKE:  # debugging aid from the loss-spike hunt, never removed
            mark_ready(rank)
            dist.breakpoint(rank=0)
        opt.step()
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {mean_loss.item():.4f}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    # Started as `ssh node 'python train.py'` without a tty: stdin is a pipe from sshd that
    # stays open for the whole session and never carries a byte. Stand in for sshd here;
    # mp.spawn's workers inherit fd 0, and dist.breakpoint()'s pdb reads /dev/stdin.
    never_read, sshd_side = os.pipe()
    os.dup2(never_read, 0)
    nprocs = int(os.environ.get("HANGDOC_TEST_NPROC", "3"))
    mp.spawn(worker, args=(nprocs,), nprocs=nprocs)
