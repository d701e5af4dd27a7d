"""Ray Train (TorchTrainer, gloo, 3 workers): world rank 2 leaves the gradient all_reduce
for an all_gather of its eval accuracy, while ranks 0 and 1 are still in the all_reduce.

Run as a Ray job: ``python train_mismatch.py READY_DIR``. Every worker writes
``READY_DIR/ready.<world rank>`` (its pid) right before the call it hangs in.
"""

import os
import sys

import ray
import ray.train
import torch
import torch.distributed as dist
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer


def mark_ready(ready_dir: str, rank: int) -> None:
    tmp = os.path.join(ready_dir, f".ready.{rank}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.replace(tmp, os.path.join(ready_dir, f"ready.{rank}"))


def sync_grads(model: torch.nn.Module) -> None:
    for p in model.parameters():
        dist.all_reduce(p.grad)


def eval_gather(acc: torch.Tensor, world: int) -> list:
    out = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(out, acc)
    return out


def train_loop(config: dict) -> None:
    torch.set_num_threads(1)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = 2 if rank == 2 else 3  # uneven shards: rank 2 runs out first
    for step in range(batches):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if step == 2:  # ranks 0 and 1 only: rank 2 is gone
            mark_ready(config["ready_dir"], rank)
        sync_grads(model)
        opt.step()
    acc = torch.ones(1) * rank
    mark_ready(config["ready_dir"], rank)  # rank 2 only: 0 and 1 never get here
    eval_gather(acc, world)


if __name__ == "__main__":
    ready_dir = sys.argv[1]
    TorchTrainer(
        train_loop,
        train_loop_config={"ready_dir": ready_dir},
        scaling_config=ScalingConfig(num_workers=3, use_gpu=False,
                                     resources_per_worker={"CPU": 0.5},
                                     placement_strategy="SPREAD"),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name="hangdoc-train-mismatch",
                             storage_path=os.path.join(ready_dir, "results")),
    ).fit()
