# hangdoc-expect: verdict=collective_mismatch culprits=0
# hangdoc-launch: mode=torchrun nproc=3 settle=2
"""HF accelerate: `gather_for_metrics` moved under `if accelerator.is_main_process:`.

"Our fine-tuning script is a plain accelerate loop (`Accelerator(cpu=True)`, launched by
torchrun). The evaluation used to gather predictions on every rank and compute the accuracy
on every rank. Somebody 'optimised' it: since only the main process writes the eval report,
the gather and the metric moved into the `if accelerator.is_main_process:` block that
writes the report. After the first evaluation, rank 0 waited in the all_gather of
`gather_for_metrics` and ranks 1 and 2 went on to the next epoch, where the prepared
DataLoader first broadcasts rank 0's shuffling seed from `synchronize_rng_states`. No
error: accelerate's default timeout is 30 minutes and we had raised it."
"""

import datetime
import json
import os
import tempfile
import warnings

import torch
from _ready import mark_ready
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

warnings.filterwarnings("ignore")
REPORT = os.path.join(tempfile.gettempdir(), "hangdoc-corpus", "accelerate-eval.jsonl")


def make_data(n: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=gen)
    y = (x[:, :3].sum(dim=1) > 0).long()
    return TensorDataset(x, y)


def main() -> None:
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True, kwargs_handlers=[
        InitProcessGroupKwargs(backend="gloo", timeout=datetime.timedelta(hours=2))])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.GELU(), nn.Linear(64, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    train = DataLoader(make_data(384, 1), batch_size=16, shuffle=True)
    evals = DataLoader(make_data(96, 2), batch_size=16)
    model, opt, train, evals = accelerator.prepare(model, opt, train, evals)

    for epoch in range(10):
        model.train()
        for x, y in train:
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()

        model.eval()
        preds, labels = [], []
        with torch.no_grad():
            for x, y in evals:
                preds.append(model(x).argmax(dim=1))
                labels.append(y)
        preds, labels = torch.cat(preds), torch.cat(labels)
        mark_ready(accelerator.process_index)
        if accelerator.is_main_process:
            # only the main process writes the report, so only it needs the global numbers
            preds, labels = accelerator.gather_for_metrics((preds, labels))
            acc = (preds == labels).float().mean().item()
            os.makedirs(os.path.dirname(REPORT), exist_ok=True)
            with open(REPORT, "a") as out:
                out.write(json.dumps({"epoch": epoch, "acc": acc, "n": len(labels)}) + "\n")


if __name__ == "__main__":
    main()
