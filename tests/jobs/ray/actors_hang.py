"""Plain Ray actors that run torch.distributed themselves (no Ray Train): the driver
creates three actors named w0, w1, w2 (one per node where there are three); actor ``wI`` joins a gloo
process group as rank I (``init_method=tcp://``) and, after a few good steps, hangs:

``mismatch``: w0 broadcasts the new learning rate while w1 and w2 all_reduce gradients;
``straggler``: w2 waits for a data shard file that never appears, outside any collective,
while w0 and w1 wait for it in the all_reduce.

Run as a Ray job: ``python actors_hang.py MODE PORT READY_DIR``. The driver writes
``READY_DIR/job_id`` (its hex Ray job id); each actor writes ``READY_DIR/ready.<rank>``
(its pid) right before the call it hangs in.
"""

import datetime
import os
import sys
import time

import ray
import torch
import torch.distributed as dist
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

WORLD = 3


def mark_ready(ready_dir: str, name: str, text: str) -> None:
    tmp = os.path.join(ready_dir, f".{name}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(ready_dir, name))


def wait_for_shard(path: str) -> None:
    while not os.path.exists(path):  # nobody ever writes it
        time.sleep(0.5)


@ray.remote(num_cpus=0)
class Worker:
    def __init__(self, rank: int, port: int, ready_dir: str) -> None:
        self.rank, self.port, self.ready_dir = rank, port, ready_dir

    def train(self, mode: str) -> None:
        torch.set_num_threads(1)
        rank = self.rank
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{self.port}",
                                world_size=WORLD, rank=rank,
                                timeout=datetime.timedelta(minutes=30))
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(3):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            if step == 2:
                if mode == "mismatch" and rank == 0:
                    lr = torch.tensor([0.005])
                    mark_ready(self.ready_dir, f"ready.{rank}", str(os.getpid()))
                    dist.broadcast(lr, src=0)  # w1, w2 never call it here
                if mode == "straggler" and rank == 2:
                    mark_ready(self.ready_dir, f"ready.{rank}", str(os.getpid()))
                    wait_for_shard(os.path.join(self.ready_dir, "shard-never-written"))
                mark_ready(self.ready_dir, f"ready.{rank}", str(os.getpid()))
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()


if __name__ == "__main__":
    mode, port, ready_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ray.init(log_to_driver=False)
    mark_ready(ready_dir, "job_id", ray.get_runtime_context().get_job_id())
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    workers = [Worker.options(name=f"w{i}", scheduling_strategy=NodeAffinitySchedulingStrategy(
        nodes[i % len(nodes)], soft=False)).remote(i, port, ready_dir) for i in range(WORLD)]
    ray.get([w.train.remote(mode) for w in workers])  # never returns
