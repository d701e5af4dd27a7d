"""Records the real flight recorder dumps of issue 24 item 7 under tests/data/flight/ (run
by hand, not by the tests), the way ``record.py`` records the others: real gloo ranks on
CPU with ``TORCH_FR_BUFFER_SIZE`` set, hung one way each; once hung, each rank writes its
own dump (``_dump_fr_trace_json``, what hangdoc's probe serves) to ``CASE/``, and the
processes are ended.

* ``unseen_member``: three ranks all_reduce each step; at step 3 rank 2 stalls in its data
  loading (it sleeps) before the step's all_reduce, and its dump is not among the files (its
  node's dumps were not copied). Ranks 0-1 wait in the all_reduce; gloo's ``pg_config``
  lists the default group's ranks [0, 1, 2] under the name ``''`` while the entries name
  the group ``'0'``. Expected: ``straggler``, rank 2 (not seen: low confidence).
* ``gather_never_issued``: three ranks all_reduce gradients and, every step, gather a
  metric to rank 0 then all_reduce the loss; at step 2 rank 2's metric computation fails
  and it waits for a retry (it sleeps) without issuing the gather. Rank 1's side of the
  gather finishes (gloo sends a non-root's part to the root and returns) and it waits in
  the loss all_reduce, the group's newest collective; rank 0 waits in the gather. The
  newest collective alone blames ranks 0 and 2. Expected: ``straggler``, rank 2.
* ``two_groups``: four ranks, group A = [0, 1] (two all_reduces a step), group B = [1, 2, 3]
  (one a step), after a world all_reduce. At step 2 rank 0 stalls in its data loading before
  A's first all_reduce: rank 1 waits in A, ranks 2-3 wait in B, which rank 1 (stuck in A)
  has not called. B's number is the lower: taking one group's finding names rank 1, a
  victim. Expected: ``straggler``, rank 0.
* ``broadcast_root``: three ranks all_reduce gradients and broadcast the parameters each
  step; at step 2 rank 2 reads the broadcast's source from its own config (src=2) while
  ranks 0-1 use src=0. gloo's dump does not record a broadcast's root: every rank issued
  the same broadcast (op, sizes, dtypes); rank 1 received rank 0's data and waits in the
  next all_reduce, ranks 0 and 2 wait in the broadcast. The dumps cannot tell which root is
  wrong. Expected: ``unknown``, no culprits.

    .venv/bin/python tests/data/flight/record_groups.py [CASE ...]
"""

import datetime
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASES = ("unseen_member", "gather_never_issued", "two_groups", "broadcast_root")
WORLD = {"two_groups": 4}
NO_DUMP = {"unseen_member": {2}}  # ranks whose dump is not among the files


def world(case: str) -> int:
    return WORLD.get(case, 3)


def dumped(case: str) -> list[int]:
    return [r for r in range(world(case)) if r not in NO_DUMP.get(case, set())]


def stall(out: Path) -> None:
    """A rank stuck outside torch.distributed (data loading, a retry wait) until the end."""
    while not (out / "checkpoint-done").exists():
        time.sleep(0.5)


def rank_main(case: str, rank: int, port: int, out: Path) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    import torch
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world(case), timeout=datetime.timedelta(minutes=5))

    def dump_when_hung() -> None:
        time.sleep(8)
        if rank in NO_DUMP.get(case, set()):
            return
        name = f"fr_trace_{rank}.json"
        tmp = out / f".{name}"
        tmp.write_bytes(c10d._dump_fr_trace_json(True, True))
        tmp.replace(out / name)

    threading.Thread(target=dump_when_hung, daemon=True).start()
    grads = torch.ones(1000)
    if case == "unseen_member":
        for step in range(5):
            if rank == 2 and step == 3:
                stall(out)
            dist.all_reduce(grads)
    elif case == "gather_never_issued":
        for step in range(4):
            dist.all_reduce(grads)
            metric = torch.tensor([float(step + rank)])
            if rank == 2 and step == 2:
                stall(out)  # the metric failed: wait for a retry that never comes
            dist.gather(metric, [torch.empty(1) for _ in range(3)] if rank == 0 else None, dst=0)
            dist.all_reduce(torch.tensor([1.0]))  # the step's loss
    elif case == "two_groups":
        group_a = dist.new_group([0, 1])
        group_b = dist.new_group([1, 2, 3])
        for step in range(4):
            dist.all_reduce(grads)
            if rank == 0 and step == 2:
                stall(out)
            if rank in (0, 1):
                dist.all_reduce(torch.ones(8), group=group_a)
                dist.all_reduce(torch.ones(16), group=group_a)
            if rank in (1, 2, 3):
                dist.all_reduce(torch.ones(32), group=group_b)
    elif case == "broadcast_root":
        params = torch.ones(64)
        for step in range(4):
            dist.all_reduce(grads)
            dist.broadcast(params, src=2 if (rank == 2 and step == 2) else 0)
            dist.all_reduce(torch.tensor([1.0]))  # the step's loss
    stall(out)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] in CASES and sys.argv[2].isdigit():
        rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
        return
    for case in sys.argv[1:] or CASES:
        out = HERE / case
        out.mkdir(exist_ok=True)
        for old in out.iterdir():
            old.unlink()
        port = 29950 + CASES.index(case)
        procs = [subprocess.Popen([sys.executable, __file__, case, str(r), str(port), str(out)])
                 for r in range(world(case))]
        deadline = time.monotonic() + 120
        while len(list(out.glob("fr_trace_*"))) < len(dumped(case)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for p in procs:
            p.kill()
            p.wait()
        print(case, sorted(p.name for p in out.iterdir()))


if __name__ == "__main__":
    main()
