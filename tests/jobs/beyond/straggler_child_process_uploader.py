# hangdoc-expect: verdict=straggler culprits=1
# hangdoc-launch: mode=direct nproc=3
# hangdoc-root: cmd=--upload thread=MainThread
"""The resumed run stopped at its first checkpoint: rank 1's uploader deadlocked itself.

"Rank 1 is the node's checkpoint uploader: every few steps it saves the model and runs
the upload tool as a child process (``subprocess.run``, waiting for it, so that a
checkpoint is never half uploaded when the next one is written). The run had just been
resumed after a preemption, and the upload token cached by the previous run had
expired. The uploader's ``put`` holds the session lock while it checks the token and
calls ``_refresh_token``, which takes the session lock too: a plain ``threading.Lock``.
The upload child blocks on its own lock, rank 1 waits for the child, and ranks 0 and 2
wait in the next gradient all_reduce."
"""

import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

UPLOAD_RANK = 1
CKPT_EVERY = 3
HANG_STEP = CKPT_EVERY  # the first checkpoint of the resumed run
STEPS = 1000


# ------------------------------------------------------------------ the upload tool (child)


class Uploader:
    """Copies files into the bucket with a session token it refreshes when it expires."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self.token_path = os.path.join(bucket, ".session-token")
        self._session_lock = threading.Lock()

    def _token(self) -> dict:
        with open(self.token_path) as f:
            return json.load(f)

    def _refresh_token(self) -> None:
        with self._session_lock, open(self.token_path, "w") as f:  # put() holds the lock already
            json.dump({"token": os.urandom(8).hex(), "expires": time.time() + 3600}, f)

    def put(self, path: str) -> None:
        with self._session_lock:
            if self._token()["expires"] < time.time():
                self._refresh_token()
            shutil.copy(path, os.path.join(self.bucket, os.path.basename(path)))


def upload(path: str, bucket: str) -> None:
    Uploader(bucket).put(path)


# ------------------------------------------------------------------ the trainer


def resumed_bucket() -> str:
    """The bucket as the preempted run left it, with the token it cached an hour ago."""
    bucket = tempfile.mkdtemp(prefix="ckpt-bucket-")
    with open(os.path.join(bucket, ".session-token"), "w") as f:
        json.dump({"token": "3f9c2a", "expires": time.time() - 60}, f)
    return bucket


def main() -> None:
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    if rank == UPLOAD_RANK:
        bucket = resumed_bucket()
        scratch = tempfile.mkdtemp(prefix="ckpt-local-")

    for step in range(STEPS):
        if rank == UPLOAD_RANK and step > 0 and step % CKPT_EVERY == 0:
            path = os.path.join(scratch, f"step-{step:06d}.pt")
            torch.save(model.state_dict(), path)
            if step == HANG_STEP:
                mark_ready(rank)
            subprocess.run([sys.executable, __file__, "--upload", path, bucket], check=True)
        x = torch.randn(32, 12, generator=gen)
        y = (x[:, :3].argmax(dim=1) + x[:, 3:6].argmax(dim=1)) % 3
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        if step == HANG_STEP and rank != UPLOAD_RANK:
            mark_ready(rank)
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad /= world_size
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--upload"]:
        upload(sys.argv[2], sys.argv[3])
    else:
        main()
