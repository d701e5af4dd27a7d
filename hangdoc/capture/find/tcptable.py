"""The kernel's TCP socket tables of this network namespace (``/proc/net/tcp``, ``tcp6``):
what identd reads. One row a socket; the columns hangdoc uses are named below."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

PROC_NET_TCP = ("/proc/net/tcp", "/proc/net/tcp6")
ESTABLISHED = "01"
LISTEN = "0A"


class TcpRow(NamedTuple):
    local: str  # "ADDR:PORT" in the kernel's hex, host-order words
    state: str  # "01" established, "0A" listening, ...
    uid: int  # the socket's owner, as this user namespace sees it
    inode: int

    @property
    def port(self) -> int:
        return int(self.local.rpartition(":")[2], 16)


def tcp_rows(tables: Iterable[str] = PROC_NET_TCP) -> Iterator[TcpRow]:
    """Every socket of the tables that can be read; malformed rows are skipped."""
    for path in tables:
        try:
            with open(path) as table:
                next(table, None)
                for line in table:
                    cols = line.split()
                    if len(cols) < 10:
                        continue
                    try:
                        yield TcpRow(cols[1], cols[3], int(cols[7]), int(cols[9]))
                    except ValueError:
                        continue
        except OSError:
            continue
