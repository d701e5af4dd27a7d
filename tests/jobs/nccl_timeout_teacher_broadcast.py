# hangdoc-expect: verdict=nccl_timeout culprits=none
# hangdoc-launch: mode=netns nproc=4 cut=1
"""Online distillation on four nodes stuck in the teacher-weight broadcast.

"Node 0 owns the EMA teacher and broadcasts its weights (about 9 MB) to the other
nodes every step; each node distils its student from the teacher on its own data. A
network maintenance window started early: all four workers were left inside the same
broadcast, the teacher's sends stuck in full socket buffers and the students waiting
for bytes that never came."
"""

import copy
import datetime
import os

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

WARMUP_STEPS = 3


def make_net() -> nn.Module:
    return nn.Sequential(nn.Linear(128, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


@torch.no_grad()
def update_teacher(teacher: nn.Module, student: nn.Module, decay: float = 0.99) -> None:
    for t, s in zip(teacher.parameters(), student.parameters(), strict=False):
        t.mul_(decay).add_(s, alpha=1 - decay)


def broadcast_teacher(teacher: nn.Module, flat: torch.Tensor, owner: int) -> None:
    """Ship the teacher as one flat buffer: one message instead of one per tensor."""
    params = list(teacher.parameters())
    if dist.get_rank() == owner:
        torch.cat([p.detach().reshape(-1) for p in params], out=flat)
    dist.broadcast(flat, src=owner)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def main() -> None:
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    student = make_net()
    teacher = copy.deepcopy(student).requires_grad_(False)
    opt = torch.optim.SGD(student.parameters(), lr=0.01, momentum=0.9)
    flat = torch.empty(sum(p.numel() for p in teacher.parameters()))
    gen = torch.Generator().manual_seed(rank)

    for step in range(100_000):
        if step == WARMUP_STEPS:
            mark_ready(rank)
        broadcast_teacher(teacher, flat, owner=0)
        x = torch.randn(32, 128, generator=gen)
        with torch.no_grad():
            soft_targets = teacher(x).softmax(-1)
        loss = nn.functional.cross_entropy(student(x), soft_targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            update_teacher(teacher, student)
            if step % 20 == 0:
                print(f"step {step} distillation loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
