"""Shared pytest setup: skip netns tests where namespaces cannot be made."""

from __future__ import annotations

import os
import shutil

import pytest


def _netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root for ip netns"
    if shutil.which("ip") is None:
        return "needs the ip command (iproute2)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _netns_unavailable()
    if reason is None:
        return
    for item in items:
        if "netns" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))
