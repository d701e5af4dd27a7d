# hangdoc-expect: verdict=straggler culprits=0
# hangdoc-launch: mode=direct nproc=2
# hangdoc-root: cmd=--compact thread=MainThread
"""Rank 0 and its cache compactor took the cache's two file locks in opposite orders.

"Rank 0 keeps the run's feature cache on local disk: every step it appends the
embeddings it computed as a new shard, holding the index lock (so readers see a
consistent index) and, while it writes the shard file, the shard lock. The cache
compactor, a sidecar rank 0 starts, merges small shards when asked: it takes the shard
lock, tells rank 0 which shards it merges (so that rank 0 numbers its next shard past
them), then takes the index lock to rewrite the index. At step 4 rank 0 asked for a
compaction while it held the index lock; the compactor answered holding the shard lock,
rank 0 blocked taking the shard lock, and the compactor blocked taking the index lock:
two ``flock`` locks taken in opposite orders. Rank 1 waits in the gradient all_reduce."
"""

import datetime
import fcntl
import json
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

COMPACT_EVERY = 4  # shards between compactions
HANG_STEP = COMPACT_EVERY
STEPS = 1000


@contextmanager
def flocked(path: str):
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def index_lock(cache: str) -> str:
    return os.path.join(cache, "index.lock")


def shard_lock(cache: str) -> str:
    return os.path.join(cache, "shards.lock")


# ------------------------------------------------------------------ the compactor (sidecar)


def compact_forever(cache: str) -> None:
    """Merge the cache's shards each time rank 0 asks (one line on stdin)."""
    for _request in sys.stdin:
        with flocked(shard_lock(cache)):
            shards = sorted(name for name in os.listdir(cache) if name.endswith(".shard"))
            print(json.dumps({"merging": shards}), flush=True)
            with open(os.path.join(cache, "merged.shard.tmp"), "wb") as out:
                for name in shards:
                    with open(os.path.join(cache, name), "rb") as shard:
                        out.write(shard.read())
            with flocked(index_lock(cache)):
                for name in shards:
                    os.unlink(os.path.join(cache, name))
                os.rename(os.path.join(cache, "merged.shard.tmp"), os.path.join(cache, "merged.shard"))
                with open(os.path.join(cache, "index.json"), "w") as f:
                    json.dump({"shards": ["merged.shard"]}, f)


# ------------------------------------------------------------------ the trainer


class FeatureCache:
    """Rank 0's side of the cache: appends shards, asks the compactor to merge them."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="feature-cache-")
        self.next_shard = 0
        self.compactor = subprocess.Popen([sys.executable, __file__, "--compact", self.dir],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def append(self, step: int, embeddings: torch.Tensor) -> None:
        with flocked(index_lock(self.dir)):
            if self.next_shard and self.next_shard % COMPACT_EVERY == 0:
                self.compactor.stdin.write("compact\n")
                self.compactor.stdin.flush()
                merging = json.loads(self.compactor.stdout.readline())["merging"]
                self.next_shard += len(merging)
            name = f"{self.next_shard:06d}.shard"
            if step == HANG_STEP:
                mark_ready(0)
            with flocked(shard_lock(self.dir)), open(os.path.join(self.dir, name), "wb") as out:
                out.write(embeddings.numpy().tobytes())
            self.next_shard += 1
            with open(os.path.join(self.dir, "index.json"), "w") as f:
                json.dump({"shards": sorted(n for n in os.listdir(self.dir) if n.endswith(".shard"))}, f)


def main() -> None:
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cache = FeatureCache() if rank == 0 else None
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 8))
    head = nn.Linear(8, 2)
    params = [*encoder.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    gen = torch.Generator().manual_seed(rank)

    for step in range(STEPS):
        x = torch.randn(32, 20, generator=gen)
        y = (x[:, 0] > x[:, 1]).long()
        emb = encoder(x)
        if cache is not None:
            cache.append(step, emb.detach())
        elif step == HANG_STEP:
            mark_ready(rank)
        loss = nn.functional.cross_entropy(head(emb), y)
        opt.zero_grad()
        loss.backward()
        for param in params:
            dist.all_reduce(param.grad)
            param.grad /= world_size
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compact"]:
        compact_forever(sys.argv[2])
    else:
        main()
