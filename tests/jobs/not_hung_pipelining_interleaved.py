# hangdoc-expect: verdict=not_hung culprits=none
# hangdoc-launch: mode=torchrun nproc=2
"""Healthy interleaved pipeline: two ranks, two virtual stages each, ScheduleInterleaved1F1B.

"Our decoder has eight blocks. To shrink the pipeline bubble we cut it into four stages and
place them round-robin on two ranks (rank 0: stages 0 and 2, rank 1: stages 1 and 3), the
'looped' layout of the interleaved 1F1B schedule. Stage 0 holds the embedding, stage 3 the
final norm, the head and the loss. Every step the schedule runs 4 micro-batches through the
loop twice, so activations go 0 -> 1 -> 0 -> 1 and gradients come back the same way, with
batched isend/irecv between every pair of actions. A rank spends most of its time in a
recv's wait for the other one -- and that is fine: the job trains at a few steps per
second. It is here so that hangdoc does not call an interleaved pipeline hung because each
rank is, at any moment, waiting for its neighbour."
"""

import datetime
import os

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

VOCAB, DIM, SEQ = 256, 64, 16
BATCH, MICRO_BATCHES = 16, 4
STAGES_PER_RANK = 2
MAX_STEPS = 20_000
WARMUP_STEPS = 3


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


def stage_module(stage_index: int, num_stages: int) -> nn.Module:
    """Two decoder blocks per stage; the embedding before the first, the head after the last."""
    layers: list[nn.Module] = [nn.Embedding(VOCAB, DIM)] if stage_index == 0 else []
    layers += [Block(), Block()]
    if stage_index == num_stages - 1:
        layers += [nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)]
    return nn.Sequential(*layers)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def main() -> None:
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(rank)
    num_stages = world * STAGES_PER_RANK
    indices = [rank + world * loop for loop in range(STAGES_PER_RANK)]  # looped placement
    modules = [stage_module(i, num_stages) for i in indices]
    stages = [PipelineStage(m, stage_index=i, num_stages=num_stages,
                            device=torch.device("cpu")) for i, m in zip(indices, modules, strict=False)]
    schedule = ScheduleInterleaved1F1B(stages, n_microbatches=MICRO_BATCHES, loss_fn=lm_loss)
    params = [p for m in modules for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=3e-4)
    has_first = any(s.is_first for s in stages)
    has_last = any(s.is_last for s in stages)

    gen = torch.Generator().manual_seed(1234)  # every rank draws the same batches
    for step in range(MAX_STEPS):
        if step == WARMUP_STEPS:
            mark_ready(rank)
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
        opt.zero_grad()
        losses: list[torch.Tensor] = []
        if has_first and has_last:
            schedule.step(tokens[:, :-1], target=tokens[:, 1:], losses=losses)
        elif has_first:
            schedule.step(tokens[:, :-1])
        else:
            schedule.step(target=tokens[:, 1:], losses=losses)
        opt.step()
        if losses and step % 100 == 0:
            print(f"step {step} loss {torch.stack(losses).mean().item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
