"""A tiny real training job for ``hangdoc watch`` tests: DDP over gloo on CPU, under torchrun.

It trains a small MLP, prints one line per step ("step N loss X"), and can be told to
misbehave at a step:

- ``--hang mismatch``: the last rank believes training is over (an early-stopping flag
  computed from its own loss) and goes to the final barrier, while the others run the
  next step and wait in DDP's gradient all-reduce: a collective mismatch, culprit the
  last rank.
- ``--hang lock``: rank 1's data prefetch thread dies holding the batch lock; rank 1
  blocks on it forever while the others wait in the all-reduce: a straggler, culprit 1.
- ``--pause S``: at ``--at``, rank 0 writes a checkpoint for S seconds (CPU busy, bytes
  written) while the others wait in a barrier: slow, but progressing.
- ``--jitter``: healthy, with step times drawn between 5 and 40 ms and a 250 ms spike
  every 37 steps.

- ``--hang leave``: the last two ranks believe training is over and go to the final
  barrier through ``stop_early`` (from two lines of it), while the others wait in the next
  step's all-reduce: a collective mismatch whose paths part at ``stop_early``, which the
  summary names.

``--heartbeat`` marks steps with ``hangdoc.step()``. ``--markup-names`` gives the job names
that look like rich markup (issue 23): ``stop_early`` is called ``[/]x``, and a thread
``reader[/dev/sda]`` waits beside the training loop.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import tempfile
import threading
import time
import types

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--at", type=int, default=10)
    p.add_argument("--hang", choices=["none", "mismatch", "lock", "leave"], default="none")
    p.add_argument("--pause", type=float, default=0.0)
    p.add_argument("--jitter", action="store_true")
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--heartbeat", action="store_true")
    p.add_argument("--markup-names", action="store_true")
    return p.parse_args()


class Prefetcher:
    """Batches made by a background thread behind a lock (the ``--hang lock`` culprit)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def die_holding_lock(self) -> None:
        def run() -> None:
            self.lock.acquire()
            raise SystemExit  # a thread that ends without releasing: the lock stays held

        t = threading.Thread(target=run, name="prefetch")
        t.start()
        t.join()

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        with self.lock:
            x = torch.randn(16, 32)
            return x, x.sum(dim=1, keepdim=True)


def stop_early(rank: int, world: int) -> None:
    """A rank that believes training is over (``--hang leave``): the last one logs its
    summary first; both wait at the final barrier for the others, who never come."""
    print(f"rank {rank}: loss plateaued, stopping early", flush=True)
    if rank != world - 1:
        dist.barrier()
        return
    print(f"rank {rank}: summary written", flush=True)
    dist.barrier()


MARKUP_FUNCTION = "[/]x"
MARKUP_THREAD = "reader[/dev/sda]"


def markup_names() -> None:
    """Rename ``stop_early`` ``[/]x`` (``def`` takes only identifiers; a code object takes
    any name) and start an idle thread named ``reader[/dev/sda]``."""
    global stop_early
    code = stop_early.__code__.replace(co_name=MARKUP_FUNCTION, co_qualname=MARKUP_FUNCTION)
    stop_early = types.FunctionType(code, globals(), MARKUP_FUNCTION)
    threading.Thread(target=threading.Event().wait, name=MARKUP_THREAD, daemon=True).start()


def save_checkpoint(model: nn.Module, seconds: float) -> None:
    """Rank 0 serialises for ``seconds``: busy and writing, slow but moving."""
    end = time.monotonic() + seconds
    with tempfile.TemporaryFile() as f:
        while time.monotonic() < end:
            state = {k: v.clone() * 1.0001 for k, v in model.state_dict().items()}
            torch.save(state, f)
            f.flush()


def main() -> None:
    args = parse()
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Prefetcher()
    if args.markup_names:
        markup_names()
    rng = random.Random(rank * 1000 + 7)
    if args.heartbeat:
        import hangdoc
    for step in range(args.steps):
        ctx = hangdoc.step(step) if args.heartbeat else _nothing()
        with ctx:
            if step == args.at and args.hang == "lock" and rank == 1:
                data.die_holding_lock()
            if step == args.at and args.hang == "mismatch" and rank == world - 1:
                print(f"rank {rank}: loss plateaued, stopping early", flush=True)
                dist.barrier()  # the others never come: they are in the next step's backward
            if step == args.at and args.hang == "leave" and rank >= world - 2:
                stop_early(rank, world)
            if step == args.at and args.pause:
                if rank == 0:
                    save_checkpoint(model.module, args.pause)
                dist.barrier()
            x, y = data.next_batch()
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if args.jitter:
                spike = 0.25 if step % 37 == 36 else 0.0
                time.sleep(rng.uniform(0.005, 0.04) + spike)
            else:
                time.sleep(args.step_time)
            if rank == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    if rank == 0:
        print("training done", flush=True)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
