# hangdoc-expect: verdict=not_hung culprits=none
# hangdoc-launch: mode=torchrun nproc=3 settle=2
"""Healthy PyTorch Lightning DDP run: short epochs, validation and a checkpoint each epoch.

"A small sequence classifier trained with `Trainer(strategy="ddp")` under torchrun on CPU
workers. Every step reads a batch from a slow feature store (tens of milliseconds), DDP
all-reduces the gradients in backward, and every metric is logged with `sync_dist=True` on
every rank. Each epoch ends with a short validation run and ModelCheckpoint replacing
the newest checkpoint (a broadcast of the file name, a barrier, rank 0 writing). Nothing
is wrong; hangdoc must not call it hung whichever phase it lands in."
"""

import datetime
import os
import shutil
import tempfile
import time
import warnings

import lightning as L
import torch
from _ready import mark_ready
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, Dataset

warnings.filterwarnings("ignore")
WARMUP_STEPS = 3
FEATURE_STORE_LATENCY = 0.03  # seconds per batch


class FeatureStore(Dataset):
    """Token windows fetched from a remote feature store, one batch at a time."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, 64, (n, 12), generator=gen)
        self.y = (self.x.float().mean(dim=1) > 31.5).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, idx: int):
        return self.x[idx], self.y[idx]


def slow_collate(items):
    time.sleep(FEATURE_STORE_LATENCY)
    xs, ys = zip(*items, strict=False)
    return torch.stack(xs), torch.stack(ys)


class SeqClassifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(64, 32)
        self.head = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x):
        return self.head(self.embed(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train/loss", loss, sync_dist=True)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self.global_step == WARMUP_STEPS:
            mark_ready(self.global_rank)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val/loss", nn.functional.cross_entropy(logits, y), sync_dist=True)
        self.log("val/acc", (logits.argmax(dim=1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    root = os.path.join(tempfile.gettempdir(), "hangdoc-corpus", "lightning-healthy")
    if int(os.environ["RANK"]) == 0:  # only rank 0 writes checkpoints; start from a clean dir
        shutil.rmtree(root, ignore_errors=True)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        strategy=DDPStrategy(process_group_backend="gloo", timeout=datetime.timedelta(hours=1)),
        max_epochs=-1,
        max_time=datetime.timedelta(minutes=15),
        limit_train_batches=20,
        limit_val_batches=4,
        callbacks=[ModelCheckpoint(dirpath=root)],  # keeps the newest epoch
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    trainer.fit(SeqClassifier(),
                DataLoader(FeatureStore(2048, 1), batch_size=16, shuffle=True,
                           collate_fn=slow_collate),
                DataLoader(FeatureStore(256, 2), batch_size=16, collate_fn=slow_collate))


if __name__ == "__main__":
    main()
