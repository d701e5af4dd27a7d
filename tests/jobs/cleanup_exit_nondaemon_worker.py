# hangdoc-expect: verdict=cleanup_deadlock culprits=1
# hangdoc-launch: mode=direct nproc=3
"""Rank 1 crashes on a bad label; its metrics-uploader thread keeps the dying interpreter
alive, so ranks 0 and 2 wait in the gradient all_reduce forever.

"Every rank streams its step metrics to our experiment tracker through a
ThreadPoolExecutor(max_workers=1) running an uploader loop: it takes rows from a
queue.Queue and POSTs them in batches, and stops when it gets the None sentinel that
Trainer.close() puts at the end of training. Our cluster launcher starts one python
process per rank with RANK/WORLD_SIZE set. Rank 1's shard had a sample labelled 7 in a
5-class dataset; cross_entropy raised 'Target 7 is out of bounds' at step 2. The
traceback was printed, but the process never exited: the exception skipped close(), so
the sentinel never came, and at interpreter shutdown threading._shutdown() ran
concurrent.futures' exit hook, which join()s the executor's (non-daemon) worker -- which
sits in queue.get() for good. Ranks 0 and 2 had already finished their backward and wait
in step 2's all_reduce for rank 1, whose process group is still alive."

Truth: a cleanup deadlock -- rank 1 has left the training loop with an uncaught exception
and is stuck in interpreter shutdown joining a non-daemon thread; ranks 0 and 2 wait for
it in an ordinary collective.
"""

import datetime
import os
import queue
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

CLASSES = 5


class MetricsUploader:
    """Batches metric rows and ships them from a single background worker."""

    def __init__(self, run_name: str, flush_every: int = 16) -> None:
        self.run_name = run_name
        self.flush_every = flush_every
        self.rows: queue.Queue[dict | None] = queue.Queue()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metrics-upload")
        self.done = self.pool.submit(self._upload_loop)
        self.sent = 0

    def log(self, **row: float) -> None:
        self.rows.put(row)

    def _upload_loop(self) -> None:
        pending: list[dict] = []
        while True:
            row = self.rows.get()
            if row is None:
                break
            pending.append(row)
            if len(pending) >= self.flush_every:
                self._post(pending)
                pending = []
        self._post(pending)

    def _post(self, rows: list[dict]) -> None:
        self.sent += len(rows)  # an HTTP POST to the tracker in the real job

    def close(self) -> None:
        self.rows.put(None)
        self.done.result()
        self.pool.shutdown()


def shard_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(32, 20, generator=gen)
    y = torch.randint(0, CLASSES, (32,), generator=gen)
    if rank == 1 and step == 2:
        y[11] = 7  # a mislabelled row that slipped through the export
    return x, y


def main() -> None:
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=30))
    uploader = MetricsUploader(f"classifier-rank{rank}")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(5000):
        x, y = shard_batch(rank, step)
        if step == 2:
            mark_ready(rank)  # rank 1: the call below raises; the others block further on
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        uploader.log(step=step, loss=loss.item())
    uploader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
