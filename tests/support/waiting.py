"""``until``: poll a condition in a test instead of sleeping and hoping."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether ``condition()`` became true within ``timeout`` seconds (polled every 20 ms)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
