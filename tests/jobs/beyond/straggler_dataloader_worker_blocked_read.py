# hangdoc-expect: verdict=straggler culprits=1
# hangdoc-launch: mode=direct nproc=2
# hangdoc-root: cmd=straggler_dataloader_worker_blocked_read.py thread=MainThread
"""Epoch 1 never started on rank 1: its DataLoader worker reads a pipe nobody writes.

"Each rank reads its shard of the epoch as fixed-size records. Shards already on local
disk are read from the file; a shard that is not is streamed: the staging hook makes a
named pipe in its place and starts a copy from the shared store into it. The dataset
opens the pipe read-write, so that opening it does not block until the copy has opened
its end. Rank 1's epoch-1 shard was not on local disk, and the copy failed at once (the
shard was missing from the store); the hook only logs that. Rank 1's DataLoader worker
has the pipe open for both reading and writing, so it never sees end-of-file: it blocks
in ``os.read`` forever, rank 1 waits for a batch, and rank 0 waits in the gradient
all_reduce of the epoch's first step."
"""

import datetime
import os
import subprocess
import tempfile
import threading

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

FEATURES = 16
RECORD = 4 * (FEATURES + 1)  # float32 features and label
RECORDS_PER_SHARD = 256
EPOCHS = 100
STREAMED = {(1, 1)}  # (epoch, rank) shards that were not on local disk


class ShardRecords(IterableDataset):
    """Records of one shard, from its file or from the pipe it is streamed into."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __iter__(self):
        streamed = self.path.endswith(".pipe")
        fd = os.open(self.path, os.O_RDWR if streamed else os.O_RDONLY)
        if streamed:  # the worker is about to block: the rank is ready once it does
            mark_ready(int(os.environ["RANK"]))
        try:
            while True:
                buf = b""
                while len(buf) < RECORD:
                    chunk = os.read(fd, RECORD - len(buf))
                    if not chunk:
                        return
                    buf += chunk
                row = torch.frombuffer(bytearray(buf), dtype=torch.float32)
                yield row[:FEATURES], row[FEATURES]
        finally:
            os.close(fd)


def write_shard(path: str, epoch: int, rank: int) -> None:
    gen = torch.Generator().manual_seed(1000 * epoch + rank)
    x = torch.randn(RECORDS_PER_SHARD, FEATURES, generator=gen)
    y = (x[:, :4].sum(dim=1) > 0).float()
    with open(path, "wb") as out:
        out.write(torch.cat([x, y[:, None]], dim=1).numpy().tobytes())


def stage_shard(root: str, epoch: int, rank: int) -> str:
    """The shard's local path: written to local disk, or a pipe a copy streams into."""
    if (epoch, rank) not in STREAMED:
        path = os.path.join(root, f"epoch{epoch}-part{rank}.bin")
        write_shard(path, epoch, rank)
        return path
    path = os.path.join(root, f"epoch{epoch}-part{rank}.pipe")
    os.mkfifo(path)
    source = os.path.join(root, "store", f"epoch{epoch}", f"part{rank}.bin")  # never published
    copy = subprocess.Popen(["cp", source, path], stderr=subprocess.DEVNULL)

    def log_copy_exit() -> None:
        code = copy.wait()
        if code:
            print(f"staging: copy of {source} exited with {code}", flush=True)

    threading.Thread(target=log_copy_exit, name="stage-log").start()
    return path


def main() -> None:
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    root = tempfile.mkdtemp(prefix=f"shards-rank{rank}-")

    for epoch in range(EPOCHS):
        loader = DataLoader(ShardRecords(stage_shard(root, epoch, rank)), batch_size=32, num_workers=1)
        for step, (x, y) in enumerate(loader):
            loss = nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(-1), y)
            opt.zero_grad()
            loss.backward()
            if epoch == 1 and step == 0:
                mark_ready(rank)
            for param in model.parameters():
                dist.all_reduce(param.grad)
                param.grad /= world_size
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
