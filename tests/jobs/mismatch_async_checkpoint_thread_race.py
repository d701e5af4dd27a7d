# hangdoc-expect: verdict=collective_mismatch culprits=0,1,2
# hangdoc-launch: mode=spawn nproc=3
"""An async checkpoint thread and the main thread both issue collectives on the default
group, in opposite orders on rank 0 and on ranks 1-2: every rank deadlocks.

"We made checkpointing asynchronous the way DCP's async_save does it: the state is
snapshotted to CPU and a ThreadPoolExecutor(max_workers=1) worker serializes the shard,
checksums it and then exchanges the shard manifest with dist.all_gather_object -- on the
default group, because that is what the save function had always used. The main thread
goes on. After each checkpoint rank 0 alone runs a quick validation and the others wait
for it at a dist.barrier(). On ranks 1 and 2 the main thread reaches that barrier right
away, while the worker is still serializing; on rank 0 the validation takes a few hundred
milliseconds, so its worker's all_gather goes first. gloo pairs collectives by the order
they are issued on a group, so rank 0's all_gather meets the others' barrier and rank 0's
barrier their all_gather; nothing ever completes. py-spy shows barrier() in every
MainThread and all_gather_object() in every async_ckpt thread."

Culprits: all three ranks. On every rank two threads have collectives outstanding on the
same group at once; the issue order differs between rank 0 and ranks 1-2, but it is a
race in each of them (an ordinary timing change would flip any rank), so no rank is more
at fault than another -- the bug is issuing collectives concurrently from two threads on
one group, which every rank does.
"""

import datetime
import hashlib
import io
import os
from concurrent.futures import Future, ThreadPoolExecutor

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _ready import mark_ready
from torch import nn

CHECKPOINT_EVERY = 5
DIM = 512


class AsyncCheckpointer:
    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="async_ckpt")
        self.pending: Future | None = None

    def async_save(self, state: dict, step: int) -> Future:
        if self.pending is not None:
            self.pending.result()  # one checkpoint in flight at a time
        cpu_state = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        self.pending = self.pool.submit(self._save, cpu_state, step)
        return self.pending

    @staticmethod
    def _save(cpu_state: dict, step: int) -> int:
        rank = dist.get_rank()
        blob = io.BytesIO()  # the rank's shard file on the shared filesystem in the real job
        torch.save(cpu_state, blob)
        entry = {"rank": rank, "step": step, "bytes": blob.tell(), "keys": sorted(cpu_state),
                 "sha256": hashlib.sha256(blob.getbuffer()).hexdigest()}
        manifest: list = [None] * dist.get_world_size()
        dist.all_gather_object(manifest, entry)  # default group
        return sum(e["bytes"] for e in manifest)


@torch.no_grad()
def validate(model: nn.Module, batches: int = 100) -> float:
    gen = torch.Generator().manual_seed(0)
    total = 0.0
    for _ in range(batches):
        x = torch.randn(64, DIM, generator=gen)
        total += nn.functional.mse_loss(model(x), x).item()
    return total / batches


def worker(rank: int, world_size: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(DIM, DIM) for _ in range(8)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    ckpt = AsyncCheckpointer()
    gen = torch.Generator().manual_seed(rank)
    for step in range(1, 10_000):
        x = torch.randn(32, DIM, generator=gen)
        loss = nn.functional.mse_loss(model(x), x)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        opt.step()
        if step % CHECKPOINT_EVERY == 0:
            state = {**model.state_dict(),
                     **{f"optim.{k}": v for k, v in _flat_optim(opt).items()}}
            ckpt.async_save(state, step)
            if rank == 0:
                print(f"step {step}: val loss {validate(model):.4f}", flush=True)
            mark_ready(rank)
            dist.barrier()  # the other ranks wait for rank 0's validation


def _flat_optim(opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    flat = {}
    for idx, st in opt.state_dict()["state"].items():
        for name, value in st.items():
            if torch.is_tensor(value):
                flat[f"{idx}.{name}"] = value
    return flat


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29515")
    nprocs = int(os.environ.get("HANGDOC_TEST_NPROC", "3"))
    mp.spawn(worker, args=(nprocs,), nprocs=nprocs)
