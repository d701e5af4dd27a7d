# hangdoc-expect: verdict=straggler culprits=3
# hangdoc-launch: mode=torchrun nproc=4
"""Two-stage pipeline, two data-parallel replicas: the last stage of replica 1 polls for a
label shard that was never published, and every other rank waits in a different place.

"Ranks 0-1 run stage 0 (the encoder), ranks 2-3 stage 1 (the head and the loss); rank r
of stage 0 feeds rank r+2 with send/recv, and each stage averages its gradients over its
own data-parallel group (new_group([0, 1]) and new_group([2, 3])) through the same
sync_grads() helper. The last stage reads its targets from label shards that the
labelling pipeline publishes epoch by epoch; the loader waits for a missing shard instead
of failing, because the labeller is usually only a few seconds late. At epoch 1 the shard
for replica 1 never came (its labelling task had crashed). Rank 3 slept in the wait loop;
rank 1 blocked sending its activations to rank 3; rank 0 finished the step with rank 2 and
waited in the stage-0 gradient all_reduce for rank 1; rank 2 waited in the stage-1
gradient all_reduce for rank 3. Three ranks in three different places, none of them the
problem."

Truth: a straggler -- rank 3 is in no collective (sleeping in its retry loop); ranks 0-2
all wait, directly or through rank 1, for rank 3.
"""

import datetime
import os
import tempfile
import time

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

FEATURES, HIDDEN, CLASSES = 16, 32, 4
BATCH, MICRO_BATCHES = 32, 2
STEPS_PER_EPOCH = 3


def label_path(root: str, epoch: int, replica: int) -> str:
    return os.path.join(root, f"epoch-{epoch:03d}", f"replica-{replica}.pt")


def publish_labels(root: str) -> None:
    """Stand-in for the labelling pipeline: epoch 0 for both replicas, epoch 1 only for
    replica 0 so far (replica 1's task crashed)."""
    gen = torch.Generator().manual_seed(0)
    for epoch, replica in [(0, 0), (0, 1), (1, 0)]:
        os.makedirs(os.path.dirname(label_path(root, epoch, replica)), exist_ok=True)
        labels = torch.randint(0, CLASSES, (STEPS_PER_EPOCH * BATCH,), generator=gen)
        torch.save(labels, label_path(root, epoch, replica))


def wait_for_labels(root: str, epoch: int, replica: int, poll_s: float = 0.5) -> torch.Tensor:
    """The labeller is usually a little behind: wait for the shard rather than fail."""
    path = label_path(root, epoch, replica)
    waited = 0.0
    while not os.path.exists(path):
        if waited % 30 == 0:
            print(f"[replica {replica}] waiting for {path}", flush=True)
        time.sleep(poll_s)
        waited += poll_s
    return torch.load(path)


def sync_grads(model: nn.Module, group: dist.ProcessGroup) -> None:
    size = dist.get_world_size(group)
    for param in model.parameters():
        dist.all_reduce(param.grad, group=group)
        param.grad /= size


def stage0_step(model: nn.Module, x: torch.Tensor, peer: int) -> None:
    """GPipe order: all forwards (activations to the next stage), then all backwards."""
    outs = []
    for mb in x.chunk(MICRO_BATCHES):
        out = model(mb)
        dist.send(out.detach(), dst=peer)
        outs.append(out)
    for out in outs:
        grad = torch.empty_like(out)
        dist.recv(grad, src=peer)
        out.backward(grad)


def stage1_step(model: nn.Module, targets: torch.Tensor, peer: int) -> float:
    """The same GPipe order: receive every micro-batch, then send every gradient back."""
    acts = []
    for target in targets.chunk(MICRO_BATCHES):
        act = torch.empty(target.shape[0], HIDDEN)
        dist.recv(act, src=peer)
        acts.append(act.requires_grad_())
    total = 0.0
    for act, target in zip(acts, targets.chunk(MICRO_BATCHES), strict=False):
        loss = nn.functional.cross_entropy(model(act), target)
        loss.backward()
        dist.send(act.grad, dst=peer)
        total += loss.item()
    return total / MICRO_BATCHES


def main() -> None:
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    stage, replica = divmod(rank, 2)
    stage_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates both
    dp_group = stage_groups[stage]
    peer = rank + 2 if stage == 0 else rank - 2
    label_root = os.path.join(tempfile.gettempdir(), f"pp-labels-{os.environ['MASTER_PORT']}")
    if rank == 0:
        publish_labels(label_root)
    dist.barrier()

    torch.manual_seed(stage)
    if stage == 0:
        model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN))
    else:
        model = nn.Sequential(nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, CLASSES))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    for epoch in range(100):
        if epoch == 1:
            mark_ready(rank)
        if stage == 1:
            labels = wait_for_labels(label_root, epoch, replica)
        gen = torch.Generator().manual_seed(1000 * epoch + replica)
        for step in range(STEPS_PER_EPOCH):
            opt.zero_grad()
            if stage == 0:
                stage0_step(model, torch.randn(BATCH, FEATURES, generator=gen), peer)
            else:
                loss = stage1_step(model, labels[step * BATCH:(step + 1) * BATCH], peer)
            sync_grads(model, dp_group)
            opt.step()
        if stage == 1 and replica == 0:
            print(f"epoch {epoch} loss {loss:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
