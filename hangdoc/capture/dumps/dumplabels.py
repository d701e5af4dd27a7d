"""Which ranks a free-form label over pasted stacks names, and what world size a text says.

People label the stacks they paste in their own words: ``rank 3:``, ``[rank3]:``,
``ranks 1-3 had moved on to:``, ``TP0 stuck in:``, ``GPU 5``, ``worker-2``, ``Node 48:``,
``3 processes in:``. ``label_ranks`` reads the rank numbers a label names, and only where
it clearly names a rank, a TP rank, a GPU or a worker index:

- ``rank``/``ranks`` (a global rank) wins over any other index on the line;
- ``TP``, ``GPU``, ``local rank`` and ``worker`` indices are read as ranks only when the line
  names no node, pipeline, data, expert or context parallel index besides (``PP2 TP1`` and
  ``node 3 GPU 5`` do not say which global rank they are);
- ``Node 48`` alone names a node, not a rank;
- a count (``3 processes in:``) says how many processes share the stack, not which.

``world_size_in`` reads a world size a text states (``world size 8``, ``WORLD_SIZE=8``,
``of 8 ranks``).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from ...model import MAX_WORLD_SIZE

_NUM = r"\d{1,7}"
# a list of numbers and ranges after a keyword: "1-3", "0, 2, 3", "[0, 2]", "1 and 2"
_LIST = (
    rf"\[?\s*{_NUM}(?:\s*(?:-|–|\.\.|to)\s*(?:TP)?{_NUM})?"
    rf"(?:\s*(?:,|and|&)\s*{_NUM}(?:\s*(?:-|–|\.\.)\s*{_NUM})?)*\s*\]?"
)
_EDGE = r"(?<![A-Za-z0-9_])"
_LOCAL = re.compile(rf"{_EDGE}local[\s_-]?ranks?[\s:=#_-]*({_LIST})(?!\d)", re.IGNORECASE)
_RANK = re.compile(rf"{_EDGE}ranks?[\s:=#_-]*({_LIST})(?!\d)", re.IGNORECASE)
_TP = re.compile(rf"{_EDGE}(?:TP|tp_rank|tp-rank)[\s:=#_-]?({_LIST})(?!\d)")
_GPU = re.compile(rf"{_EDGE}(?:GPUs?|cuda:)[\s:=#_-]*({_LIST})(?!\d)", re.IGNORECASE)
_WORKER = re.compile(rf"{_EDGE}workers?[\s:=#_-]*({_LIST})(?!\d)", re.IGNORECASE)
# indices that leave a TP, GPU or worker index short of a global rank
_OTHER_INDEX = re.compile(
    rf"{_EDGE}(?:(?:PP|DP|EP|CP|SP)[\s_-]?{_NUM}|"
    rf"(?:node|host|machine)[\s:=#_-]*{_NUM})(?!\d)",
    re.IGNORECASE,
)
_COUNT = re.compile(rf"{_EDGE}({_NUM})\s+(?:processes|procs|ranks|workers|GPUs)\b", re.IGNORECASE)
_WORLD = (
    re.compile(rf"{_EDGE}world[\s_-]?size[\s:=]*({_NUM})(?!\d)", re.IGNORECASE),
    re.compile(rf"{_EDGE}of\s+({_NUM})\s+(?:ranks|processes|GPUs)\b", re.IGNORECASE),
    re.compile(rf"{_EDGE}({_NUM})\s+ranks\s+in\s+(?:all|total)\b", re.IGNORECASE),
)


class LabelIndex(enum.Enum):
    """What kind of index a label's number is."""

    RANK = "rank"
    TP = "TP rank, taken as the global rank"
    LOCAL = "local rank (GPU), taken as the global rank: one node assumed"
    WORKER = "worker index, taken as the rank"


@dataclass(frozen=True, slots=True)
class LabelRanks:
    """The ranks one label names, and how they were read."""

    ranks: tuple[int, ...]
    kind: LabelIndex


def _numbers(text: str) -> tuple[int, ...] | None:
    """The numbers of a list such as ``1-3``, ``0, 2, 3`` or ``[1 and 2]``; None past the cap."""
    found: list[int] = []
    body = text.strip("[] ").replace("TP", "")
    for part in re.split(r"\s*(?:,|and|&)\s*", body):
        m = re.fullmatch(rf"({_NUM})(?:\s*(?:-|–|\.\.|to)\s*({_NUM}))?", part.strip())
        if m is None:
            return None
        low = int(m.group(1))
        high = int(m.group(2)) if m.group(2) else low
        if high < low or high >= MAX_WORLD_SIZE or len(found) + high - low >= MAX_WORLD_SIZE:
            return None
        found.extend(range(low, high + 1))
    return tuple(dict.fromkeys(found)) or None


def _named(pattern: re.Pattern[str], text: str) -> tuple[int, ...] | None:
    """The numbers ``pattern`` reads in ``text``: None when none, or when its matches
    disagree (two different lists on one line)."""
    lists = {_numbers(m.group(1)) for m in pattern.finditer(text)}
    lists.discard(None)
    if len(lists) != 1:
        return None
    return lists.pop()


def label_ranks(text: str) -> LabelRanks | None:
    """The ranks the label ``text`` names (see the module docstring); None when it names none
    or does not say which global ranks it means."""
    local = _named(_LOCAL, text)
    text_wo_local = _LOCAL.sub(" ", text) if local is not None else text
    ranks = _named(_RANK, text_wo_local)
    if ranks is not None:
        return LabelRanks(ranks, LabelIndex.RANK)
    if _OTHER_INDEX.search(text):
        return None
    found = [
        (kind, named)
        for kind, named in (
            (LabelIndex.TP, _named(_TP, text)),
            (LabelIndex.LOCAL, local if local is not None else _named(_GPU, text)),
            (LabelIndex.WORKER, _named(_WORKER, text)),
        )
        if named is not None
    ]
    if len(found) != 1:
        return None
    kind, named = found[0]
    return LabelRanks(named, kind)


def label_count(text: str) -> int | None:
    """How many processes a label says share its stack (``3 processes in:``)."""
    counts = {int(m.group(1)) for m in _COUNT.finditer(text)}
    if len(counts) != 1:
        return None
    count = counts.pop()
    return count if 0 < count <= MAX_WORLD_SIZE else None


def world_size_in(lines: list[str]) -> tuple[int, str] | None:
    """The world size ``lines`` state, with the line that states it; None when they state
    none, or disagree."""
    found: dict[int, str] = {}
    for line in lines:
        for pattern in _WORLD:
            for m in pattern.finditer(line):
                size = int(m.group(1))
                if 0 < size <= MAX_WORLD_SIZE:
                    found.setdefault(size, line.strip())
    if len(found) != 1:
        return None
    return next(iter(found.items()))
