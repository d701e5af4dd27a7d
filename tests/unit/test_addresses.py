"""Host names and addresses judged as text (``hangdoc.addresses``)."""

from __future__ import annotations

import pytest

from hangdoc.addresses import is_loopback_host


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("10.0.0.1", False),
        ("::", False),
        ("node-3", False),
        ("localhost.example", False),
        ("", False),
    ],
)
def test_is_loopback_host(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback
