"""Host names and addresses as text, judged without a lookup: ``is_loopback_host``. (Which
names are this node's own is ``capture.find.hosts``: that one asks the node.) Standard library only."""

from __future__ import annotations

import ipaddress


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a loopback address (``127.0.0.0/8``, ``::1``); no name is looked up."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
