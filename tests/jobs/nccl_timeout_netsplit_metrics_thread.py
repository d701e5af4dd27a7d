# hangdoc-expect: verdict=nccl_timeout culprits=none
# hangdoc-launch: mode=netns nproc=3 cut=1
"""Three-node fine-tune frozen in the gradient all_reduce after a switch failure, with the
in-process system monitor still ticking in every worker.

"Every worker runs our telemetry thread (like wandb's system-metrics sampler): every 15 ms
it reads /proc, keeps a ring of the last 4096 samples, recomputes p50/p95 and appends a
JSON line to a spool file that a sidecar ships. It costs about a tenth of a core. When the
leaf switch died, all three workers stopped in the same gradient all_reduce and never
came back -- but top still showed ~10% CPU on each of them and their write counters kept
growing, so our own stall alert, which looks at CPU and I/O, called the job healthy for
an hour."

Truth: a transport hang (every rank waits in the same all_reduce from the same line and
no data moves between the ranks); the telemetry thread is not training progress.
"""

import collections
import datetime
import json
import os
import tempfile
import threading
import time

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

RING = 4096
INTERVAL_S = 0.015


class SystemMonitor(threading.Thread):
    """Samples this process from /proc and spools summaries, forever, in the background."""

    def __init__(self, rank: int) -> None:
        super().__init__(name="system-monitor", daemon=True)
        self.rank = rank
        zero = {"utime": 0.0, "stime": 0.0, "rss_mb": 0.0, "load1": 0.0}
        self.ring = collections.deque([dict(zero) for _ in range(RING)], maxlen=RING)
        self.spool = tempfile.TemporaryFile("w+")  # noqa: SIM115 (lives as long as the thread)

    @staticmethod
    def sample() -> dict:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open("/proc/loadavg") as load:
            load1 = float(load.read().split()[0])
        tick = os.sysconf("SC_CLK_TCK")
        return {"utime": int(fields[11]) / tick, "stime": int(fields[12]) / tick,
                "rss_mb": int(fields[21]) * os.sysconf("SC_PAGE_SIZE") / 2**20, "load1": load1}

    def summarise(self) -> dict:
        summary = {}
        for key in self.ring[0]:
            values = sorted(sample[key] for sample in self.ring)
            summary[key] = {"p50": values[RING // 2], "p95": values[int(RING * 0.95)],
                            "mean": sum(values) / RING}
        return summary

    def run(self) -> None:
        last_flush = time.monotonic()
        while True:
            self.ring.append(self.sample())
            summary = self.summarise()
            if time.monotonic() - last_flush > 1.0:
                self.spool.write(json.dumps({"rank": self.rank, "t": time.time(), **summary}))
                self.spool.write("\n")
                self.spool.flush()
                last_flush = time.monotonic()
            time.sleep(INTERVAL_S)


class Classifier(nn.Module):
    def __init__(self, features: int = 32, classes: int = 8) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, 128), nn.ReLU(), nn.Linear(128, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def main() -> None:
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    SystemMonitor(rank).start()
    torch.manual_seed(0)
    model = Classifier()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)

    for step in range(1, 10_000_000):
        x = torch.randn(64, 32, generator=gen)
        y = x[:, :8].argmax(dim=1)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= world_size
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        opt.step()
        if step == 3:
            mark_ready(rank)
        if rank == 0 and step % 100 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
