# hangdoc-expect: verdict=not_hung culprits=none
# hangdoc-launch: mode=netns nproc=2
"""Healthy two-node run where rank 0 spends seconds writing a gzipped checkpoint.

"Every four steps rank 0 saves model and optimizer state through gzip (our bucket
quota is small) and everyone meets at a barrier afterwards so nobody runs ahead of a
checkpoint that might fail. Each save takes a few seconds during which rank 1 sits in
the barrier. Looks stuck if you dump stacks at the wrong moment; it is not."
"""

import datetime
import gzip
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

SAVE_EVERY = 4
MAX_STEPS = 800  # about 15 minutes, most of it spent checkpointing
WARMUP_STEPS = 2
CHECKPOINT_DIR = Path(os.environ.get(
    "CHECKPOINT_DIR", Path(tempfile.gettempdir()) / "hangdoc-corpus" / "checkpoint_barrier"))


def build_model(width: int = 1536, depth: int = 4) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(64, width)]
    for _ in range(depth):
        layers += [nn.LayerNorm(width), nn.Linear(width, width), nn.SiLU()]
    layers.append(nn.Linear(width, 64))
    return nn.Sequential(*layers)


def save_checkpoint(step: int, model: nn.Module, opt: torch.optim.Optimizer) -> float:
    """Write step-N.pt.gz atomically and keep only the newest checkpoint."""
    started = time.monotonic()
    CHECKPOINT_DIR.mkdir(parents=True, exist_ok=True)
    final = CHECKPOINT_DIR / f"step-{step:06d}.pt.gz"
    partial = final.with_suffix(".partial")
    with gzip.open(partial, "wb", compresslevel=6) as out:
        torch.save({"step": step, "model": model.state_dict(), "optim": opt.state_dict()}, out)
    os.replace(partial, final)
    for old in CHECKPOINT_DIR.iterdir():
        if old != final:
            old.unlink(missing_ok=True)
    return time.monotonic() - started


def main() -> None:
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    model = build_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(rank)

    for step in range(1, MAX_STEPS + 1):
        if step == WARMUP_STEPS + 1:
            mark_ready(rank)
        x = torch.randn(64, 64, generator=gen)
        loss = nn.functional.mse_loss(model(x), x.flip(-1))
        opt.zero_grad()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= world_size
        opt.step()
        if step % SAVE_EVERY == 0:
            if rank == 0:
                seconds = save_checkpoint(step, model, opt)
                print(f"step {step} loss {loss.item():.4f} checkpoint {seconds:.1f}s",
                      flush=True)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
