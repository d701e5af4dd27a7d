# hangdoc-expect: verdict=nccl_timeout culprits=none
# hangdoc-launch: mode=netns nproc=2 cut=1
"""Nightly retrieval eval on two nodes that never finished after a network partition.

"The eval shards the query set over the nodes; every batch each node embeds its queries
and all_gathers the embeddings so recall@k is computed against the global batch. The
storage network and the interconnect share a link; when the link flapped, both nodes
stopped at the same all_gather and stayed there until the scheduler killed the job."
"""

import datetime
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _ready import mark_ready
from torch import nn


class QueryEncoder(nn.Module):
    def __init__(self, vocab: int = 2000, dim: int = 48) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.proj = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.proj(self.embed(tokens)), dim=-1)


def query_batches(rank: int, world_size: int, batch: int = 32, length: int = 12):
    """Deterministic synthetic queries; each rank takes every world_size-th batch."""
    gen = torch.Generator().manual_seed(7)
    index = 0
    while True:
        tokens = torch.randint(0, 2000, (batch, length), generator=gen)
        labels = torch.arange(batch) + index * batch
        if index % world_size == rank:
            yield tokens, labels
        index += 1


@torch.no_grad()
def recall_at_k(local: torch.Tensor, everyone: torch.Tensor, k: int, offset: int) -> float:
    scores = local @ everyone.T
    topk = scores.topk(k, dim=-1).indices
    targets = torch.arange(local.shape[0]) + offset
    return (topk == targets[:, None]).any(dim=-1).float().mean().item()


@torch.no_grad()
def evaluate(model: nn.Module, rank: int, world_size: int, batches: int) -> float:
    hits = 0.0
    for i, (tokens, _) in enumerate(query_batches(rank, world_size)):
        if i == batches:
            break
        local = model(tokens)
        gathered = [torch.empty_like(local) for _ in range(world_size)]
        dist.all_gather(gathered, local)
        everyone = torch.cat(gathered)
        hits += recall_at_k(local, everyone, k=5, offset=rank * local.shape[0])
        if i == 2:
            mark_ready(rank)
        if rank == 0 and i % 100 == 0:
            print(f"eval batch {i} running recall@5 {hits / (i + 1):.3f}", flush=True)
    return hits / batches


def main() -> None:
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    model = QueryEncoder().eval()
    recall = evaluate(model, rank, world_size, batches=200_000)
    if rank == 0:
        print(f"recall@5 = {recall:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
