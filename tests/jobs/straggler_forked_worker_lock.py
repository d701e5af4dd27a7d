# hangdoc-expect: verdict=straggler culprits=1
# hangdoc-launch: mode=direct nproc=3
"""Rank 1 never produced a batch: its DataLoader workers were forked holding a lock.

"Rank 1 also runs the metrics pusher, a background thread that holds the stats lock
while it pushes to the gateway (about a second per push). DataLoader forks its workers
when the epoch starts; a worker forked while the pusher held the lock inherits it
locked, with no thread left to release it, and blocks the first time the dataset counts
a sample. Rank 1's main process waits for batches that never come; ranks 0 and 2 wait
in the gradient all_reduce."
"""

import datetime
import os
import threading
import time

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SampleStats:
    """Counters shared by the training loop and the metrics pusher."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.samples = 0

    def count(self, n: int = 1) -> None:
        with self.lock:
            self.samples += n

    def push_forever(self, seconds_per_push: float = 1.0) -> None:
        while True:
            with self.lock:
                snapshot = self.samples
                time.sleep(seconds_per_push)  # HTTP push to the metrics gateway
            del snapshot


STATS = SampleStats()
METRICS_RANK = 1


class Tabular(Dataset):
    def __init__(self, rank: int, rows: int = 512) -> None:
        gen = torch.Generator().manual_seed(rank)
        self.x = torch.randn(rows, 10, generator=gen)
        self.y = (self.x.sum(dim=1) > 0).float()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        STATS.count()
        return self.x[index], self.y[index]


def main() -> None:
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank == METRICS_RANK:
        threading.Thread(target=STATS.push_forever, name="metrics-push", daemon=True).start()
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Tabular(rank), batch_size=32, shuffle=True, num_workers=2)

    mark_ready(rank)
    for epoch in range(100):
        for x, y in loader:
            loss = nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(-1), y)
            opt.zero_grad()
            loss.backward()
            for param in model.parameters():
                dist.all_reduce(param.grad)
                param.grad /= world_size
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
