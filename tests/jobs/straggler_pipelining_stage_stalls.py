# hangdoc-expect: verdict=straggler culprits=0
# hangdoc-launch: mode=torchrun nproc=3
"""Three-stage 1F1B pipeline: the first stage's prefetch thread died on a bad record, so
stage 0 waits forever on an empty queue while stages 1 and 2 wait in the schedule's recvs.

"We train a small review classifier with torch.distributed.pipelining: a PipelineStage
per rank, Schedule1F1B, 4 micro-batches, three stages (embedding + blocks / blocks /
blocks + pooling head + loss). Stage 0 reads the review text, the last stage reads the
labels column (a separate, small file). Stage 0's loader is a TokenStream that parses
JSON lines in a background thread and hands fixed-size batches to the training loop
through a queue.Queue, so tokenisation overlaps with the pipeline. At record 180 of the
shard a line was truncated mid-write; json.loads raised in the prefetch thread, the
thread printed its traceback and ended -- and the training loop's queue.get() has no
timeout. After 22 healthy steps the job just stopped: rank 0 sits in queue.get(), rank 1
waits in the schedule's fwd_recv for rank 0's next activations, rank 2 in its own
fwd_recv for rank 1."

Truth: a straggler -- rank 0 is outside torch.distributed (blocked on a queue whose
producer is gone); ranks 1 and 2 are in p2p receives that, directly or through rank 1,
wait for rank 0.
"""

import datetime
import json
import os
import queue
import threading

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

VOCAB, DIM, SEQ, CLASSES = 512, 48, 32, 5
BATCH, MICRO_BATCHES = 8, 4
BAD_RECORD = 180  # a line the upstream writer truncated


def shard_lines(shard: int):
    """The JSON-lines shard of review tokens as the storage layer returns it."""
    gen = torch.Generator().manual_seed(shard)
    index = 0
    while True:
        ids = torch.randint(1, VOCAB, (SEQ,), generator=gen).tolist()
        line = json.dumps({"id": index, "input_ids": ids})
        if index == BAD_RECORD:
            line = line[: len(line) // 2]  # the writer was killed halfway through this line
        yield line
        index += 1


class TokenStream:
    """Parses records in a background thread; __next__ hands out [BATCH, SEQ + 1] batches."""

    def __init__(self, lines, depth: int = 4) -> None:
        self.lines = lines
        self.batches: queue.Queue[torch.Tensor] = queue.Queue(maxsize=depth)
        self.thread = threading.Thread(target=self._produce, name="token-prefetch",
                                       daemon=True)
        self.thread.start()

    def _produce(self) -> None:
        rows = []
        for line in self.lines:
            record = json.loads(line)
            rows.append(torch.tensor(record["input_ids"]))
            if len(rows) == BATCH:
                self.batches.put(torch.stack(rows))
                rows = []

    def __iter__(self):
        return self

    def __next__(self) -> torch.Tensor:
        return self.batches.get()


def label_column(shard: int) -> torch.Tensor:
    """The shard's labels file (intact): one class id per record."""
    return torch.randint(0, CLASSES, (100_000,), generator=torch.Generator().manual_seed(shard))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.ff = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


class PoolHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.out = nn.Linear(DIM, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x).mean(dim=1))


def stage_module(stage_index: int, num_stages: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Embedding(VOCAB, DIM)] if stage_index == 0 else []
    layers += [Block(), Block()]
    if stage_index == num_stages - 1:
        layers.append(PoolHead())
    return nn.Sequential(*layers)


def main() -> None:
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(rank)
    module = stage_module(rank, world)
    stage = PipelineStage(module, stage_index=rank, num_stages=world,
                          device=torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=MICRO_BATCHES,
                            loss_fn=nn.functional.cross_entropy)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3)

    stream = TokenStream(shard_lines(0)) if stage.is_first else None
    labels = label_column(0) if stage.is_last else None
    for step in range(10_000):
        if step == BAD_RECORD // BATCH:
            mark_ready(rank)
        opt.zero_grad()
        if stage.is_first:
            schedule.step(next(stream))
        elif stage.is_last:
            losses: list[torch.Tensor] = []
            schedule.step(target=labels[step * BATCH:(step + 1) * BATCH], losses=losses)
            if step % 5 == 0:
                print(f"step {step} loss {torch.stack(losses).mean().item():.3f}", flush=True)
        else:
            schedule.step()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
