"""Rank sets as ranges, fast enough for 100,000-rank nodes of the merged tree.

``model.compress_ranks`` walks every rank; the shareable reports write the rank set of
every tree node, and near the root each holds every rank of the job. ``ranges`` splits a
sorted run of ranks by bisection instead: a stretch ``ranks[i..j]`` with
``ranks[j] - ranks[i] == j - i`` is one range, so a set of *k* ranges costs about
*k log n* steps, not *n*.
"""

from __future__ import annotations

from collections.abc import Sequence


def ranges(ranks: Sequence[int]) -> list[tuple[int, int]]:
    """The maximal runs ``(first, last)`` of ``ranks``, which must be sorted and distinct
    (``TreeNode.ranks``, ``StackGroup.ranks``, ``Diagnosis.culprit_ranks`` are)."""
    out: list[tuple[int, int]] = []
    todo = [(0, len(ranks) - 1)] if ranks else []
    while todo:
        lo, hi = todo.pop()
        if ranks[hi] - ranks[lo] == hi - lo:
            if out and out[-1][1] + 1 == ranks[lo]:
                out[-1] = (out[-1][0], ranks[hi])
            else:
                out.append((ranks[lo], ranks[hi]))
            continue
        mid = (lo + hi) // 2
        todo += [(mid + 1, hi), (lo, mid)]  # the lower half is taken first: runs come in order
    return out


def ranges_text(ranks: Sequence[int]) -> str:
    """``0-2,5`` for ranks 0, 1, 2, 5 (sorted, distinct); ``""`` for none."""
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges(ranks))


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
