"""Shared pytest setup: the folders say what a test needs.

Every test under ``live/`` starts real processes (torch.distributed jobs, agents, other
users) and is marked ``live``; under ``live/netns/`` also ``netns`` (root and ``ip netns``).
A test elsewhere may mark itself ``netns`` too. ``make test-fast`` deselects both, so it
starts no job. Where namespaces cannot be made, ``netns`` tests are skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

LIVE = Path(__file__).resolve().parent / "live"
NETNS = LIVE / "netns"


def _netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root for ip netns"
    if shutil.which("ip") is None:
        return "needs the ip command (iproute2)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path))
        if path.is_relative_to(LIVE):
            item.add_marker(pytest.mark.live)
        if path.is_relative_to(NETNS):
            item.add_marker(pytest.mark.netns)
    reason = _netns_unavailable()
    if reason is None:
        return
    for item in items:
        if "netns" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))
