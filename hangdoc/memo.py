"""Working with millions of shared model values: each piece of work done once per object
(``once_per_object``), and no garbage collection walking them while they are made
(``collections_paused``). Standard library only."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from typing import TypeVar

_In = TypeVar("_In")
_Out = TypeVar("_Out")


def once_per_object(make: Callable[[_In], _Out]) -> Callable[[_In], _Out]:
    """``make``, worked out once per argument object while the function returned lives:
    ranks share their stacks and ops (bundles intern stacks; ``analysis.ops.Recogniser``
    returns one op per distinct thread), so their words, keys and report entries are made
    once. Each entry holds its argument, so no id is reused meanwhile."""
    seen: dict[int, tuple[_In, _Out]] = {}

    def once(value: _In) -> _Out:
        found = seen.get(id(value))
        if found is None:
            found = seen[id(value)] = (value, make(value))
        return found[1]

    return once


@contextlib.contextmanager
def collections_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused, then left as it was. The model's values are
    frozen and hold no cycles; loading or analysing a snapshot makes millions of them and no
    garbage in cycles, and each collection of the oldest generation meanwhile would only walk
    every object of the snapshot again (3 s at 100k ranks)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
