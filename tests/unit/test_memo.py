"""Identity memos and the paused collector (``hangdoc.memo``)."""

from __future__ import annotations

import gc

from hangdoc.memo import collections_paused, once_per_object


def test_once_per_object_works_once_per_argument_object() -> None:
    calls: list[tuple[int, ...]] = []

    def length(value: tuple[int, ...]) -> int:
        calls.append(value)
        return len(value)

    once = once_per_object(length)
    a, b = (1, 2), tuple(range(1, 3))  # equal, but two objects
    assert [once(a), once(a), once(b), once(a)] == [2, 2, 2, 2]
    assert len(calls) == 2 and calls[0] is a and calls[1] is b


def test_collections_paused_leaves_the_collector_as_it_was() -> None:
    was = gc.isenabled()
    try:
        gc.enable()
        with collections_paused():
            assert not gc.isenabled()
        assert gc.isenabled()
        gc.disable()
        with collections_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
