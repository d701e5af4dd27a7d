# hangdoc-expect: verdict=straggler culprits=0
# hangdoc-launch: mode=direct nproc=3
"""Training froze at the first checkpoint; rank 0 deadlocked on its own prefetcher's lock.

"Our prefetcher thread keeps a few batches ready in a bounded queue and guards its cursor
with a lock so we can checkpoint the data position. The thread holds that lock while it
puts into the queue, and the queue is full by the time we save. Rank 0 (the only rank
that writes checkpoints) called loader.state_dict() and waited for the lock forever; the
other ranks waited in the next step's all_reduce."
"""

import datetime
import io
import os
import queue
import threading

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

CHECKPOINT_EVERY = 5


class PrefetchingLoader:
    """Background thread that loads batches ahead of the training loop."""

    def __init__(self, rank: int, batch_size: int = 32, depth: int = 4) -> None:
        self._gen = torch.Generator().manual_seed(rank)
        self._batch_size = batch_size
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._lock = threading.Lock()
        self._cursor = 0
        self._thread = threading.Thread(target=self._produce, name="prefetch", daemon=True)
        self._thread.start()

    def _load(self) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(self._batch_size, 20, generator=self._gen)
        y = (x[:, :5].sum(dim=1) > 0).long()
        return x, y

    def _produce(self) -> None:
        while True:
            with self._lock:
                batch = self._load()
                self._cursor += 1
                self._queue.put(batch)  # blocks while the queue is full, lock still held

    def __iter__(self) -> "PrefetchingLoader":
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._queue.get()

    def state_dict(self) -> dict:
        with self._lock:
            return {"cursor": self._cursor - self._queue.qsize()}


def save_checkpoint(step: int, model: nn.Module, opt: torch.optim.Optimizer,
                    loader: PrefetchingLoader) -> int:
    state = {"step": step, "model": model.state_dict(), "optim": opt.state_dict(),
             "data": loader.state_dict()}
    buffer = io.BytesIO()  # uploaded to object storage in the real job
    torch.save(state, buffer)
    return buffer.tell()


def main() -> None:
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = PrefetchingLoader(rank)

    for step, (x, y) in enumerate(loader, start=1):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad.div_(world_size)
        opt.step()
        if step % CHECKPOINT_EVERY == 0:
            mark_ready(rank)
            if rank == 0:
                size = save_checkpoint(step, model, opt, loader)
                print(f"step {step}: checkpoint {size} bytes, loss {loss.item():.3f}",
                      flush=True)


if __name__ == "__main__":
    main()
