# hangdoc-expect: verdict=collective_mismatch culprits=0,1
# hangdoc-launch: mode=spawn nproc=2
"""Two pipeline stages running different schedules: both end up blocked in dist.send.

"We hand-rolled a 2-stage pipeline with dist.send/dist.recv and 4 micro-batches. The last
stage was switched to a 1F1B schedule (forward, backward, send the gradient back right
away) but stage 0 still ran all forwards first and only then the backwards. Stage 0 sat
in send() of micro-batch 1's activations, stage 1 sat in send() of micro-batch 0's
gradient; gloo's send completes only when the peer posts the matching recv, so neither
ever returned."

Culprits: both ranks. This is a pure 2-rank p2p mismatch with no minority side -- each
stage sends to a peer that is itself sending -- so neither rank is more to blame than
the other from what the stacks show.
"""

import datetime
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _ready import mark_ready
from torch import nn

MICRO_BATCHES = 4
HIDDEN = 24


def stage0(model: nn.Module, batch: torch.Tensor) -> None:
    """All forwards, then all backwards (GPipe order)."""
    acts = []
    for mb in batch.chunk(MICRO_BATCHES):
        out = model(mb)
        acts.append(out)
        mark_ready(0)
        dist.send(out.detach(), dst=1)
    for out in acts:
        grad = torch.empty_like(out)
        dist.recv(grad, src=1)
        out.backward(grad)


def stage1(model: nn.Module, targets: torch.Tensor) -> None:
    """1F1B: every micro-batch's gradient goes back as soon as it exists."""
    for target in targets.chunk(MICRO_BATCHES):
        inp = torch.empty(target.shape[0], HIDDEN)
        dist.recv(inp, src=0)
        inp.requires_grad_()
        loss = nn.functional.mse_loss(model(inp), target)
        loss.backward()
        mark_ready(1)
        dist.send(inp.grad, dst=0)


def worker(rank: int, world_size: int) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(rank)
    if rank == 0:
        model = nn.Sequential(nn.Linear(16, HIDDEN), nn.ReLU())
    else:
        model = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for step in range(1000):
        gen = torch.Generator().manual_seed(step)
        x, y = torch.randn(32, 16, generator=gen), torch.randn(32, 4, generator=gen)
        opt.zero_grad()
        if rank == 0:
            stage0(model, x)
        else:
            stage1(model, y)
        opt.step()


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29513")
    nprocs = int(os.environ.get("HANGDOC_TEST_NPROC", "2"))
    mp.spawn(worker, args=(nprocs,), nprocs=nprocs)
