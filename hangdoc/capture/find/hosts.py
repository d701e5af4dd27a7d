"""This node's names and addresses, and the processes that rendezvous at a ``HOST:PORT``.

``same_host`` compares host names loosely: this node's own names and addresses (its host
name and short name, its interfaces' addresses, ``localhost``, any loopback address) are
all equal to each other; other names are resolved (cached) and equal when they share an
address. ``endpoint_scope`` takes in the processes whose start-up ``MASTER_ADDR`` and
``MASTER_PORT`` name the endpoint of a ``HOST:PORT`` spec.
"""

from __future__ import annotations

import functools
import ipaddress
import socket

import psutil

from ...addresses import is_loopback_host
from .jobspec import JobSpec, normalise_host
from .processes import ProcessTable


@functools.lru_cache(maxsize=64)
def _addresses(name: str) -> frozenset[str]:
    try:
        return frozenset(str(info[4][0]) for info in socket.getaddrinfo(name, None))
    except (OSError, UnicodeError):
        return frozenset()


@functools.lru_cache(maxsize=1)
def _local_names() -> frozenset[str]:
    hostname = socket.gethostname().lower()
    names = {"localhost", "localhost.localdomain", "0.0.0.0", "::", hostname, hostname.split(".")[0]}
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            if addr.family in (socket.AF_INET, socket.AF_INET6):
                names.add(addr.address.split("%")[0].lower())
    return frozenset(names)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _is_local(host: str) -> bool:
    return host in _local_names() or is_loopback_host(host)


def same_host(a: str, b: str) -> bool:
    """Loose host equality: the node's own names/addresses are all equal; names resolve."""
    a, b = normalise_host(a), normalise_host(b)
    if a == b or (_is_local(a) and _is_local(b)):
        return True
    if _is_ip(a) and _is_ip(b):
        return False
    addrs_a = {a} if _is_ip(a) else _addresses(a)
    addrs_b = {b} if _is_ip(b) else _addresses(b)
    return bool(addrs_a & addrs_b)


def endpoint_scope(spec: JobSpec, table: ProcessTable) -> tuple[list[int], str, str]:
    """The pids whose MASTER_ADDR/MASTER_PORT name ``spec``'s endpoint, what to say when there
    are none, and a hint: the endpoints seen instead."""
    assert spec.host is not None and spec.port is not None
    wanted = f"MASTER_ADDR={spec.host} MASTER_PORT={spec.port}"
    scope = []
    seen: dict[str, int] = {}
    for proc in table.procs.values():
        if not proc.env or "MASTER_ADDR" not in proc.env:
            continue
        addr, port = proc.env["MASTER_ADDR"], proc.env.get("MASTER_PORT", "").strip()
        endpoint = f"{addr}:{port}"
        seen[endpoint] = seen.get(endpoint, 0) + 1
        if port == str(spec.port) and same_host(addr, spec.host):
            scope.append(proc.pid)
    others = ", ".join(f"{ep} ({n})" for ep, n in sorted(seen.items())[:4])
    hint = f"; endpoints seen here: {others}" if others and not scope else ""
    return scope, f"no process has {wanted}", hint
