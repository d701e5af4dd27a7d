"""``until``: poll a condition in a test instead of sleeping and hoping; ``alive``: whether a
process still runs."""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil


def until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether ``condition()`` became true within ``timeout`` seconds (polled every 20 ms)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: a killed process nobody has reaped yet (a zombie, until its
    parent or pid 1 waits for it, which some container inits never do) is not alive."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
