"""Records five more real flight recorder dumps of issue 24 item 7 under tests/data/flight/
(run by hand, not by the tests), the way ``record_groups.py`` records the others: real gloo
ranks on CPU with ``TORCH_FR_BUFFER_SIZE`` set, hung one way each; once hung, each rank
writes its own dump (``_dump_fr_trace_json``, what hangdoc's probe serves) to ``CASE/``, and
every rank's process group is killed, on failure too.

* ``subgroup_skip``: six ranks, expert groups {0,1,2} and {3,4,5} (``new_group``); each step
  all_reduces the expert gradients on the rank's expert group, then the dense gradients on
  WORLD. At step 2 no token is routed to rank 5's experts: it skips its expert all_reduce
  and goes to the WORLD all_reduce, with ranks 0-2 (who finished theirs). Ranks 3-4 wait in
  the expert all_reduce for rank 5; ranks 0-2 and 5 wait in WORLD's for ranks 3-4. The waits
  close a cycle (3-4 wait for 5, 5 waits for 3-4), but the members of both groups disagree
  on their order two to one: ranks 3-4 called the expert group's collective first, as every
  earlier step did, rank 5 WORLD's. Expected: ``collective_mismatch``, rank 5 (not ranks
  3-4, whom WORLD's collective alone names; with two-rank expert groups the order would be
  a tie, and an added call on one rank would leave the same dumps as a skipped call on the
  other).
* ``order_inversion``: two ranks and two groups over both, ``dp`` (gradients) and
  ``stats`` (metrics); each step reduces on both in the order its buffers became ready. At
  step 2 rank 1's metrics are ready first: rank 0 calls dp then stats, rank 1 stats then
  dp. Each waits in one group for the other, which waits in the other group. A code bug
  (the order must not depend on timing) that two ranks alone cannot pin on one of them.
  Expected: ``collective_mismatch``, ranks 0 and 1.
* ``object_collective_skip``: three ranks all_reduce gradients each step and, every other
  step, all_gather_object their eval metrics (torch issues two collectives for it: an
  all_gather of the pickled sizes, then one of the bytes). At step 2 rank 2's eval shard is
  empty and it skips the call (``if metrics:``), going on to step 3's all_reduce while ranks
  0-1 wait in the sizes' all_gather. Expected: ``collective_mismatch``, rank 2.
* ``extra_barrier``: three ranks all_reduce gradients each step; after step 1 rank 0 saves
  a checkpoint and, inside its ``if rank == 0:``, calls ``dist.barrier()`` to wait for the
  write. Ranks 1-2 go on to step 2's all_reduce. Expected: ``collective_mismatch``, rank 0.
* ``all_to_all_skip``: four ranks, a mixture-of-experts layer: each step dispatches tokens
  with all_to_all_single, combines them with another, then all_reduces the gradients. At
  step 2 rank 1's batch routes no tokens and its code skips both exchanges (``if
  tokens.numel():``), going to the gradient all_reduce while ranks 0, 2, 3 wait in the
  dispatch. Expected: ``collective_mismatch``, rank 1.

Not recorded: a rank that raises and exits. gloo does not hang on it: its sockets close and
the peers' pending ops fail at once ("Connection closed by peer").

    .venv/bin/python tests/data/flight/record_more.py [CASE ...]
"""

import datetime
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASES = ("subgroup_skip", "order_inversion", "object_collective_skip", "extra_barrier", "all_to_all_skip")
WORLD = {"subgroup_skip": 6, "order_inversion": 2, "all_to_all_skip": 4}


def world(case: str) -> int:
    return WORLD.get(case, 3)


def stall(out: Path) -> None:
    """Stay alive (the hung collective runs in torch) until the recorder ends the job."""
    while not (out / "checkpoint-done").exists():
        time.sleep(0.5)


def rank_main(case: str, rank: int, port: int, out: Path) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = "200"
    import torch
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world(case), timeout=datetime.timedelta(minutes=5))

    def dump_when_hung() -> None:
        time.sleep(8)
        name = f"fr_trace_{rank}.json"
        tmp = out / f".{name}"
        tmp.write_bytes(c10d._dump_fr_trace_json(True, True))
        tmp.replace(out / name)

    threading.Thread(target=dump_when_hung, daemon=True).start()
    grads = torch.ones(1000)
    if case == "subgroup_skip":
        experts = [dist.new_group([0, 1, 2]), dist.new_group([3, 4, 5])]
        mine = experts[rank // 3]
        for step in range(4):
            routed = not (rank == 5 and step == 2)  # no token reached rank 5's experts
            if routed:
                dist.all_reduce(torch.ones(256), group=mine)
            dist.all_reduce(grads)
    elif case == "order_inversion":
        dp, stats = dist.new_group([0, 1]), dist.new_group([0, 1])
        for step in range(4):
            ready = [(dp, torch.ones(1000)), (stats, torch.ones(4))]
            if rank == 1 and step == 2:
                ready.reverse()  # its metrics were ready first this step
            for group, buf in ready:
                dist.all_reduce(buf, group=group)
    elif case == "object_collective_skip":
        for step in range(5):
            dist.all_reduce(grads)
            if step % 2 == 0:
                metrics = {} if (rank == 2 and step == 2) else {"loss": 1.0 / (step + 1), "rank": rank}
                if metrics:  # an empty eval shard: nothing to report
                    gathered: list[object] = [None] * world(case)
                    dist.all_gather_object(gathered, metrics)
    elif case == "extra_barrier":
        for step in range(4):
            dist.all_reduce(grads)
            if step == 1 and rank == 0:
                (out / ".ckpt").write_bytes(b"weights")
                dist.barrier()  # wait for the write: only rank 0 gets here
    elif case == "all_to_all_skip":
        for step in range(4):
            tokens = torch.empty(0) if (rank == 1 and step == 2) else torch.ones(4 * 8)
            if tokens.numel():
                dispatched = torch.empty_like(tokens)
                dist.all_to_all_single(dispatched, tokens)
                combined = torch.empty_like(tokens)
                dist.all_to_all_single(combined, dispatched * 2)
            dist.all_reduce(grads)
    stall(out)


def record(case: str) -> None:
    out = HERE / case
    out.mkdir(exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    port = 29990 + CASES.index(case)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for r in range(world(case)):
            # each rank leads its own process group: killed whole, children included
            procs.append(subprocess.Popen([sys.executable, __file__, case, str(r), str(port), str(out)],
                                          start_new_session=True))
        deadline = time.monotonic() + 120
        while len(list(out.glob("fr_trace_*"))) < world(case) and time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                break  # a rank exited: not the hang this case is about
            time.sleep(0.5)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        for stray in out.glob(".*"):
            stray.unlink()
    print(case, [p.returncode for p in procs], sorted(p.name for p in out.iterdir()))


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] in CASES and sys.argv[2].isdigit():
        rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
        return
    for case in sys.argv[1:] or CASES:
        record(case)


if __name__ == "__main__":
    main()
