# hangdoc-expect: verdict=straggler culprits=2
# hangdoc-launch: mode=torchrun nproc=3
"""Image classifier stuck at step 3 because of one thumbnail in rank 2's shard.

"We replaced torchvision's RandomResizedCrop with our own version to get the crop boxes
for logging, and dropped the 10-attempts-then-center-crop fallback because 'it never
triggers'. Rank 2's shard has an 8x8 thumbnail that no crop of at least 16 pixels fits
into, so that rank spins in the retry loop at 100% CPU while ranks 0 and 1 wait in the
gradient all_reduce."
"""

import datetime
import math
import os

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn
from torch.utils.data import DataLoader, Dataset

BATCH = 8
WARMUP_STEPS = 3
CROP = 16


class ShardImages(Dataset):
    """Synthetic images of varying size; rank 2's shard contains one tiny thumbnail."""

    def __init__(self, rank: int, count: int = 256) -> None:
        gen = torch.Generator().manual_seed(100 + rank)
        self.sizes = [(int(h), int(w)) for h, w in torch.randint(24, 48, (count, 2), generator=gen)]
        if rank == 2:
            self.sizes[WARMUP_STEPS * BATCH + 5] = (8, 8)
        self.labels = torch.randint(0, 10, (count,), generator=gen)
        self.seed = rank

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        h, w = self.sizes[index]
        gen = torch.Generator().manual_seed(self.seed * 100_000 + index)
        image = torch.rand(3, h, w, generator=gen)
        return random_resized_crop(image, CROP), self.labels[index]


def random_resized_crop(image: torch.Tensor, size: int,
                        scale: tuple[float, float] = (0.3, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> torch.Tensor:
    _, height, width = image.shape
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    while True:
        target_area = area * torch.empty(1).uniform_(*scale).item()
        aspect = math.exp(torch.empty(1).uniform_(*log_ratio).item())
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if size <= w <= width and size <= h <= height:
            top = torch.randint(0, height - h + 1, (1,)).item()
            left = torch.randint(0, width - w + 1, (1,)).item()
            crop = image[:, top:top + h, left:left + w]
            return nn.functional.interpolate(crop[None], size=(size, size),
                                             mode="bilinear", align_corners=False)[0]


class SmallConvNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def sync_grads(model: nn.Module, world_size: int) -> None:
    for param in model.parameters():
        dist.all_reduce(param.grad)
        param.grad.div_(world_size)


def main() -> None:
    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    torch.manual_seed(0)
    model = SmallConvNet()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(ShardImages(rank), batch_size=BATCH, shuffle=False)

    batches = iter(loader)
    for step in range(len(loader)):
        if step == WARMUP_STEPS:
            mark_ready(rank)
        images, labels = next(batches)
        loss = nn.functional.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        sync_grads(model, world_size)
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
