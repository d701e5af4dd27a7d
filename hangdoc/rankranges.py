"""Rank sets as ranges, the one way hangdoc writes them: ``0-2,5`` for ranks 0, 1, 2 and 5.

Two kinds of input. A sorted run of distinct ranks (``TreeNode.ranks``, ``StackGroup.ranks``,
``Scope``'s sets) is split by bisection (``ranges``, ``ranges_text``, ``short_ranges``,
``cut_ranges``, ``ranks_label``): a stretch ``ranks[i..j]`` with ``ranks[j] - ranks[i] ==
j - i`` is one range, so a set of *k* ranges costs about *k log n* steps, not *n* (the
shareable reports write the rank set of every tree node, and near the root each holds every
rank of a 100,000-rank job). Ranks in any order, repeats allowed, are sorted first
(``compress_ranks``: ``[0-2,5]``; ``rank_phrase``: ``rank 3`` or ``ranks 0-2,5``, the words
every floor uses to name ranks). The labels reports print: ``ranks_label`` (``[0-49999,
50008-99999] (99,992)``), ``count_text``, ``scope_text``. Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence


def ranges(ranks: Sequence[int]) -> list[tuple[int, int]]:
    """The maximal runs ``(first, last)`` of ``ranks``, which must be sorted and distinct
    (``TreeNode.ranks``, ``StackGroup.ranks``, ``Diagnosis.culprit_ranks`` are)."""
    return list(iter_ranges(ranks))


def iter_ranges(ranks: Sequence[int]) -> Iterator[tuple[int, int]]:
    """``ranges``, one run at a time: a label cut after a few runs splits no further."""
    todo = [(0, len(ranks) - 1)] if ranks else []
    run: tuple[int, int] | None = None
    while todo:
        lo, hi = todo.pop()
        if ranks[hi] - ranks[lo] == hi - lo:
            if run is not None and run[1] + 1 == ranks[lo]:
                run = (run[0], ranks[hi])
            else:
                if run is not None:
                    yield run
                run = (ranks[lo], ranks[hi])
            continue
        mid = (lo + hi) // 2
        todo += [(mid + 1, hi), (lo, mid)]  # the lower half is taken first: runs come in order
    if run is not None:
        yield run


def ranges_text(ranks: Sequence[int]) -> str:
    """``0-2,5`` for ranks 0, 1, 2, 5 (sorted, distinct); ``""`` for none."""
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges(ranks))


def compress_ranks(ranks: Iterable[int]) -> str:
    """``[0-2,5]`` for ranks 0, 1, 2, 5 in any order, repeats counted once; ``[]`` for none."""
    return f"[{ranges_text(sorted(set(ranks)))}]"


def rank_phrase(ranks: Iterable[int]) -> str:
    """``rank 3`` or ``ranks 0-2,5``: ranks in any order named in words (``ranks 3`` for
    ``[3, 3]``: the number of ranks given decides the word)."""
    ordered = sorted(ranks)
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    return f"ranks {ranges_text(sorted(set(ordered)))}"


def short_ranges(ranks: Sequence[int], limit: int = 40) -> str:
    """``ranges_text`` cut to about ``limit`` characters at a comma: ``0-3,7,9,…+12``
    says 12 more ranges follow."""
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in ranges(ranks)]
    text = ""
    for i, part in enumerate(parts):
        if text and len(text) + len(part) + 1 > limit:
            return f"{text},…+{len(parts) - i}"
        text = f"{text},{part}" if text else part
    return text


def cut_ranges(ranks: Sequence[int], limit: int = 40) -> tuple[str, bool]:
    """``ranges_text`` cut at a comma to about ``limit`` characters, ending ``,…`` where
    cut (at least one range is kept, however long); and whether it was cut."""
    text = ""
    for a, b in iter_ranges(ranks):
        part = str(a) if a == b else f"{a}-{b}"
        if text and len(text) + len(part) + 1 > limit:
            return f"{text},…", True
        text = f"{text},{part}" if text else part
    return text, False


def count_text(count: int) -> str:
    """``7``, ``1,234``, ``99,992``: a count of ranks or processes, grouped by thousands."""
    return f"{count:,}"


def ranks_label(ranks: Sequence[int], limit: int = 40, count_over: int = 32) -> str:
    """``[0-2,5]``; a long set cut (``[0,2,4,…]``) and followed by its count where it was cut
    or holds more than ``count_over`` ranks: ``[0-49999,50008-99999] (99,992)``.
    ``ranks`` must be sorted and distinct."""
    text, cut = cut_ranges(ranks, limit)
    label = f"[{text}]"
    if cut or len(ranks) > count_over:
        label += f" ({count_text(len(ranks))})"
    return label


def scope_text(seen: Sequence[int], not_seen: Sequence[int], absent: Sequence[int], world_size: int | None) -> str:
    """What a diagnosis saw of the job, for a report's header: ``saw ranks 0-1 of 4; ranks
    2-3 not seen``; ``""`` when every rank of a job of known size was seen."""

    def who(ranks: Sequence[int]) -> str:
        return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {short_ranges(ranks)}"

    if not (seen or not_seen or absent):
        return ""  # nothing recorded (a diagnosis built by hand)
    if world_size is not None and not not_seen and not absent and len(seen) == world_size:
        return ""
    of = f" of {count_text(world_size)}" if world_size is not None else " (the job's size is not known)"
    parts = [f"saw {who(seen) if seen else 'no rank'}{of}"]
    if not_seen:
        parts.append(f"{who(not_seen)} not seen (nodes not searched or not answering, or not in the dumps)")
    if absent:
        parts.append(f"{who(absent)} absent (no process)")
    return "; ".join(parts)
