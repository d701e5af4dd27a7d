"""Rank sets as ranges (``hangdoc.rankranges``): the one way every floor writes them."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from hangdoc.rankranges import compress_ranks, ranges, ranges_text, rank_phrase, short_ranges


def _linear(ranks: list[int]) -> str:
    """Ranges the plain way, one rank at a time (what ``model.compress_ranks`` did)."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def _ranks_of(text: str) -> list[int]:
    out: list[int] = []
    for part in filter(None, text.split(",")):
        a, _, b = part.partition("-")
        out += range(int(a), int(b or a) + 1)
    return out


@given(st.lists(st.integers(0, 3000), max_size=300))
def test_ranks_in_any_order_are_written_as_ranges(ranks: list[int]) -> None:
    ordered = sorted(set(ranks))
    assert compress_ranks(ranks) == f"[{_linear(ranks)}]" == f"[{ranges_text(ordered)}]"
    assert _ranks_of(ranges_text(ordered)) == ordered
    assert all(a <= b for a, b in ranges(ordered))


def test_compress_ranks_examples() -> None:
    assert compress_ranks([]) == "[]"
    assert compress_ranks([3]) == "[3]"
    assert compress_ranks([0, 1, 2, 5]) == "[0-2,5]"
    assert compress_ranks([5, 1, 0, 2, 2]) == "[0-2,5]"
    assert compress_ranks((1, 3, 5)) == "[1,3,5]"


@given(st.lists(st.integers(0, 300), max_size=40))
def test_rank_phrase_names_one_rank_or_several(ranks: list[int]) -> None:
    # the words analysis has always used: the number of ranks given picks the word
    one = len(ranks) == 1
    assert rank_phrase(ranks) == (f"rank {ranks[0]}" if one else f"ranks {_linear(ranks)}")
    assert rank_phrase(iter(ranks)) == rank_phrase(ranks)


def test_rank_phrase_examples() -> None:
    assert rank_phrase([3]) == "rank 3"
    assert rank_phrase([5, 0, 2, 1]) == "ranks 0-2,5"
    assert rank_phrase((7, 7)) == "ranks 7"


def test_short_ranges_say_how_many_more() -> None:
    ranks = [r for r in range(0, 400, 2)]
    text = short_ranges(ranks, 20)
    assert len(text) < 40 and text.startswith("0,2,4") and text.endswith(f"+{200 - text.count(',')}")
    assert short_ranges(list(range(100_000))) == "0-99999"


def test_ranges_of_a_million_ranks_are_quick() -> None:
    ranks = [r for r in range(1_000_000) if r != 500_000]
    start = time.perf_counter()
    assert ranges_text(ranks) == "0-499999,500001-999999"
    assert time.perf_counter() - start < 0.05
