# hangdoc-expect: verdict=not_hung culprits=none
# hangdoc-launch: mode=torchrun nproc=3 settle=2
"""Healthy HF accelerate loop: gradient accumulation, a short evaluation every epoch.

"A regression head fine-tuned with `Accelerator(cpu=True, gradient_accumulation_steps=4)`
under torchrun. `accelerator.accumulate(model)` skips DDP's gradient all-reduce on three
micro-batches out of four, every batch comes from a tokenizer that takes tens of
milliseconds, and each epoch ends with an evaluation that gathers predictions with
`gather_for_metrics` on every rank and a `wait_for_everyone()` before rank 0 saves the
weights. Slow, bursty and healthy: hangdoc must not call it hung."
"""

import datetime
import os
import tempfile
import time
import warnings

import torch
from _ready import mark_ready
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from torch import nn
from torch.utils.data import DataLoader, Dataset

warnings.filterwarnings("ignore")
WARMUP_STEPS = 3
EPOCHS = 600  # about 15 minutes
TOKENIZE_LATENCY = 0.02  # seconds per batch
SAVE_DIR = os.path.join(tempfile.gettempdir(), "hangdoc-corpus", "accelerate-healthy")


class Reviews(Dataset):
    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 24, generator=gen)
        self.y = self.x[:, :4].sum(dim=1, keepdim=True)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, idx: int):
        return self.x[idx], self.y[idx]


def tokenize(items):
    time.sleep(TOKENIZE_LATENCY)  # stands in for the tokenizer
    xs, ys = zip(*items, strict=False)
    return torch.stack(xs), torch.stack(ys)


def main() -> None:
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4, kwargs_handlers=[
        InitProcessGroupKwargs(backend="gloo", timeout=datetime.timedelta(hours=1))])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 64), nn.GELU(), nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train = DataLoader(Reviews(960, 1), batch_size=8, shuffle=True, collate_fn=tokenize)
    evals = DataLoader(Reviews(100, 2), batch_size=8, collate_fn=tokenize)
    model, opt, train, evals = accelerator.prepare(model, opt, train, evals)

    step = 0
    for _ in range(EPOCHS):
        model.train()
        for x, y in train:
            with accelerator.accumulate(model):
                loss = nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
            step += 1
            if step == WARMUP_STEPS:
                mark_ready(accelerator.process_index)

        model.eval()
        errors = []
        with torch.no_grad():
            for x, y in evals:
                pred, target = accelerator.gather_for_metrics((model(x), y))
                errors.append((pred - target).abs())
        mae = torch.cat(errors).mean().item()
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            os.makedirs(SAVE_DIR, exist_ok=True)
            accelerator.save(accelerator.unwrap_model(model).state_dict(),
                             os.path.join(SAVE_DIR, "model.pt"))
            accelerator.print(f"step {step} eval mae {mae:.4f}")


if __name__ == "__main__":
    main()
