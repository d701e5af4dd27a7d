"""Whose job it is: ranks of another user are kept apart from the job, never merged into it.

Any user can start a process whose environment names a job's ``MASTER_ADDR`` and
``MASTER_PORT`` (or sits below a ``pid:``'s launcher through a setuid helper). Counted as a
rank, such a process would steer the verdict of an operator's diagnosis, and the operator's
agent would then ask its probe on the job's behalf. So the job gets one owner, decided by
what its own user controls and another cannot fake, in this order:

1. the user of the process listening on ``MASTER_PORT`` on this node (the job's store: rank
   0 or its launcher holds it, and no second user can bind the port while it is held);
2. for ``pid:PID``, the user of PID (the process the person named);
3. the one user of the launchers the ranks descend from (torchrun, mp.spawn's parent), when
   every rank has one: a user cannot put its process below another user's launcher;
4. the one user of every rank found.

When none of these names one user, the job is ambiguous and discovery refuses it, naming
each user's processes, rather than guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .processes import ProcessTable
from .tcptable import LISTEN, PROC_NET_TCP, tcp_rows


@dataclass(frozen=True)
class Owner:
    """The job's user and how that was decided (for the note that names who was left out)."""

    uid: int
    how: str


def listening_uids(port: int, tables: Iterable[str] = PROC_NET_TCP) -> set[int]:
    """The users owning a TCP socket that listens on ``port`` in this network namespace."""
    found: set[int] = set()
    for row in tcp_rows(tables):
        try:
            if row.state == LISTEN and row.port == port:
                found.add(row.uid)
        except ValueError:
            continue
    return found


def _port(envs: Iterable[Mapping[str, str] | None]) -> int | None:
    ports = {env.get("MASTER_PORT") for env in envs if env}
    ports.discard(None)
    if len(ports) != 1:
        return None
    (text,) = ports
    return int(text) if text and text.isascii() and text.isdigit() and int(text) < 65536 else None


def job_owner(
    table: ProcessTable,
    ranks: Iterable[int],
    launchers: Iterable[int | None],
    named_pid: int | None = None,
    port: int | None = None,
) -> Owner | None:
    """The job's user by the rules above; None when they name no single user."""
    ranks = list(ranks)
    uids = {table.procs[pid].uid for pid in ranks}
    if len(uids) == 1 and None not in uids:
        (only,) = uids
        assert only is not None
        return Owner(only, "the user of every rank")
    port = port if port is not None else _port(table.procs[pid].env for pid in ranks)
    if port is not None and len(held := listening_uids(port)) == 1:
        return Owner(held.pop(), f"the user listening on MASTER_PORT {port}")
    if named_pid is not None and (named := table.procs.get(named_pid)) and named.uid is not None:
        return Owner(named.uid, f"the user of pid {named_pid}")
    above = {table.procs[pid].uid if pid in table.procs else None for pid in launchers}
    if len(above) == 1 and None not in above:
        (launcher_uid,) = above
        assert launcher_uid is not None
        return Owner(launcher_uid, "the user of the ranks' launcher")
    return None


def by_owner(table: ProcessTable, pids: Iterable[int]) -> dict[int | None, list[int]]:
    """``pids`` grouped by their user."""
    groups: dict[int | None, list[int]] = {}
    for pid in pids:
        groups.setdefault(table.procs[pid].uid, []).append(pid)
    return groups
