# hangdoc-expect: verdict=cleanup_deadlock culprits=2
# hangdoc-launch: mode=direct nproc=4
"""A shape error on one rank, and the "always save a checkpoint" finally block hangs.

"Our loop is wrapped in try/finally so that a crash still leaves a resumable checkpoint.
The checkpoint gathers every rank's RNG state and data position with all_gather_object so
rank 0 can write one file. One node got a feature file from the new preprocessing (20
columns instead of 16), so rank 2 died in its first forward with a shape error -- and went
straight into save_checkpoint's all_gather_object. The other three ranks were in the
first gradient all_reduce and waited for rank 2 forever. We never saw the traceback,
because it is only printed after the finally block returns."
"""

import datetime
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

CKPT_DIR = Path(tempfile.gettempdir()) / "ckpt-finally-demo"


def load_features(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    columns = 20 if rank == 2 else 16  # rank 2's node has the re-preprocessed files
    gen = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(256, columns, generator=gen)
    y = (x[:, :4].sum(dim=1) > 0).long()
    return x, y


def average_gradients(model: nn.Module, world_size: int) -> None:
    for p in model.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad.div_(world_size)


def save_checkpoint(model: nn.Module, opt: torch.optim.Optimizer, step: int, rank: int) -> None:
    local = {"rank": rank, "step": step, "rng": torch.get_rng_state().tolist()[:8]}
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, local)
    if rank == 0:
        CKPT_DIR.mkdir(exist_ok=True)
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "ranks": everyone},
                   CKPT_DIR / f"step{step}.pt")


def train(model: nn.Module, opt: torch.optim.Optimizer, rank: int, world: int) -> int:
    x, y = load_features(rank)
    step = 0
    for epoch in range(100):
        for i in range(0, len(x), 32):
            logits = model(x[i:i + 32])
            loss = nn.functional.cross_entropy(logits, y[i:i + 32])
            opt.zero_grad()
            loss.backward()
            mark_ready(rank)
            average_gradients(model, world)
            opt.step()
            step += 1
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.3f}", flush=True)
    return step


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = 0
    try:
        step = train(model, opt, rank, world)
    finally:
        mark_ready(rank)
        save_checkpoint(model, opt, step, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
