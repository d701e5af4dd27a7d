"""What one node offers the coordinator: find a job's ranks there, and sample them.

The embedded ``LocalNode`` does both in-process (``discover`` and ``sample_round``); a
remote agent offers the same two calls over gRPC. The coordinator and the analysis never
know which one answered.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Protocol

from .capture import sample_round
from .discover import Discovery, discover
from .jobspec import JobSpec
from .model import RankProcess, Sample, SourceFile, ThreadStack
from .source import collect_sources


class Node(Protocol):
    """A node of the job, local or behind an agent."""

    @property
    def name(self) -> str: ...

    def find_ranks(self, spec: JobSpec) -> Discovery:
        """The job's rank processes on this node. Raises ``JobNotFound`` when there are none."""
        ...

    def sample(
        self, procs: Sequence[RankProcess], t: float, *, native: bool, timeout: float
    ) -> list[Sample]:
        """One sample of each of ``procs`` (all on this node), in order."""
        ...

    def sources(self, threads: Sequence[ThreadStack]) -> tuple[SourceFile, ...]:
        """The source lines around these threads' user frames, read on this node."""
        ...


class LocalNode:
    """This machine, read directly: the default when no agents are given."""

    def __init__(self, host: str | None = None) -> None:
        self._host = host or socket.gethostname()

    @property
    def name(self) -> str:
        return self._host

    def find_ranks(self, spec: JobSpec) -> Discovery:
        return discover(spec, host=self._host)

    def sample(
        self, procs: Sequence[RankProcess], t: float, *, native: bool, timeout: float
    ) -> list[Sample]:
        return sample_round(procs, t, native=native, timeout=timeout)

    def sources(self, threads: Sequence[ThreadStack]) -> tuple[SourceFile, ...]:
        return collect_sources(threads)
