# hangdoc-expect: verdict=straggler culprits=1
# hangdoc-launch: mode=torchrun nproc=3
"""torch.distributed.checkpoint save with a mirroring storage writer: rank 1's mirror
thread died on its first upload, so its write_data blocks on the full hand-off queue while
ranks 0 and 2 wait in DCP's gather of the write results.

"We checkpoint with dcp.save every other step to each node's local NVMe and mirror the
shard files to the object store in the background. MirroringWriter subclasses
FileSystemWriter: once its shard file is written it hands the path to a mirror thread
through a queue.Queue(maxsize=1) -- the bound is deliberate back-pressure, so that a slow
upload stalls the trainer instead of filling the local disk with checkpoints nobody has
uploaded. On node 1 the object-store mount had not come up after a reboot (its systemd
mount unit failed), so the first copy raised FileNotFoundError; the mirror thread printed
its traceback and ended, and nothing restarts it. The second checkpoint's file went into
the queue's one slot; at the third checkpoint rank 1's write_data blocks in queue.put()
forever. Ranks 0 and 2 wrote their shards and are inside dcp.save's 'write' step, in
gather_object (rank 0 collects everyone's WriteResults to write the .metadata file) --
waiting for rank 1, which never gets there."

Truth: a straggler. Rank 1 is outside torch.distributed (blocked in queue.put inside its
storage writer, its mirror thread gone); ranks 0 and 2 wait in DCP's collective for it.
"""

import datetime
import os
import queue
import shutil
import tempfile
import threading
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from _ready import mark_ready
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter

CKPT_EVERY = 2
DIM = 64


class MirroringWriter(FileSystemWriter):
    """FileSystemWriter that also hands each written shard file to a mirror thread."""

    def __init__(self, path: Path, mirror: "ShardMirror") -> None:
        super().__init__(path, thread_count=1, sync_files=False)
        self.local_dir = Path(path)
        self.mirror = mirror

    def write_data(self, plan, planner):
        future = super().write_data(plan, planner)
        results = future.wait()  # thread_count=1: written in this thread already
        for name in sorted({r.storage_data.relative_path for r in results}):
            self.mirror.pending.put(self.local_dir / name)  # back-pressure: blocks when full
        return future


class ShardMirror:
    """Copies shard files to the node's object-store mount, one at a time, in order."""

    def __init__(self, mount: Path) -> None:
        self.mount = mount
        self.pending: queue.Queue[Path] = queue.Queue(maxsize=1)
        self.thread = threading.Thread(target=self._run, name="ckpt-mirror", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            src = self.pending.get()
            dst = self.mount / src.parent.name / src.name
            dst.parent.mkdir(exist_ok=True)  # the step directory under the bucket prefix
            shutil.copyfile(src, dst)


def node_mount(root: Path, node: int) -> Path:
    """The node's object-store mount point; node 1's mount unit failed after a reboot."""
    mount = root / f"node{node}" / "mnt" / "ckpt-mirror"
    if node != 1:
        mount.mkdir(parents=True, exist_ok=True)
    return mount


def main() -> None:
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    # beside the harness's ready markers (a directory the test removes), else in /tmp
    ready = os.environ.get("HANGDOC_READY_DIR")
    root = (Path(ready).parent if ready else Path(tempfile.gettempdir())) / \
        f"dcp-mirror-{os.environ['MASTER_PORT']}"
    mirror = ShardMirror(node_mount(root, rank))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    for step in range(1, 10_000):
        x = torch.randn(32, DIM, generator=gen)
        loss = nn.functional.mse_loss(model(x), x)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        if step % CKPT_EVERY == 0:
            state = {"model": model.state_dict(), "optim": opt.state_dict(),
                     f"sampler.rank{rank}": torch.tensor([step * 32])}
            local_dir = root / f"node{rank}" / "nvme" / f"step{step:06d}"
            if step == 3 * CKPT_EVERY:
                mark_ready(rank)
            dcp.save(state, storage_writer=MirroringWriter(local_dir, mirror))
            if rank == 0:
                print(f"step {step} loss {loss.item():.4f} checkpointed", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
