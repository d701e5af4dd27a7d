# hangdoc-expect: verdict=collective_mismatch culprits=2
# hangdoc-launch: mode=torchrun nproc=3 settle=2
"""PyTorch Lightning with `use_distributed_sampler=False` and shards of different sizes.

"Our data is pre-sharded on disk, one shard per rank, so we told Lightning not to add its
DistributedSampler (`Trainer(use_distributed_sampler=False)`) and every rank builds a
DataLoader over its own shard. The shards are whatever the preprocessing job wrote: rank
2's is one batch shorter. At the end of its first epoch rank 2 went on to the validation
run and ended in the barrier of the epoch-end `sync_dist` reduction of its validation
metric. Ranks 0 and 1 still had a batch to train on. Lightning starts every training
step with a broadcast of rank 0's SIGTERM flag; rank 1 got it and went on into
`loss.backward()` -- DDP's gradient all_reduce, which runs in C++ from autograd hooks, so
its Python stack ends in backward -- while rank 0, the broadcast's root, still waited for
rank 2 to take its part. Three ranks, three different collectives, one cause: rank 2 is
the only one that left the training loop." Lightning's docs say that without its sampler
each rank must see the same number of batches; nothing checks it.
"""

import datetime
import os
import tempfile
import warnings

import lightning as L
import torch
from _ready import mark_ready
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

warnings.filterwarnings("ignore")
SHARD_SIZES = {0: 160, 1: 160, 2: 128}  # samples in each rank's shard on disk
BATCH = 32


def shard(rank: int, n: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed * 100 + rank)
    x = torch.randn(n, 12, generator=gen)
    return TensorDataset(x, x[:, :3].sum(dim=1, keepdim=True))


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 48), nn.Tanh(), nn.Linear(48, 1))
        self.batches = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss)
        self.batches += 1
        if self.batches >= SHARD_SIZES[2] // BATCH:
            mark_ready(self.global_rank)  # the shortest shard's last batch
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/mse", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    rank = int(os.environ["RANK"])
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        strategy=DDPStrategy(process_group_backend="gloo", timeout=datetime.timedelta(hours=1)),
        use_distributed_sampler=False,
        max_epochs=30,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=os.path.join(tempfile.gettempdir(), "hangdoc-corpus", "lightning-shards"),
    )
    trainer.fit(Regressor(),
                DataLoader(shard(rank, SHARD_SIZES[rank], 1), batch_size=BATCH, shuffle=True),
                DataLoader(shard(rank, 64, 2), batch_size=BATCH))


if __name__ == "__main__":
    main()
