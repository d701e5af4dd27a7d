# hangdoc-expect: verdict=cleanup_deadlock culprits=1
# hangdoc-launch: mode=torchrun nproc=3
"""A corrupt record on one rank turns into a hang instead of a crash.

"We wrap training in a `with Trainer(cfg) as trainer:` block so every rank always flushes
its logs and meets the others at a barrier before tearing the process group down. Rank 1
hit a corrupt record in the first batch of its shard (ValueError in the dataset), left the
`with` block, and sat in the barrier of `Trainer.__exit__` forever. Ranks 0 and 2 never saw
an error: they were waiting in the gradient all_reduce of the first step. torchrun never
noticed either, because no process exited."
"""

import datetime
import json
import tempfile
from pathlib import Path
from typing import Self

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn
from torch.utils.data import DataLoader, Dataset


class ShardDataset(Dataset):
    """A synthetic regression shard; rank 1's shard has a corrupt record in its first batch."""

    def __init__(self, rank: int, size: int = 64) -> None:
        gen = torch.Generator().manual_seed(rank)
        self.x = torch.randn(size, 16, generator=gen)
        self.y = self.x.sum(dim=1, keepdim=True)
        self.corrupt = {3} if rank == 1 else set()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        if idx in self.corrupt:
            raise ValueError(f"record {idx}: truncated feature vector (got 11 of 16 floats)")
        return self.x[idx], self.y[idx]


class Trainer:
    """Owns the process group and the metric log; cleans both up on exit."""

    def __init__(self, lr: float = 1e-2) -> None:
        self.lr = lr
        self.log_dir = Path(tempfile.gettempdir())

    def __enter__(self) -> Self:
        dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=self.lr, momentum=0.9)
        self.history: list[dict] = []
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.flush_logs()
        if exc_type is not None:
            mark_ready(self.rank)
        # every rank must be done writing before the group goes away
        dist.barrier()
        dist.destroy_process_group()
        return False

    def flush_logs(self) -> None:
        path = self.log_dir / f"trainer-history-rank{self.rank}.jsonl"
        path.write_text("".join(json.dumps(h) + "\n" for h in self.history))

    def sync_gradients(self) -> None:
        mark_ready(self.rank)
        for param in self.model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= self.world

    def fit(self, loader: DataLoader, epochs: int) -> None:
        for epoch in range(epochs):
            for step, (x, y) in enumerate(loader):
                loss = nn.functional.mse_loss(self.model(x), y)
                self.opt.zero_grad()
                loss.backward()
                self.sync_gradients()
                self.opt.step()
                self.history.append({"epoch": epoch, "step": step, "loss": loss.item()})


def main() -> None:
    torch.manual_seed(0)
    with Trainer(lr=5e-3) as trainer:
        loader = DataLoader(ShardDataset(trainer.rank), batch_size=8)
        trainer.fit(loader, epochs=50)


if __name__ == "__main__":
    main()
