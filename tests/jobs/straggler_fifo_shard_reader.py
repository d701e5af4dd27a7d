# hangdoc-expect: verdict=straggler culprits=1
# hangdoc-launch: mode=spawn nproc=3
"""Epoch 1 never started: rank 1 waited for a decompressor that had already died.

"Shards are gzip files; each rank starts a decompressor that writes into a named pipe
and reads the records from the pipe, so nothing big lands on local disk. Part 1 of
epoch 1 had not been published yet, the decompressor failed to open it and exited
without ever opening the pipe, and rank 1 blocked in open() on the FIFO. Ranks 0 and 2
staged their shards and waited at the barrier before the epoch."
"""

import datetime
import gzip
import os
import struct
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _ready import mark_ready
from torch import nn

EPOCHS = 50
RECORDS_PER_SHARD = 256
FEATURES = 16

# Runs as a separate process per shard, like `pigz -dc shard > fifo`, except that it opens
# its input before its output, so a missing input never opens the pipe.
DECOMPRESS = """
import gzip, shutil, sys
with gzip.open(sys.argv[1], "rb") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
"""


def shard_path(root: str, epoch: int, part: int) -> str:
    return os.path.join(root, f"epoch-{epoch:03d}", f"part-{part:05d}.bin.gz")


def publish_shards(root: str, world_size: int, epochs: int = 2) -> None:
    """Stand-in for the upstream preprocessing job, which publishes epoch by epoch while
    training runs; so far it has written two epochs, but part 1 of epoch 1 is late."""
    gen = torch.Generator().manual_seed(0)
    for epoch in range(epochs):
        os.makedirs(os.path.dirname(shard_path(root, epoch, 0)), exist_ok=True)
        for part in range(world_size):
            if (epoch, part) == (1, 1):
                continue
            x = torch.randn(RECORDS_PER_SHARD, FEATURES, generator=gen)
            with gzip.open(shard_path(root, epoch, part), "wb", compresslevel=1) as out:
                out.write(x.numpy().tobytes())


def stream_shard(root: str, epoch: int, part: int, scratch: str) -> torch.Tensor:
    fifo = os.path.join(scratch, f"stream-{epoch}-{part}")
    os.mkfifo(fifo)
    decompressor = subprocess.Popen([sys.executable, "-c", DECOMPRESS,
                                     shard_path(root, epoch, part), fifo],
                                    stderr=subprocess.DEVNULL)
    record = struct.calcsize("f") * FEATURES
    rows = []
    with open(fifo, "rb") as pipe:
        while chunk := pipe.read(record * 64):
            rows.append(torch.frombuffer(bytearray(chunk), dtype=torch.float32))
    decompressor.wait()
    os.unlink(fifo)
    return torch.cat(rows).view(-1, FEATURES)


def train(rank: int, world_size: int, root: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, FEATURES))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scratch = tempfile.mkdtemp(prefix=f"rank{rank}-")

    for epoch in range(EPOCHS):
        if epoch == 1:
            mark_ready(rank)
        data = stream_shard(root, epoch, rank, scratch)
        dist.barrier()  # every rank has its shard staged before the epoch starts
        for batch in data.split(64):
            noisy = batch + 0.1 * torch.randn_like(batch)
            loss = nn.functional.mse_loss(model(noisy), batch)
            opt.zero_grad()
            loss.backward()
            for param in model.parameters():
                dist.all_reduce(param.grad)
                param.grad /= world_size
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} denoising loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    world_size = int(os.environ.get("HANGDOC_TEST_NPROC", "3"))
    root = tempfile.mkdtemp(prefix="shards-")
    publish_shards(root, world_size)
    mp.spawn(train, args=(world_size, root), nprocs=world_size, join=True)


if __name__ == "__main__":
    main()
