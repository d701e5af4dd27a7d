# hangdoc-expect: verdict=collective_mismatch culprits=1
# hangdoc-launch: mode=torchrun nproc=4
"""A compiled contrastive loss gathers negatives with a functional collective; rank 1
skips the step on an all-invalid batch and waits in the eager stats all_reduce instead.

"Our CLIP-style trainer compiles the loss with torch.compile (aot_eager backend on the CPU
boxes). Inside the compiled function the text embeddings of every rank are gathered with
torch.distributed._functional_collectives.all_gather_tensor so that each image sees the
whole global batch as negatives; Dynamo traces the gather into the graph
(_c10d_functional.all_gather_into_tensor + wait_tensor). Rows flagged as near-duplicates
are masked out, and when a batch has no valid row left the step is skipped -- 'nothing to
learn from'. At the end of every step all ranks all_reduce [pairs seen, loss sum] eagerly
for the progress bar. At step 5 rank 1's whole batch was one duplicated web page; it
skipped the compiled step and went straight to the stats all_reduce, while ranks 0, 2 and
3 wait inside the compiled graph for rank 1's part of the gather. py-spy shows only an FX
'forward' frame calling an OpOverload on ranks 0, 2 and 3."

Truth: a collective mismatch; rank 1 is the odd one out (eager all_reduce vs the
compiled graph's all_gather_into_tensor/wait_tensor on ranks 0, 2, 3).
"""

import datetime
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from _ready import mark_ready
from torch import nn

EMBED, VOCAB, TOKENS, PIXELS = 32, 1000, 12, 48
BATCH = 16


class TwoTower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Sequential(nn.Linear(PIXELS, 64), nn.GELU(), nn.Linear(64, EMBED))
        self.text = nn.EmbeddingBag(VOCAB, EMBED, mode="mean")
        self.log_temp = nn.Parameter(torch.tensor(2.6))

    def forward(self, pixels: torch.Tensor, tokens: torch.Tensor):
        img = nn.functional.normalize(self.image(pixels), dim=-1)
        txt = nn.functional.normalize(self.text(tokens), dim=-1)
        return img, txt


def global_contrastive_loss(img: torch.Tensor, txt: torch.Tensor, valid: torch.Tensor,
                            log_temp: torch.Tensor, rank: int) -> torch.Tensor:
    """InfoNCE of this rank's images against the text of the whole global batch."""
    all_txt = funcol.all_gather_tensor(txt.detach(), 0, dist.group.WORLD)
    all_txt = torch.cat([all_txt[: rank * BATCH], txt, all_txt[(rank + 1) * BATCH:]])
    logits = img @ all_txt.T * log_temp.exp()
    targets = torch.arange(BATCH) + rank * BATCH
    per_row = nn.functional.cross_entropy(logits, targets, reduction="none")
    return (per_row * valid).sum() / valid.sum().clamp(min=1)


compiled_loss = torch.compile(global_contrastive_loss, backend="aot_eager", fullgraph=True)


def web_batch(rank: int, step: int):
    gen = torch.Generator().manual_seed(7919 * step + rank)
    pixels = torch.randn(BATCH, PIXELS, generator=gen)
    tokens = torch.randint(0, VOCAB, (BATCH, TOKENS), generator=gen)
    if rank == 1 and step == 5:
        pixels[:] = pixels[0]  # every row is the same scraped page
        tokens[:] = tokens[0]
    return pixels, tokens


def dedup_mask(pixels: torch.Tensor) -> torch.Tensor:
    """1.0 for rows that have no exact duplicate in the batch, 0.0 otherwise."""
    same = torch.cdist(pixels, pixels) < 1e-6
    return (same.sum(dim=1) == 1).float()


def main() -> None:
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    model = TwoTower()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(10_000):
        pixels, tokens = web_batch(rank, step)
        valid = dedup_mask(pixels)
        stats = torch.zeros(2)
        if step == 5:
            mark_ready(rank)
        if valid.sum() > 0:
            img, txt = model(pixels, tokens)
            loss = compiled_loss(img, txt, valid, model.log_temp, rank)
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
            opt.step()
            stats += torch.tensor([valid.sum().item(), loss.item() * valid.sum().item()])
        dist.all_reduce(stats)
        if rank == 0:
            print(f"step {step} pairs {int(stats[0])} loss {stats[1] / stats[0]:.4f}",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
