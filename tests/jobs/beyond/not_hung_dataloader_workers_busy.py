# hangdoc-expect: verdict=not_hung culprits=none
# hangdoc-launch: mode=direct nproc=2
# hangdoc-root: none
"""Healthy, input-bound: two DataLoader workers per rank augment every sample on the CPU.

"Nothing is wrong with this one. Each sample is read from the local cache (a few ms)
and augmented on the fly (random masks and a blur of a small spectrogram, a millisecond
or two of CPU) by two DataLoader workers per rank. The model is tiny, so each rank
mostly waits for its next batch from the workers and then for the gradient all_reduce;
the workers are always busy, and a batch comes every few tens of milliseconds."
"""

import datetime
import os
import time

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn
from torch.utils.data import DataLoader, Dataset

BINS, FRAMES = 32, 64
CLASSES = 4
WARMUP_STEPS = 3
READ_SECONDS = 0.004


class Spectrograms(Dataset):
    """Synthetic spectrograms of four tones, augmented on the fly."""

    def __init__(self, rank: int, size: int = 512) -> None:
        self.rank = rank
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(READ_SECONDS)  # the clip from the local cache
        gen = torch.Generator().manual_seed(self.rank * 100_000 + index)
        label = index % CLASSES
        spec = 0.1 * torch.randn(BINS, FRAMES, generator=gen)
        spec[4 + 6 * label] += 1.0
        for _ in range(8):  # SpecAugment-style masks and a blur: the CPU work per sample
            start = int(torch.randint(0, FRAMES - 8, (1,), generator=gen))
            spec[:, start:start + 4] *= 0.5
            spec = 0.5 * spec + 0.25 * (spec.roll(1, dims=1) + spec.roll(-1, dims=1))
            spec = spec + 0.01 * torch.randn(BINS, FRAMES, generator=gen)
        return spec.mean(dim=1), label


def main() -> None:
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(BINS, 16), nn.ReLU(), nn.Linear(16, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Spectrograms(rank), batch_size=16, shuffle=True, num_workers=2,
                        persistent_workers=True)

    step = 0
    epoch = 0
    while True:
        for x, y in loader:
            if step == WARMUP_STEPS:
                mark_ready(rank)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            for param in model.parameters():
                dist.all_reduce(param.grad)
                param.grad /= world_size
            opt.step()
            step += 1
        if rank == 0:
            print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
        epoch += 1


if __name__ == "__main__":
    main()
