# hangdoc-expect: verdict=straggler culprits=3
# hangdoc-launch: mode=slurm nproc=4 spec=slurm
"""Slurm job that never got past "building token caches" on one task.

"Several jobs share the token cache directory, so building a cache takes a lock file.
Task 3's shard has a record the fast tokenizer rejects; we catch that and retry with the
slow tokenizer, but the first attempt never released its lock file (release was not in a
finally). The retry politely waits for the lock — its own — forever, polling every half
second. Tasks 0-2 finished their caches and sat in the all_reduce that agrees on the
number of batches per epoch."
"""

import datetime
import os
import tempfile
import time

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

VOCAB = 512
SEQ = 16


class LockFile:
    """Advisory cross-process lock: whoever creates the file owns it."""

    def __init__(self, path: str, poll: float = 0.5) -> None:
        self.path = path
        self.poll = poll

    def acquire(self) -> None:
        while True:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                time.sleep(self.poll)
                continue
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            return

    def release(self) -> None:
        os.unlink(self.path)


def fast_tokenize(line: str) -> list[int]:
    if not line.isascii():
        raise ValueError(f"fast tokenizer: non-ASCII input {line[:20]!r}")
    return [ord(c) % VOCAB for c in line]


def slow_tokenize(line: str) -> list[int]:
    return [b % VOCAB for b in line.encode("utf-8")]


def shard_lines(task: int, count: int = 400) -> list[str]:
    gen = torch.Generator().manual_seed(task)
    words = ["loss", "grad", "step", "token", "batch", "model", "node", "rank", "epoch"]
    lines = [" ".join(words[i] for i in torch.randint(0, len(words), (8,), generator=gen))
             for _ in range(count)]
    if task == 3:
        lines[137] = "na\u00efve caf\u00e9 r\u00e9sum\u00e9 entries"
    return lines


def build_cache(lines: list[str], cache_path: str, tokenize) -> torch.Tensor:
    lock = LockFile(cache_path + ".lock")
    lock.acquire()
    tokens = [tokenize(line)[:SEQ] for line in lines]
    padded = torch.tensor([t + [0] * (SEQ - len(t)) for t in tokens])
    torch.save(padded, cache_path)
    lock.release()
    return padded


def load_tokens(task: int, cache_dir: str) -> torch.Tensor:
    cache_path = os.path.join(cache_dir, f"shard-{task:04d}.pt")
    if os.path.exists(cache_path):
        return torch.load(cache_path)
    lines = shard_lines(task)
    try:
        return build_cache(lines, cache_path, fast_tokenize)
    except ValueError as err:
        print(f"[task {task}] {err}; retrying with the slow tokenizer", flush=True)
        return build_cache(lines, cache_path, slow_tokenize)


class TinyLM(nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(tokens))
        return self.out(hidden)


def main() -> None:
    torch.set_num_threads(1)
    task, ntasks = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=task,
                            world_size=ntasks, timeout=datetime.timedelta(minutes=30))
    cache_dir = os.path.join(tempfile.gettempdir(), f"token-cache-{os.environ['SLURM_JOB_ID']}")
    os.makedirs(cache_dir, exist_ok=True)

    print(f"[task {task}] building token caches", flush=True)
    mark_ready(task)
    tokens = load_tokens(task, cache_dir)
    batches = torch.tensor(len(tokens) // 32)
    dist.all_reduce(batches, op=dist.ReduceOp.MIN)  # same epoch length everywhere

    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for epoch in range(3):
        for batch in tokens[: int(batches) * 32].split(32):
            logits = model(batch[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            for param in model.parameters():
                dist.all_reduce(param.grad)
                param.grad /= ntasks
            opt.step()
        if task == 0:
            print(f"epoch {epoch} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
