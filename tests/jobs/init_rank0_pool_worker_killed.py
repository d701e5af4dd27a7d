# hangdoc-expect: verdict=init_deadlock culprits=0
# hangdoc-launch: mode=torchrun nproc=3
"""Rank 0 tokenizes the corpus before joining; a pool worker dies and pool.map never returns.

"Rank 0 builds the token cache with a multiprocessing.Pool before init_process_group, and
the other ranks wait for it inside init_process_group (they block until rank 0 joins).
One document made a pool worker die -- in production it was the OOM killer, here a
SIGKILL stands in for it. multiprocessing.Pool replaces the dead worker but the task it
held is lost, so pool.map waits forever. All three processes were alive: ranks 1 and 2
in init_process_group, rank 0 in pool.map."
"""

import datetime
import os
import signal
import tempfile
from multiprocessing import Pool
from pathlib import Path

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

CACHE = Path(tempfile.gettempdir()) / "token-cache-demo.pt"


def tokenize(doc: str) -> list[int]:
    if len(doc) > 400:
        os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer, on the one huge document
    return [hash(word) % 1000 for word in doc.split()]


def corpus() -> list[str]:
    docs = [" ".join(f"w{(i * j) % 97}" for j in range(20)) for i in range(64)]
    docs[37] = "lorem " * 100
    return docs


def build_token_cache() -> None:
    with Pool(processes=2) as pool:
        tokens = pool.map(tokenize, corpus(), chunksize=4)
    torch.save(tokens, CACHE)


def main() -> None:
    rank = int(os.environ["RANK"])
    mark_ready(rank)
    if rank == 0:
        build_token_cache()
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    tokens = torch.load(CACHE)
    model = nn.EmbeddingBag(1000, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for doc in tokens * 10:
        loss = model(torch.tensor([doc])).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()


if __name__ == "__main__":
    main()
