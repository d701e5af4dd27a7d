"""Ray Train (TorchTrainer, gloo, 3 workers): world rank 1 waits for a checkpoint lock that
a writer thread took and never released, outside any collective, while ranks 0 and 2 wait
for it in the gradient all_reduce.

Run as a Ray job: ``python train_straggler.py READY_DIR``. Every worker writes
``READY_DIR/ready.<world rank>`` (its pid) right before the call it hangs in.
"""

import os
import sys
import threading

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


def write_checkpoint_async(lock: threading.Lock) -> None:
    lock.acquire()  # the writer dies before it releases: a bug of the job
    raise RuntimeError("disk full")


def load_latest_shard(lock: threading.Lock) -> None:
    with lock:  # blocks forever
        pass


def train_loop(config: dict) -> None:
    torch.set_num_threads(1)
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    checkpoint_lock = threading.Lock()
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(3):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if step == 2:
            if rank == 1:
                writer = threading.Thread(target=write_checkpoint_async,
                                          args=(checkpoint_lock,), daemon=True)
                writer.start()
                writer.join()
                mark_ready(config["ready_dir"], rank)
                load_latest_shard(checkpoint_lock)
            else:
                mark_ready(config["ready_dir"], rank)
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
        run_config=RunConfig(name="hangdoc-train-straggler",
                             storage_path=os.path.join(ready_dir, "results")),
    ).fit()
