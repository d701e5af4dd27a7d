"""A 4-rank training job with a classic bug: rank 3 logs metrics one step early.

Every rank trains a tiny model and all-reduces its gradients each step; every
``LOG_EVERY`` steps the ranks all-gather their losses for logging. Rank 3 computes its
step counter from a different offset (think: resumed from a checkpoint with a different
``start_step``), so in the fourth iteration rank 3 goes to the metrics all-gather while
ranks 0-2 go to the gradient all-reduce. Both calls block forever: a collective mismatch.

Run it with ``torchrun --nproc-per-node 4 examples/demo_train.py``; diagnose it with
``hangdoc diagnose pid:<torchrun pid>``. ``make demo`` does both.
"""

import os
import pathlib

import torch
import torch.distributed as dist

LOG_EVERY = 4


def gather_metrics(loss: torch.Tensor) -> list[float]:
    gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, loss.detach().reshape(1))
    return [t.item() for t in gathered]


def sync_gradients(model: torch.nn.Module) -> None:
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start_step = 1 if rank == 3 else 0  # the bug: rank 3 resumed with another offset
    ready = os.environ.get("HANGDOC_READY_DIR")
    for it, step in enumerate(range(start_step, 1000)):
        if ready and it == LOG_EVERY - 1:  # lets `make demo` know the job reached the hang
            pathlib.Path(ready, f"ready.{rank}").touch()
        x = torch.randn(8, 16)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if step > 0 and step % LOG_EVERY == 0:
            losses = gather_metrics(loss)
            if rank == 0:
                print(f"step {step} losses {losses}", flush=True)
        sync_gradients(model)
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
