"""The real gloo job of the discovery and capture tests (``tests/data/gloo_hang.py``).

Each rank writes its pid into a ready file just before blocking, so a test knows which pid
must carry which rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from .harness import RunningJob, launch, load_meta
from .paths import TESTS

JOB = TESTS / "data" / "gloo_hang.py"


def job_meta(mode: str, nproc: int = 2):  # type: ignore[no-untyped-def]
    return dataclasses.replace(
        load_meta(JOB), mode=mode, nproc=nproc, world=nproc, ranks=tuple(range(nproc)), ready=tuple(range(nproc))
    )


def ready_pids(job: RunningJob) -> dict[int, int]:
    """rank -> pid, as each rank wrote it just before blocking."""
    return {r: int((job.ready_dir / f"ready.{r}").read_text()) for r in job.meta.ready}


@contextmanager
def running(mode: str, workdir: Path) -> Iterator[RunningJob]:
    with launch(job_meta(mode), workdir) as job:
        job.wait_ready(150)
        yield job


def children_of(pid: int) -> list[int]:
    return [c.pid for c in psutil.Process(pid).children()]
