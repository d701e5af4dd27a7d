# hangdoc-expect: verdict=straggler culprits=2
# hangdoc-launch: mode=torchrun nproc=3
"""Rank 2 waits forever for a batch from a prefetch thread that already died, while the
telemetry thread keeps every worker at ~10% CPU.

"We wrap our data iterator in a BackgroundGenerator (the prefetch_generator pattern: a
thread fills a bounded queue, __next__ does queue.get()). On rank 2 the decoder hit a
truncated record and raised inside the background thread; the thread printed a traceback
and died without putting its end-of-data sentinel, and rank 2's training loop blocked in
queue.get() forever. Ranks 0 and 1 sat in the gradient all_reduce. Every worker also runs
our system-metrics thread (reads /proc every 15 ms, recomputes percentiles, spools JSON),
so all three processes kept using ~10% CPU and looked alive."

Truth: a straggler -- rank 2 is outside any collective (blocked in queue.get on its main
thread) while ranks 0 and 1 wait in all_reduce; the telemetry threads are not progress.
"""

import collections
import datetime
import json
import os
import queue
import tempfile
import threading
import time

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

RING = 4096
INTERVAL_S = 0.015
BAD_RECORD_STEP = 4


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


class BackgroundGenerator(threading.Thread):
    """prefetch_generator's BackgroundGenerator: the consumer just calls queue.get()."""

    def __init__(self, generator, max_prefetch: int = 2) -> None:
        super().__init__(name="prefetch", daemon=True)
        self.queue: queue.Queue = queue.Queue(max_prefetch)
        self.generator = generator
        self.start()

    def run(self) -> None:
        for item in self.generator:  # an exception here kills the thread: no sentinel
            self.queue.put(item)
        self.queue.put(None)

    def __iter__(self):
        return self

    def __next__(self):
        item = self.queue.get()
        if item is None:
            raise StopIteration
        return item


def decode_records(rank: int, steps: int = 10_000):
    gen = torch.Generator().manual_seed(rank)
    for step in range(1, steps + 1):
        raw = torch.randn(32, 40, generator=gen)
        if rank == 2 and step == BAD_RECORD_STEP:
            raise ValueError(f"record {step * 32 + 7}: truncated (expected 160 bytes, got 96)")
        yield raw[:, :32], (raw[:, 32:].sum(dim=1) > 0).long()


def main() -> None:
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    SystemMonitor(rank).start()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = BackgroundGenerator(decode_records(rank))

    for step, (x, y) in enumerate(batches, start=1):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad.div_(world_size)
        opt.step()
        if step == BAD_RECORD_STEP - 1:
            mark_ready(rank)  # rank 2's next batch never comes
        if rank == 0 and step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
