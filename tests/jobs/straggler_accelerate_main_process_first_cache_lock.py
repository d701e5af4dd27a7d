# hangdoc-expect: verdict=straggler culprits=0
# hangdoc-launch: mode=torchrun nproc=3 settle=2
"""HF accelerate: the main process never leaves `main_process_first()`; a cache lock.

"We tokenise the corpus once per node, the way the accelerate examples do it:
`with accelerator.main_process_first(): data = build_or_load_cache()`. The main process
builds the cache while the others wait in `wait_for_everyone()` on the way in, then load
what it wrote. The cache directory is guarded by a `filelock.FileLock`, because other jobs
on the node share it. Last week we added a background thread on the main process that
warms the page cache with the shard files: it takes the cache lock, then waits on a queue
for the shard names -- which the main thread only sends after it has written the index,
and writing the index takes the lock too. Rank 0 has polled for the lock ever since;
ranks 1 and 2 sit in the barrier of `main_process_first`. No error, no log line."
"""

import datetime
import os
import queue
import tempfile
import threading
import warnings

import torch
from _ready import mark_ready
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from filelock import FileLock
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

warnings.filterwarnings("ignore")
CACHE = os.path.join(tempfile.gettempdir(), "hangdoc-corpus", "token-cache")
SHARDS = 4


def cache_lock() -> FileLock:
    return FileLock(os.path.join(CACHE, ".lock"))


class PageCacheWarmer(threading.Thread):
    """Reads the cached shards once so the first epoch does not wait on the disk."""

    def __init__(self) -> None:
        super().__init__(name="cache-warmer", daemon=True)
        self.names: queue.Queue[str | None] = queue.Queue()

    def run(self) -> None:
        with cache_lock():  # nobody may rewrite the shards while we read them
            while (name := self.names.get()) is not None:
                with open(os.path.join(CACHE, name), "rb") as shard:
                    shard.read()


def tokenize_shard(idx: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(idx)
    return torch.randint(0, 1000, (256, 32), generator=gen)


def build_or_load_cache(warmer: PageCacheWarmer | None) -> TensorDataset:
    names = [f"shard-{i:03d}.pt" for i in range(SHARDS)]
    if warmer is not None:  # main process: build the cache
        os.makedirs(CACHE, exist_ok=True)
        for i, name in enumerate(names):
            torch.save(tokenize_shard(i), os.path.join(CACHE, name))
        mark_ready(0)
        with cache_lock(), open(os.path.join(CACHE, "index.txt"), "w") as index:
            index.write("\n".join(names))  # under the lock: readers never see half an index
        for name in names:
            warmer.names.put(name)
        warmer.names.put(None)
    tokens = torch.cat([torch.load(os.path.join(CACHE, n)) for n in names])
    return TensorDataset(tokens[:, :-1], tokens[:, -1] % 2)


def main() -> None:
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True, kwargs_handlers=[
        InitProcessGroupKwargs(backend="gloo", timeout=datetime.timedelta(hours=2))])
    warmer = None
    if accelerator.is_main_process:
        warmer = PageCacheWarmer()
        os.makedirs(CACHE, exist_ok=True)
        warmer.start()
    else:
        mark_ready(accelerator.process_index)
    with accelerator.main_process_first():
        data = build_or_load_cache(warmer)

    model = nn.Sequential(nn.Embedding(1000, 32), nn.Flatten(), nn.Linear(31 * 32, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(data, batch_size=32, shuffle=True)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
