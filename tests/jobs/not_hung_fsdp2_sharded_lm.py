# hangdoc-expect: verdict=not_hung culprits=none
# hangdoc-launch: mode=torchrun nproc=3 settle=2
"""Healthy FSDP2 (`fully_shard`) run: a sharded character-level LM, steady small steps.

"Each block of the model and the root are wrapped with `fully_shard`, so every forward
all-gathers each block's parameters and every backward all-gathers them again and
reduce-scatters the gradients: dozens of collectives a step, all of them short. Batches
come from a tokenising reader that takes a few tens of milliseconds. Every 20 steps the
loss is averaged over the ranks for the log, on every rank. Healthy: hangdoc must not
call it hung, whichever collective it catches the ranks in."
"""

import datetime
import time

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn
from torch.distributed.fsdp import fully_shard

VOCAB, DIM, CONTEXT = 48, 64, 16
MAX_STEPS = 4_000  # about 15 minutes on two shared cores
WARMUP_STEPS = 3
READ_LATENCY = 0.03  # seconds per batch


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.mlp(self.norm(h))


class CharLM(nn.Module):
    def __init__(self, depth: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(depth))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens).mean(dim=1)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def read_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    time.sleep(READ_LATENCY)  # the tokenising reader
    gen = torch.Generator().manual_seed(step * 17 + rank)
    text = torch.randint(0, VOCAB, (32, CONTEXT + 1), generator=gen)
    return text[:, :-1], text[:, -1]


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(hours=1))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = CharLM()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)

    for step in range(1, MAX_STEPS + 1):
        if step == WARMUP_STEPS + 1:
            mark_ready(rank)
        x, y = read_batch(rank, step)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 20 == 0:
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            if rank == 0:
                print(f"step {step} loss {mean.item() / world:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
