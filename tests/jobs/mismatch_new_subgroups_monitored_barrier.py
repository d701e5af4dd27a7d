# hangdoc-expect: verdict=collective_mismatch culprits=3
# hangdoc-launch: mode=torchrun nproc=4
"""Two-level gradient all-reduce over dist.new_subgroups() groups; rank 3 skipped a step on
a NaN loss, so it reaches the pre-checkpoint monitored_barrier on the default group one
step early, while ranks 0-2 wait in the subgroup all_reduces of the last step.

"We train an audio tagger on 2 nodes x 2 ranks. Gradients are averaged in two levels:
an all_reduce inside the node (dist.new_subgroups(group_size=2): ranks 0-1 and 2-3), then
one across nodes between ranks with the same local rank
(dist.new_subgroups_by_enumeration([[0, 2], [1, 3]])), so only one rank per node talks
over the slow link at a time. Before every checkpoint we call dist.monitored_barrier() on
the default group, to get a message naming the rank that does not show up -- with the
same 30-minute timeout as everything else. Each clip's features are standardised per
clip; a silent clip has a standard deviation of 0, so its features -- and the loss --
came out NaN on rank 3 at step 3. The training loop's guard `if not torch.isfinite(loss):
continue` is local: rank 3 skipped the step's two all_reduces, everybody else did not, so
from then on rank 3's all_reduces paired with the others' previous step. At step 7 rank 3
went on to the checkpoint's monitored_barrier, while rank 2 waits for it in the in-node
all_reduce, rank 0 for rank 2 in the cross-node all_reduce, and rank 1 for rank 3 in its
cross-node all_reduce."

Truth: a collective mismatch and rank 3 is the culprit. Ranks 0-2 are all inside the
two-level reduction, in collectives on subgroups that contain rank 3 or wait on one that
does; rank 3 alone has left that structure for a collective on the default group
(monitored_barrier, whose peers are every rank). Unlike a rank stranded in a subgroup op,
nothing here hides who skipped: the rank on the world group is the odd one out.
"""

import datetime
import os

import torch
import torch.distributed as dist
from _ready import mark_ready
from torch import nn

NODE_SIZE = 2
CKPT_EVERY = 8
MELS, FRAMES, TAGS = 32, 20, 8
TIMEOUT = datetime.timedelta(minutes=30)


def clip_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 * step + rank)
    clips = torch.randn(16, MELS, FRAMES, generator=gen).abs()
    tags = (torch.rand(16, TAGS, generator=gen) > 0.7).float()
    if rank == 3 and step == 3:
        clips[9] = 0.0  # a silent clip: the recorder was muted
    return clips, tags


def standardise(clips: torch.Tensor) -> torch.Tensor:
    """Per-clip standardisation of the log-mel features."""
    logmel = torch.log1p(clips)
    mean = logmel.mean(dim=(1, 2), keepdim=True)
    std = logmel.std(dim=(1, 2), keepdim=True)
    return (logmel - mean) / std  # 0 / 0 for a silent clip


def average_gradients(model: nn.Module, node_group, cross_group, world: int) -> None:
    for p in model.parameters():
        dist.all_reduce(p.grad, group=node_group)  # inside the node
        dist.all_reduce(p.grad, group=cross_group)  # across nodes, same local rank
        p.grad /= world


def main() -> None:
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=TIMEOUT)
    node_group, _ = dist.new_subgroups(group_size=NODE_SIZE, timeout=TIMEOUT)
    cross_group, _ = dist.new_subgroups_by_enumeration(
        [list(range(local, world, NODE_SIZE)) for local in range(NODE_SIZE)], timeout=TIMEOUT)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(MELS * FRAMES, 128), nn.ReLU(),
                          nn.Linear(128, TAGS))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(10_000):
        clips, tags = clip_batch(rank, step)
        loss = nn.functional.binary_cross_entropy_with_logits(model(standardise(clips)), tags)
        if not torch.isfinite(loss):
            print(f"rank {rank}: non-finite loss at step {step}, skipping the batch", flush=True)
            continue
        opt.zero_grad()
        loss.backward()
        if step == CKPT_EVERY - 1:
            mark_ready(rank)
        average_gradients(model, node_group, cross_group, world)
        opt.step()
        if (step + 1) % CKPT_EVERY == 0:
            mark_ready(rank)
            dist.monitored_barrier(timeout=TIMEOUT, wait_all_ranks=True)
            if rank == 0:
                torch.save(model.state_dict(), os.devnull)  # the checkpoint, in the real job
                print(f"step {step} loss {loss.item():.4f} checkpointed", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
