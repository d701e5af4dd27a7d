"""What makes two hangs "the same bug", as a short stable key.

A fingerprint is made of the verdict and, for each role (the culprits, the ranks that wait
for them), where in the job's code the ranks stand: the innermost frame of the job's own
code, and what it is in there (the distributed op, or the call a blocked rank is stuck in);
and where the wait ends when the diagnosis followed it past the ranks (``RootCause``).
Rank numbers, pids, hosts, line numbers and the directory a job was checked out in never
enter it: the same bug in another job, or with other culprit ranks, has the same key.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..model import (
    GRAPH_CODE,
    Diagnosis,
    Frame,
    Origin,
    RankAnalysis,
    RankState,
    RootCause,
    StackGroup,
    frame_origin,
)

KEY_CHARS = 16
# ranks whose place nobody saw: not part of the bug, unless they are its culprits
_UNSEEN = (RankState.UNKNOWN, RankState.UNREADABLE)
# off CPU and outside any op: the call its code is stuck in is part of the bug (a rank
# that computes is somewhere else in every sample)
_STUCK = (RankState.BLOCKED, RankState.STOPPED)


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """``key``: the first hex digits of the sha256 of ``parts``, the facts it is made of."""

    key: str
    parts: tuple[str, ...]


def fingerprint(diagnosis: Diagnosis) -> Fingerprint:
    culprits = set(diagnosis.culprit_ranks)
    stacks = {g.group_id: g for g in diagnosis.groups}
    places: dict[tuple[int, int | None, RankState], str] = {}  # ranks share ops and stacks
    found: set[str] = set()
    for ra in diagnosis.ranks:
        culprit = ra.rank in culprits
        if culprit or ra.state not in _UNSEEN:
            shared = (id(ra.op), ra.group_id, ra.state)
            place = places.get(shared)
            if place is None:
                place = places[shared] = _place(ra, stacks)
            found.add(f"{'culprit' if culprit else 'waiter'} {place}")
    if diagnosis.root_cause is not None:
        found.update(_root(diagnosis.root_cause))
    parts = (f"verdict {diagnosis.verdict.value}", *sorted(found))
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    return Fingerprint(digest[:KEY_CHARS], parts)


def _place(ra: RankAnalysis, stacks: dict[int, StackGroup]) -> str:
    """``all_reduce at proj/train.py:train_step``; outside any op ``- at …``, with ``in
    queue.py:Queue.get`` when stuck in a call; the state where no frame places the rank."""
    op = ra.op
    # an op's place is in the frames that issued it, not in the stack below it (hooks
    # torch calls back)
    python: list[Frame]
    if op is not None and op.path:
        python = list(op.path)
    elif op is not None and op.call_site is not None:
        python = [op.call_site]
    else:
        group = stacks.get(ra.group_id) if ra.group_id is not None else None
        python = [f for f in group.stack if not f.native] if group is not None else []
    if not python:
        return op.name if op is not None else ra.state.value
    at = _job_frame(python)
    where = f"{op.name if op is not None else '-'} at {_named(python[at])}"
    if op is None and ra.state in _STUCK and at + 1 < len(python):
        where += f" in {_named(python[at + 1])}"
    return where


def _job_frame(python: Sequence[Frame]) -> int:
    """The index of the innermost frame of the job's own code, else of the innermost frame."""
    for i in range(len(python) - 1, -1, -1):
        if python[i].origin.kind is Origin.USER:
            return i
    return len(python) - 1


def _named(frame: Frame) -> str:
    return f"{_file(frame.filename)}:{frame.function}"


def _file(filename: str) -> str:
    """``filename`` wherever the job or its Python was installed: the path inside the
    installation for torch, libraries and the standard library (``torch/distributed/
    distributed_c10d.py``, ``threading.py``), else its last two components
    (``proj/model.py``)."""
    path = filename.replace("\\", "/")
    if path.startswith(GRAPH_CODE):
        return GRAPH_CODE  # ``<eval_with_key>.3``: the number counts graphs, not code
    origin = frame_origin(path)
    if origin.kind in (Origin.TORCH, Origin.LIBRARY, Origin.STDLIB):
        return origin.module_path
    if origin.kind is Origin.INTERNAL:
        return path
    return "/".join([p for p in path.split("/") if p][-2:])


def _root(root: RootCause) -> Iterator[str]:
    if root.frame is not None:
        yield f"root at {_named(root.frame)}"
    command = root.chain[-1].command if root.chain else ()
    if command:
        yield f"root runs {_program(command)}"


def _program(command: Sequence[str]) -> str:
    """What a command runs, without its arguments (ports, temporary paths): the program,
    and for an interpreter the script or module it runs."""
    name = os.path.basename(command[0].replace("\\", "/"))
    if not name.startswith("python"):
        return name
    name = "python"  # python3.11, python3: the same interpreter to the job
    if len(command) > 2 and command[1] == "-m":
        return f"{name} -m {command[2]}"
    if len(command) > 1 and not command[1].startswith("-"):
        return f"{name} {_file(command[1])}"
    return name
