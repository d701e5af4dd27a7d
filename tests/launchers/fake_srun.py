"""A Slurm-style task launcher for tests: ``fake_srun.py -n N COMMAND...``.

Starts N copies of COMMAND the way ``srun`` inside an ``sbatch`` allocation does on one
node: each task sees only the ``SLURM_*`` variables (no ``RANK``/``WORLD_SIZE``/
``LOCAL_RANK``), plus whatever the caller exported (``MASTER_ADDR``/``MASTER_PORT``, as an
sbatch script would). Like srun without ``--kill-on-bad-exit``, a task that fails is
reported on stderr and the others keep running; srun exits when every task has exited,
with the highest exit code. SIGTERM/SIGINT are forwarded to the tasks.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

# Variables a torch launcher would have set; a Slurm task never sees them.
_LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "NODE_RANK",
    "TORCHELASTIC_RUN_ID",
)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fake_srun", description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--ntasks", type=int, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if not args.command:
        parser.error("no command given")
    return args


def _task_env(procid: int, ntasks: int, job_id: str, node: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
    env.update(
        SLURM_PROCID=str(procid),
        SLURM_LOCALID=str(procid),
        SLURM_NTASKS=str(ntasks),
        SLURM_JOB_ID=job_id,
        SLURM_STEP_ID="0",
        SLURM_NODEID="0",
        SLURM_NNODES="1",
        SLURM_JOB_NODELIST=node,
        SLURMD_NODENAME=node,
    )
    return env


def _forward(tasks: list[subprocess.Popen]) -> None:
    def handler(signum: int, _frame: object) -> None:
        for task in tasks:
            if task.poll() is None:
                task.send_signal(signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _wait_all(tasks: list[subprocess.Popen]) -> int:
    pending = dict(enumerate(tasks))
    worst = 0
    while pending:
        for procid, task in list(pending.items()):
            code = task.poll()
            if code is None:
                continue
            del pending[procid]
            if code != 0:
                print(f"srun: error: task {procid}: Exited with exit code {code}", file=sys.stderr, flush=True)
                worst = max(worst, code if code > 0 else 128 - code)
        time.sleep(0.2)
    return worst


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    job_id = os.environ.get("SLURM_JOB_ID", str(100000 + os.getpid()))
    node = socket.gethostname().split(".")[0]
    tasks = [subprocess.Popen(args.command, env=_task_env(i, args.ntasks, job_id, node)) for i in range(args.ntasks)]
    _forward(tasks)
    return _wait_all(tasks)


if __name__ == "__main__":
    sys.exit(main())
