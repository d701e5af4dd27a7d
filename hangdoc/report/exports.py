"""The ranks' sampled stacks for the profilers' viewers: ``--speedscope FILE`` (speedscope's
JSON file format) and ``--folded FILE`` (folded stacks, the input of Brendan Gregg's
``flamegraph.pl`` and of inferno, as ``py-spy record --format raw`` writes them).

Both are written from one ``StackExport``: the ranks grouped by the merged tree's classes
(``Diagnosis.groups``: ranks with the same stack), and for each class every distinct stack
its ranks were sampled in, all threads of all good samples, with the number of times it
was seen (one rank's thread in one sample counts one). A stack starts with a
``thread NAME`` frame, so one rank's threads stay apart; frames read ``function
(file:line)`` as in py-spy. Processes the tree does not hold (no rank number, or no thread
the analysis could read) form one class of their own at the end.

Bounds: the output follows the distinct stacks, never ranks times samples. Of the tree's
classes at most ``MAX_CLASSES`` are written (the largest, and one that holds all the
smaller ones), and at most ``MAX_STACKS`` stacks in all (each class's most seen first, at
least one a class); the stacks left out of a class are counted in one ``(N other stacks)``
entry, so every class's counts still add up to its samples. Strings from the job pass through
``errors.printable``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .. import __version__
from ..errors import printable
from ..model import Diagnosis, Frame, JobSnapshot, RankSnapshot, Stack, tree_frames
from ..rankranges import count_text, short_ranges

MAX_CLASSES = 200
MAX_STACKS = 20_000
_RANGES = 60  # characters of rank ranges in a class's name
SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"


@dataclass(frozen=True, slots=True)
class SampledStack:
    """One distinct stack of a class: its thread's name, its frames (outermost first; none
    for the entry that counts the stacks left out) and how often it was seen."""

    thread: str
    frames: Stack
    count: int
    left_out: int = 0  # > 0: this entry stands for that many stacks that were not written


@dataclass(frozen=True, slots=True)
class ClassStacks:
    """One class of ranks and the stacks its ranks were sampled in, most seen first."""

    name: str  # "ranks 0-2 (3 ranks): all_reduce"
    ranks: tuple[int, ...]
    stacks: tuple[SampledStack, ...]
    culprit: bool = False

    @property
    def samples(self) -> int:
        return sum(s.count for s in self.stacks)


@dataclass(frozen=True, slots=True)
class StackExport:
    """Every class's stacks: what ``render_speedscope`` and ``render_folded`` write."""

    title: str
    classes: tuple[ClassStacks, ...]


def stack_export(diagnosis: Diagnosis, snapshot: JobSnapshot) -> StackExport:
    """The classes of ``diagnosis`` with the sampled stacks of their ranks in ``snapshot``."""
    by_process = {(r.process.host, r.process.pid): r for r in snapshot.ranks}
    snap_of: dict[int, RankSnapshot] = {}
    for analysed in diagnosis.ranks:
        found = by_process.get((analysed.host, analysed.pid)) if analysed.pid is not None else None
        if analysed.rank is not None and found is not None:
            snap_of.setdefault(analysed.rank, found)
    groups = sorted(diagnosis.groups, key=lambda g: (-len(g.ranks), g.ranks[:1]))
    culprits = frozenset(diagnosis.culprit_ranks)
    parts: list[tuple[str, tuple[int, ...], list[RankSnapshot], bool]] = []
    used: set[int] = set()
    apart = groups if len(groups) <= MAX_CLASSES else groups[: MAX_CLASSES - 1]
    for group in apart:
        op = f": {printable(group.op.name)}" if group.op is not None else ""
        snaps = [snap_of[r] for r in group.ranks if r in snap_of]
        used.update(map(id, snaps))
        parts.append((_ranks_name(group.ranks) + op, group.ranks, snaps, not culprits.isdisjoint(group.ranks)))
    if len(apart) < len(groups):
        rest = sorted(r for g in groups[len(apart) :] for r in g.ranks)
        snaps = [snap_of[r] for r in rest if r in snap_of]
        used.update(map(id, snaps))
        smaller = f": {count_text(len(groups) - len(apart))} smaller classes"
        parts.append((_ranks_name(rest) + smaller, tuple(rest), snaps, not culprits.isdisjoint(rest)))
    others = [r for r in snapshot.ranks if id(r) not in used and r.good_samples]
    if others:
        word = "process" if len(others) == 1 else "processes"
        parts.append((f"{count_text(len(others))} other {word}: not in the merged tree", (), others, False))

    counted = [_count(snaps) for _, _, snaps, _ in parts]
    kept = _keep(counted)
    classes = tuple(
        ClassStacks(name, ranks, tuple(stacks), culprit)
        for (name, ranks, _, culprit), stacks in zip(parts, kept, strict=True)
    )
    title = f"hangdoc {diagnosis.verdict.value}: {printable(snapshot.spec)}"
    return StackExport(title, classes)


