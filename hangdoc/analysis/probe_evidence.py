"""Evidence from the ranks' in-process probes (``hangdoc.probe``): the exception each thread
was handling when hangdoc asked, and each rank's last step heartbeat.

Said, never weighed: the verdict, culprits and confidence stay as the stacks and the flight
recorder made them. An exception a rank is handling while it waits in a collective or in
cleanup is often the reason it left the training path (the seed guide's Pattern A), so
those lines come first; ranks that tell the same thing share one line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..memo import once_per_object
from ..model import DistOp, Heartbeat, ThreadException, counted
from ..rankranges import rank_phrase
from .views import RankView

MAX_LINES = 6  # of each kind; the rest is counted


def probe_lines(views: Sequence[RankView]) -> list[str]:
    """What the ranks' probes told, in lines: live exceptions, then last heartbeats."""
    return exception_lines(views) + heartbeat_lines(views)


def exception_lines(views: Sequence[RankView]) -> list[str]:
    """``rank 3's main thread is handling RuntimeError raised at train.py:40 while in
    destroy_process_group (train.py:52) (its probe)``: per distinct thread, exception and op."""
    telling = [v for v in views if v.snap.exceptions]
    if not telling:
        return []
    described = once_per_object(DistOp.describe)  # ranks share ops
    told: dict[tuple[bool, str, str, str, str], list[int]] = {}
    for v in telling:
        for exc in v.snap.exceptions:
            within = _within(exc, v, described)
            name = exc.thread_name or f"{exc.thread_id:#x}"
            key = (not within, name, exc.type_name, exc.raised_at.location, within)
            told.setdefault(key, []).append(v.rank)
    lines = []
    for (_, thread, type_name, where, within), ranks in sorted(told.items(), key=_first):
        one = len(ranks) == 1
        lines.append(
            f"{rank_phrase(ranks)}'s {_thread_words(thread, one)} {'is' if one else 'are'} handling {type_name} "
            f"raised at {where}{within} ({'its probe' if one else 'their probes'})"
        )
    return _bounded(lines, "thread with a live exception", "threads with a live exception")


def heartbeat_lines(views: Sequence[RankView]) -> list[str]:
    """``ranks 0-2 last beat at step 41, 12.0-12.4 s before hangdoc asked (their probes)``."""
    beats: dict[tuple[int | None, bool], list[tuple[int, Heartbeat]]] = {}
    for v in views:
        if (beat := v.snap.heartbeat) is not None:
            beats.setdefault((beat.step, beat.in_step), []).append((v.rank, beat))
    lines = []
    for (step, in_step), found in sorted(beats.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1])):
        ranks = [r for r, _ in found]
        ages = sorted(b.age_seconds for _, b in found)
        age = f"{ages[0]:.1f}" if ages[-1] - ages[0] < 0.05 else f"{ages[0]:.1f}-{ages[-1]:.1f}"
        at = f" at step {step}" if step is not None else ""
        inside = ", inside the step" if in_step else ""
        lines.append(
            f"{rank_phrase(ranks)} last beat{at}{inside}, {age} s before hangdoc asked "
            f"({'its probe' if len(ranks) == 1 else 'their probes'})"
        )
    return _bounded(lines, "heartbeat line", "heartbeat lines")


def _within(exc: ThreadException, v: RankView, described: Callable[[DistOp], str]) -> str:
    """`` while in all_reduce (train.py:30)`` when the thread is the one its op was found in."""
    if v.op is None or v.thread is None or v.thread.name != exc.thread_name:
        return ""
    return f" while in {described(v.op)}"


def _thread_words(name: str | None, one: bool) -> str:
    if name == "MainThread":
        return "main thread" if one else "main threads"
    return f"thread '{name}'" if one else f"threads '{name}'"


def _first(item: tuple[tuple[bool, str, str, str, str], list[int]]) -> tuple[bool, int, str]:
    """Exceptions of the thread a rank waits in first, then by lowest rank."""
    (outside, *_), ranks = item
    return outside, min(ranks), item[0][2]


def _bounded(lines: list[str], one: str, many: str) -> list[str]:
    if len(lines) <= MAX_LINES:
        return lines
    return [*lines[:MAX_LINES], f"and {counted(len(lines) - MAX_LINES, 'more ' + one, 'more ' + many)} (their probes)"]
