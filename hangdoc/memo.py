"""Working with millions of shared model values: each piece of work done once per object
(``once_per_object``), no garbage collection walking them while they are made
(``collections_paused``), and equal values made during a capture made once
(``share_values``). Standard library only."""

from __future__ import annotations

import contextlib
import contextvars
import gc
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

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


class SharedValues:
    """The values made while a capture is under way, each by a key that says what it is
    equal to. A key may hold ids, of objects its value holds: those stay alive while the
    entry does, so no id in a key is reused meanwhile."""

    def __init__(self) -> None:
        self.frames: dict[Any, Any] = {}
        self.stacks: dict[Any, Any] = {}
        self.threads: dict[Any, Any] = {}
        self.thread_lists: dict[Any, Any] = {}


# the values of the capture under way in this context: a capture's own threads (its fan-out's)
# run in a copy of it (``fleet.coordinator.flat_fan_out``)
_shared: contextvars.ContextVar[SharedValues | None] = contextvars.ContextVar("hangdoc_shared_values", default=None)


@contextlib.contextmanager
def share_values() -> Iterator[None]:
    """While a capture is under way, what agents' answers decode to is shared by value
    (``shared_values``): a rank's unchanged threads in each round, a stack in every answer
    that holds it, are one object, as a bundle read back makes them. Without that, the
    stacks of a 100k-rank capture through relays would be new objects in each relay's
    answer of each round, and the analysis and the bundle writer, which work once per
    object, would work once per copy. Each capture has values of its own, dropped when it
    ends (a capture within one shares the outer one's)."""
    token = _shared.set(SharedValues()) if _shared.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _shared.reset(token)


def shared_values() -> SharedValues | None:
    """The values of the capture under way; None outside one."""
    return _shared.get()
