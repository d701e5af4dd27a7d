"""Ray Train (TorchTrainer, gloo, 3 workers) that keeps training: small steps, a short
sleep (reading the next batch), an all_reduce of the gradients every step. Not hung.

Run as a Ray job: ``python train_healthy.py READY_DIR``. Every worker writes
``READY_DIR/ready.<world rank>`` (its pid) after a few warm-up steps.
"""

import os
import sys
import time

import ray
import ray.train
import torch
import torch.distributed as dist
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

MAX_STEPS = 100_000  # far more than a test run lasts: the test stops the job
WARMUP_STEPS = 5


def mark_ready(ready_dir: str, rank: int) -> None:
    tmp = os.path.join(ready_dir, f".ready.{rank}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.replace(tmp, os.path.join(ready_dir, f"ready.{rank}"))


def train_loop(config: dict) -> None:
    torch.set_num_threads(1)
    rank = ray.train.get_context().get_world_rank()
    model = torch.nn.Linear(256, 256)  # 256 KiB of gradients per step
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(MAX_STEPS):
        if step == WARMUP_STEPS:
            mark_ready(config["ready_dir"], rank)
        time.sleep(0.02)  # the next batch
        loss = model(torch.randn(4, 256)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()


if __name__ == "__main__":
    ready_dir = sys.argv[1]
    TorchTrainer(
        train_loop,
        train_loop_config={"ready_dir": ready_dir},
        scaling_config=ScalingConfig(num_workers=3, use_gpu=False,
                                     resources_per_worker={"CPU": 0.5},
                                     placement_strategy="SPREAD"),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name="hangdoc-train-healthy",
                             storage_path=os.path.join(ready_dir, "results")),
    ).fit()
