"""Hand-built process tables for the discovery rules: what ``/proc`` would show."""

from __future__ import annotations

import os

from hangdoc.capture.find.processes import ProcessTable, ProcInfo

PY = "/usr/bin/python3"
SPAWN = (
    PY,
    "-c",
    ("from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=4, pipe_handle=6)"),
    "--multiprocessing-fork",
)
TRACKER = (PY, "-c", "from multiprocessing.resource_tracker import main;main(3)")
TORCHRUN = (PY, "/venv/bin/torchrun", "--nproc-per-node", "2", "train.py")


def proc(
    pid: int,
    ppid: int,
    cmdline: tuple[str, ...],
    env: dict[str, str] | None = None,
    t: float = 0.0,
    uid: int | None = None,
) -> ProcInfo:
    return ProcInfo(
        pid=pid,
        ppid=ppid,
        name=os.path.basename(cmdline[0]),
        exe=cmdline[0],
        cmdline=cmdline,
        create_time=t,
        env=env if env is not None else {},
        uid=uid,
    )


def table(*procs: ProcInfo) -> ProcessTable:
    return ProcessTable({p.pid: p for p in procs})
