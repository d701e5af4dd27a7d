# hangdoc-expect: verdict=straggler culprits=0
# hangdoc-launch: mode=direct nproc=3
"""Curriculum training froze at its first checkpoint; rank 0's two threads took two locks
in opposite orders.

"The loader's prefetch thread keeps a few batches ready. It holds its cursor lock while it
loads a batch and queues it, and then asks the curriculum for the difficulty of the next
one, so that the data position and the difficulty always match. The curriculum hands out
batches under its own lock so that a batch and the difficulty it was drawn at stay
together, and at checkpoint steps rank 0 also records the loader's position there, under
that same lock. So the trainer takes curriculum -> cursor and the prefetcher cursor ->
curriculum. At step 5 rank 0 sat in loader.state_dict() forever, its prefetcher in
curriculum.level(); the other ranks waited in the step's gradient all_reduce."
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


class Curriculum:
    """The difficulty schedule: harder examples as training goes on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._level = 0
        self._step = 0
        self.saved: dict = {}

    def level(self) -> int:
        with self._lock:
            return self._level

    def next_batch(self, loader: "PrefetchingLoader", rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        with self._lock:
            batch = next(loader)
            self._step += 1
            self._level = self._step // 10
            if rank == 0 and self._step % CHECKPOINT_EVERY == 0:
                mark_ready(rank)
                self.saved = {"step": self._step, "level": self._level,
                              "data": loader.state_dict()}
            return batch


class PrefetchingLoader:
    """Background thread that loads batches ahead of the training loop."""

    def __init__(self, rank: int, curriculum: Curriculum, batch_size: int = 32, depth: int = 4) -> None:
        self._gen = torch.Generator().manual_seed(rank)
        self._batch_size = batch_size
        self._curriculum = curriculum
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._cursor_lock = threading.Lock()
        self._cursor = 0
        self._difficulty = 0
        self._thread = threading.Thread(target=self._produce, name="prefetch", daemon=True)
        self._thread.start()

    def _load(self) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(self._batch_size, 20, generator=self._gen) * (1 + self._difficulty)
        y = (x[:, :5].sum(dim=1) > 0).long()
        return x, y

    def _produce(self) -> None:
        while True:
            with self._cursor_lock:
                batch = self._load()
                self._cursor += 1
                self._queue.put(batch)  # waits while the queue is full
                self._difficulty = self._curriculum.level()

    def __iter__(self) -> "PrefetchingLoader":
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._queue.get()

    def state_dict(self) -> dict:
        with self._cursor_lock:
            return {"cursor": self._cursor - self._queue.qsize()}


def main() -> None:
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    curriculum = Curriculum()
    loader = PrefetchingLoader(rank, curriculum)

    for step in range(1, 1_000_000):
        x, y = curriculum.next_batch(loader, rank)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        if step % CHECKPOINT_EVERY == 0 and rank != 0:
            mark_ready(rank)
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad.div_(world_size)
        opt.step()
        if rank == 0 and step % CHECKPOINT_EVERY == 0:
            buffer = io.BytesIO()  # uploaded to object storage in the real job
            torch.save({"model": model.state_dict(), "curriculum": curriculum.saved}, buffer)


if __name__ == "__main__":
    main()
