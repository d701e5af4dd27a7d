# hangdoc-expect: verdict=collective_mismatch culprits=0
# hangdoc-launch: mode=torchrun nproc=3 settle=2
"""FSDP2 (`fully_shard`): rank 0 generates a sample for the log with the sharded model.

"A small character-level language model, each block wrapped with `fully_shard` and the
root too. Every 5 steps we print a generated sample to eyeball progress, and since only
rank 0 prints, only rank 0 generated it: `if rank == 0: print(generate(model, ...))`.
With FSDP every forward all-gathers each block's parameters from all ranks, so rank 0's
greedy decoding issued all-gathers nobody else issued. The first ones paired up with the
other ranks' next training forward; from then on rank 0 was a few collectives behind, and
it ended in an all_gather of its decoding forward while ranks 1 and 2 waited in a
reduce_scatter of the backward of the next step. The same bug is reported again and
again for `model.generate()` on rank 0 only under FSDP."
"""

import datetime

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn
from torch.distributed.fsdp import fully_shard

VOCAB, DIM, CONTEXT = 48, 64, 16
SAMPLE_EVERY = 5


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
        h = self.embed(tokens).mean(dim=1)  # a bag of the context, enough for the story
        for block in self.blocks:
            h = block(h)
        return self.head(h)


@torch.no_grad()
def generate(model: nn.Module, prompt: torch.Tensor, length: int = 12) -> list[int]:
    tokens = prompt.clone()
    out = []
    for _ in range(length):
        nxt = model(tokens[-CONTEXT:].unsqueeze(0)).argmax(dim=-1)
        out.append(int(nxt))
        tokens = torch.cat([tokens, nxt])
    return out


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step * 17 + rank)
    text = torch.randint(0, VOCAB, (32, CONTEXT + 1), generator=gen)
    return text[:, :-1], text[:, -1]


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(hours=1))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = CharLM()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)

    for step in range(1, 1000):
        x, y = batch(rank, step)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % SAMPLE_EVERY == 0:
            mark_ready(rank)
            if rank == 0:
                sample = generate(model, x[0])
                print(f"step {step} loss {loss.item():.3f} sample {sample}", flush=True)


if __name__ == "__main__":
    main()
