"""Records the real flight recorder dumps under tests/data/flight/ (run by hand, not by the
tests): three gloo ranks on CPU (two for the pipeline) with ``TORCH_FR_BUFFER_SIZE`` set,
hung one way each; once hung, every rank writes its own dump (``_dump_fr_trace_json``, what
hangdoc's probe serves; ``size_mismatch`` writes torch's pickle, ``_dump_fr_trace``, under
the file name torch's ``TORCH_FR_DUMP_TEMP_FILE`` default gives) to ``CASE/``, and the
processes are ended.

* ``op_mismatch``: at step 3 rank 0 broadcasts a new learning rate while ranks 1-2
  all_reduce their gradients (same call count: the sequence numbers agree, the ops differ);
* ``behind``: rank 1 skips the loss all_reduce of the last step (its loss was NaN), finishes its
  steps one collective early and waits in a file poll for a checkpoint; ranks 0 and 2 wait
  in the last all_reduce.
* ``drifted_broadcast``: every other step rank 0 broadcasts the learning rate; at step 2
  rank 1 skips it (it reads the schedule from a stale config). Its numbers drift by one at
  once: its step-3 gradient all_reduce is its #5, the others' #5 is the broadcast. Rank 2
  takes the broadcast and goes on to the step-3 all_reduce (its #6); rank 0 waits in the
  broadcast, rank 1 in the all_reduce. Stacks put ranks 1-2 at the all_reduce line and
  blame rank 0; the dumps name rank 1.
* ``drifted_silent``: each step all_reduces two buckets of the same size; at step 2 rank 1
  skips its first bucket (no gradient for it). gloo pairs the calls by number and the sizes
  agree, so nothing fails for three more steps: from #5 on rank 1's numbers are one lower
  than its calls. After the loop rank 1 enters ``barrier`` as its #12 while ranks 0 and 2
  all_reduce their last bucket as #12.
* ``size_mismatch``: every step all_reduces each gradient bucket in one loop; at step 2
  rank 2's bucket of an expert that got no tokens is an empty tensor (``torch.empty(0)``
  where ``zeros_like`` was meant). gloo sends nothing for it, so rank 2's side of #5
  returns at once and it waits in the next bucket (#6), at the same line, while ranks 0-1
  wait for its data in #5. Every rank sits at one line: stacks read a transport hang.
  (A non-empty size mismatch is not a hang in gloo: a rank whose buffer is smaller than
  what a peer sends aborts, "Received data size doesn't match expected size".)
* ``p2p_pipeline``: two pipeline stages; stage 0 runs all forwards first; after two warm-up
  steps stage 1 switches to 1F1B and sends each gradient back at once: both block in
  ``send`` (gloo's send waits for the peer's receive). gloo records no p2p op: the dumps
  hold only the loss all_reduces of the two finished steps (#1-#2), both finished.

    .venv/bin/python tests/data/flight/record.py [CASE ...]
"""

import datetime
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASES = ("op_mismatch", "behind", "drifted_broadcast", "drifted_silent", "size_mismatch", "p2p_pipeline")
PICKLED = {"size_mismatch"}  # torch's pickle, named as TORCH_FR_DUMP_TEMP_FILE's default names it


def world(case: str) -> int:
    return 2 if case == "p2p_pipeline" else 3


def dump_name(case: str, rank: int) -> str:
    return f"nccl_trace_rank_{rank}" if case in PICKLED else f"fr_trace_{rank}.json"


def rank_main(case: str, rank: int, port: int, out: Path) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    import torch
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world(case), timeout=datetime.timedelta(minutes=5))

    def dump_when_hung() -> None:
        time.sleep(8)
        tmp = out / f".{dump_name(case, rank)}"
        raw = c10d._dump_fr_trace(True, False, False) if case in PICKLED else c10d._dump_fr_trace_json(True, True)
        tmp.write_bytes(raw)
        tmp.replace(out / dump_name(case, rank))

    threading.Thread(target=dump_when_hung, daemon=True).start()
    if case in ("op_mismatch", "behind"):
        grads = torch.ones(1000)
        for step in range(5):
            dist.all_reduce(grads)
            if case == "op_mismatch" and step == 3:
                if rank == 0:
                    dist.broadcast(torch.tensor([0.005]), src=0)
                else:
                    dist.all_reduce(grads)
            if case == "behind" and step == 4 and rank == 1:
                continue  # NaN loss: this rank skips the loss all_reduce
            dist.all_reduce(torch.tensor([float(step)]))
    elif case == "drifted_broadcast":
        grads = torch.ones(1000)
        for step in range(6):
            dist.all_reduce(grads)
            if step % 2 == 0 and not (rank == 1 and step == 2):  # rank 1: a stale schedule
                dist.broadcast(torch.tensor([0.1 / (step + 1)]), src=0)
    elif case == "drifted_silent":
        buckets = [torch.ones(4), torch.ones(4)]
        for step in range(6):
            for i, bucket in enumerate(buckets):
                if rank == 1 and step == 2 and i == 0:
                    continue  # no gradient for this bucket on rank 1 this step
                dist.all_reduce(bucket)
        dist.barrier()
    elif case == "size_mismatch":
        sizes = (7, 5, 3)
        for step in range(3):
            buckets = [torch.empty(0) if (rank == 2 and step == 2 and i == 1) else torch.ones(n)
                       for i, n in enumerate(sizes)]
            for bucket in buckets:
                dist.all_reduce(bucket)
    elif case == "p2p_pipeline":
        for step in range(3):
            if rank == 0:  # all forwards, then all backwards
                for mb in range(4):
                    dist.send(torch.full((2, 8), float(mb)), dst=1)
                for _ in range(4):
                    dist.recv(torch.empty(2, 8), src=1)
            elif step < 2:  # the same, mirrored, for the warm-up steps
                inputs = [torch.empty(2, 8) for _ in range(4)]
                for inp in inputs:
                    dist.recv(inp, src=0)
                for inp in inputs:
                    dist.send(inp * 0.5, dst=0)
            else:  # then the last stage switches to 1F1B: each gradient goes back at once
                for _ in range(4):
                    inp = torch.empty(2, 8)
                    dist.recv(inp, src=0)
                    dist.send(inp * 0.5, dst=0)
            dist.all_reduce(torch.tensor([1.0]))  # the step's loss
    while not (out / "checkpoint-done").exists():
        time.sleep(0.5)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] in CASES and sys.argv[2].isdigit():
        rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
        return
    for case in sys.argv[1:] or CASES:
        out = HERE / case
        out.mkdir(exist_ok=True)
        for old in out.iterdir():
            old.unlink()
        port = 29870 + CASES.index(case)
        procs = [subprocess.Popen([sys.executable, __file__, case, str(r), str(port), str(out)])
                 for r in range(world(case))]
        deadline = time.monotonic() + 120
        while len(list(out.iterdir())) < world(case) and time.monotonic() < deadline:
            time.sleep(0.5)
        for p in procs:
            p.kill()
            p.wait()
        print(case, sorted(p.name for p in out.iterdir()))


if __name__ == "__main__":
    main()
