"""Records the real flight recorder dumps under tests/data/flight/ (run by hand, not by the
tests): three gloo ranks on CPU with ``TORCH_FR_BUFFER_SIZE`` set, hung one way each; once
hung, every rank writes its own dump (``_dump_fr_trace_json``, what hangdoc's probe will
serve) to ``CASE/fr_trace_<rank>.json``, and the processes are ended.

* ``op_mismatch``: at step 3 rank 0 broadcasts a new learning rate while ranks 1-2
  all_reduce their gradients (same call count: the sequence numbers agree, the ops differ);
* ``behind``: rank 1 skips the loss all_reduce of the last step (its loss was NaN), finishes its
  steps one collective early and waits in a file poll for a checkpoint; ranks 0 and 2 wait
  in the last all_reduce.

    .venv/bin/python tests/data/flight/record.py
"""

import datetime
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORLD = 3


def rank_main(case: str, rank: int, port: int, out: Path) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    import torch
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(minutes=5))

    def dump_when_hung() -> None:
        time.sleep(8)
        tmp = out / f".fr_trace_{rank}.json"
        tmp.write_bytes(c10d._dump_fr_trace_json(True, True))
        tmp.replace(out / f"fr_trace_{rank}.json")

    threading.Thread(target=dump_when_hung, daemon=True).start()
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
    while not (out / "checkpoint-done").exists():
        time.sleep(0.5)


def main() -> None:
    if len(sys.argv) == 5:
        rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
        return
    for n, case in enumerate(("op_mismatch", "behind")):
        out = HERE / case
        out.mkdir(exist_ok=True)
        for old in out.glob("fr_trace_*.json"):
            old.unlink()
        port = 29870 + n
        procs = [subprocess.Popen([sys.executable, __file__, case, str(r), str(port), str(out)])
                 for r in range(WORLD)]
        deadline = time.monotonic() + 120
        while len(list(out.glob("fr_trace_*.json"))) < WORLD and time.monotonic() < deadline:
            time.sleep(0.5)
        for p in procs:
            p.kill()
            p.wait()
        print(case, sorted(p.name for p in out.glob("fr_trace_*.json")))


if __name__ == "__main__":
    main()
