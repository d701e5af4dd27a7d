# hangdoc-expect: verdict=not_hung culprits=none
# hangdoc-launch: mode=torchrun nproc=2
"""Healthy two-stage torch.distributed.pipelining job on the 1F1B schedule.

"We split a small language-model-like MLP stack in two with PipelineStage and drive it
with Schedule1F1B and 4 micro-batches: rank 0 holds the embedding and the first blocks,
rank 1 the last blocks, the head and the loss. Each step the schedule sends activations
forward and gradients back with batched isend/irecv, and between p2p ops a rank is almost
always waiting for its neighbour. Nothing is wrong with it -- it is here so that hangdoc
does not call a pipeline that is busy in its p2p waits hung."
"""

import datetime
import os

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

VOCAB, DIM, SEQ = 256, 64, 16
BATCH, MICRO_BATCHES = 16, 4
MAX_STEPS = 20_000
WARMUP_STEPS = 3


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class FirstHalf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(Block(DIM), Block(DIM))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.embed(tokens))


class SecondHalf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(Block(DIM), Block(DIM))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(hidden))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def main() -> None:
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(rank)
    module = FirstHalf() if rank == 0 else SecondHalf()
    stage = PipelineStage(module, stage_index=rank, num_stages=world,
                          device=torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=MICRO_BATCHES, loss_fn=lm_loss)
    opt = torch.optim.AdamW(module.parameters(), lr=3e-4)

    gen = torch.Generator().manual_seed(1234)  # both stages draw the same batches
    for step in range(MAX_STEPS):
        if step == WARMUP_STEPS:
            mark_ready(rank)
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
        opt.zero_grad()
        if stage.is_first:
            schedule.step(tokens[:, :-1])
        else:
            losses: list[torch.Tensor] = []
            schedule.step(target=tokens[:, 1:], losses=losses)
            if step % 200 == 0:
                print(f"step {step} loss {torch.stack(losses).mean().item():.3f}", flush=True)
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
