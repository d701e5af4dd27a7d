"""A recorded snapshot as if the job had been checked out somewhere else."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hangdoc.model import Frame, JobSnapshot, Origin, RankSnapshot, SourceFile, frame_origin


def moved_under(snapshot: JobSnapshot, root: str) -> JobSnapshot:
    """``snapshot`` with the job's own files (frames and source lines) under ``root``."""

    def move(name: str) -> str:
        return f"{root}/{Path(name).name}" if frame_origin(name).kind is Origin.USER else name

    def frames(stack: tuple[Frame, ...]) -> tuple[Frame, ...]:
        return tuple(f if f.native else dataclasses.replace(f, filename=move(f.filename)) for f in stack)

    ranks = tuple(
        RankSnapshot(
            r.process,
            tuple(
                dataclasses.replace(
                    s, threads=tuple(dataclasses.replace(t, frames=frames(t.frames)) for t in s.threads)
                )
                for s in r.samples
            ),
        )
        for r in snapshot.ranks
    )
    sources = tuple(SourceFile(move(s.filename), s.lines) for s in snapshot.sources)
    return dataclasses.replace(snapshot, ranks=ranks, sources=sources)