def _ranks_name(ranks: Sequence[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {short_ranges(ranks, _RANGES)} ({count_text(len(ranks))} ranks)"


def _count(snaps: Iterable[RankSnapshot]) -> list[tuple[str, Stack, int]]:
    """The distinct (thread name, stack) of ``snaps``' good samples with their counts,
    most seen first. Counted by object first (the loader interns stacks: each distinct
    stack object is hashed once, not once a sample), then merged by value."""
    by_object: dict[tuple[str | None, int], int] = {}
    objects: dict[int, Stack] = {}
    for snap in snaps:
        for sample in snap.good_samples:
            for thread in sample.threads:
                key = (thread.name, id(thread.frames))
                by_object[key] = by_object.get(key, 0) + 1
                objects[key[1]] = thread.frames
    by_value: dict[tuple[str, Stack], int] = {}
    shown: dict[int, Stack] = {}
    for (name, ident), count in by_object.items():
        frames = shown.get(ident)
        if frames is None:
            frames = shown[ident] = tree_frames(objects[ident])  # the stacks the merged tree sees
        shape = (_thread_name(name), frames)
        by_value[shape] = by_value.get(shape, 0) + count
    out = [(thread, frames, count) for (thread, frames), count in by_value.items()]
    out.sort(key=lambda item: -item[2])  # stable: equal counts stay in the order first seen
    return out


def _thread_name(name: str | None) -> str:
    return f"thread {printable(name)}" if name else "thread (no name)"


def _keep(counted: Sequence[list[tuple[str, Stack, int]]]) -> list[list[SampledStack]]:
    """At most ``MAX_STACKS`` stacks in all: each class's most seen one, then the most seen
    of the rest, whichever class they belong to; what is left out of a class is counted in
    one entry of its own."""
    room = max(MAX_STACKS - len(counted), 0)
    rest = sorted(
        ((count, c, i) for c, stacks in enumerate(counted) for i, (_, _, count) in enumerate(stacks) if i),
        key=lambda item: -item[0],
    )
    keep = [1 if stacks else 0 for stacks in counted]
    for _, c, i in rest[:room]:
        keep[c] = max(keep[c], i + 1)
    # a class keeps a prefix of its list (most seen first): a kept stack below one left out
    # of the same class cannot happen, as the global order is by count too
    out = []
    for stacks, n in zip(counted, keep, strict=True):
        kept = [SampledStack(thread, frames, count) for thread, frames, count in stacks[:n]]
        dropped = stacks[n:]
        if dropped:
            kept.append(SampledStack("", (), sum(c for _, _, c in dropped), left_out=len(dropped)))
        out.append(kept)
    return out


def _left_out(stack: SampledStack) -> str:
    return f"({count_text(stack.left_out)} other stack{'s' if stack.left_out != 1 else ''})"


# ------------------------------------------------------------------- speedscope


def render_speedscope(diagnosis: Diagnosis, snapshot: JobSnapshot) -> str:
    """The stacks as a speedscope file: one sampled profile per class of ranks, frames shared
    (https://www.speedscope.app/file-format-schema.json). Open it at speedscope.app."""
    export = stack_export(diagnosis, snapshot)
    frames: list[dict[str, object]] = []
    index: dict[object, int] = {}

    def frame_index(key: object, make: dict[str, object]) -> int:
        at = index.get(key)
        if at is None:
            at = index[key] = len(frames)
            frames.append(make)
        return at

    def of_frame(frame: Frame) -> int:
        made: dict[str, object] = {"name": printable(str(frame)), "file": printable(frame.filename)}
        if frame.line:
            made["line"] = frame.line
        return frame_index(frame, made)

    profiles = []
    for cls in export.classes:
        samples: list[list[int]] = []
        weights: list[int] = []
        for stack in cls.stacks:
            if stack.left_out:
                name = _left_out(stack)
                samples.append([frame_index(("left out", name), {"name": name})])
            else:
                top = frame_index(("thread", stack.thread), {"name": stack.thread})
                samples.append([top, *map(of_frame, stack.frames)])
            weights.append(stack.count)
        profiles.append(
            {
                "type": "sampled",
                "name": cls.name,
                "unit": "none",
                "startValue": 0,
                "endValue": sum(weights),
                "samples": samples,
                "weights": weights,
            }
        )
    first_culprit = next((i for i, cls in enumerate(export.classes) if cls.culprit), 0)
    document = {
        "$schema": SPEEDSCOPE_SCHEMA,
        "version": "0.6.0",
        "name": export.title,
        "exporter": f"hangdoc {__version__}",
        "activeProfileIndex": first_culprit,
        "shared": {"frames": frames},
        "profiles": profiles,
    }
    return json.dumps(document, separators=(",", ":")) + "\n"


# ----------------------------------------------------------------------- folded


def folded_name(text: str) -> str:
    """``text`` as one frame of a folded line: ``;`` (the separator) becomes ``:``, as
    flame graph's stackcollapse scripts do, and control characters (a newline ends a line)
    are escapes."""
    return printable(text).replace(";", ":")


def render_folded(diagnosis: Diagnosis, snapshot: JobSnapshot) -> str:
    """The stacks as folded lines, ``CLASS;thread NAME;frame;...;frame COUNT``, one a
    distinct stack of a class (outermost frame first), for ``flamegraph.pl`` or inferno."""
    export = stack_export(diagnosis, snapshot)
    names: dict[Frame, str] = {}
    lines = []
    for cls in export.classes:
        head = folded_name(cls.name)
        for stack in cls.stacks:
            if stack.left_out:
                path = [head, _left_out(stack)]
            else:
                path = [head, folded_name(stack.thread)]
                for frame in stack.frames:
                    name = names.get(frame)
                    if name is None:
                        name = names[frame] = folded_name(str(frame))
                    path.append(name)
            lines.append(f"{';'.join(path)} {stack.count}")
    return "".join(line + "\n" for line in lines)
