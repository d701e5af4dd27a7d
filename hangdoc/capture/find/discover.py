"""Find the rank processes of a job on this node: ``discover(spec) -> Discovery``.

Discovery reads the process table once (``processes``), takes in the processes the job spec
names (its scope: a ``HOST:PORT`` endpoint by ``MASTER_ADDR``/``MASTER_PORT``, ``hosts``; a
``pid:`` and its descendants; a ``slurm:`` job or step, ``slurm``), tells ranks apart from
launchers, their children, helpers and the unreadable, and numbers them (``ranks``, from
the start-up environment read by ``rankenv``). It raises ``JobNotFound`` when the scope holds
no rank, and ``PermissionDenied`` when it holds none that can be read but some Python
processes that may be ranks cannot be.

A ``pid:`` or ``slurm:`` scope may hold the ranks of several jobs; ``jobsplit`` tells them
apart by rendezvous and refuses (``MultipleJobs``) rather than merge them.

A ``pid:`` of a rank widens to its job on this node (``wholejob``: the same rendezvous, Slurm
step or launcher, the same user), and says so in a note. Where the ranks' environment shows
the job also runs on other nodes, ``Discovery.elsewhere`` says why and which; the fleet
makes one note of it for all the nodes asked (``wholejob.elsewhere_note``).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ...errors import JobNotFound
from ...model import Note, NoteKind, RankProcess, counted
from .hosts import endpoint_scope
from .jobspec import JobKind, JobSpec
from .jobsplit import Member, MultipleJobs, check_one_job
from .owners import by_owner, job_owner
from .processes import ProcessTable, describe, read_process_table, withhold
from .rankenv import env_int_notes
from .rankselect import (
    Selection,
    duplicate_notes,
    launcher_of,
    permission_denied,
    rank_process,
    select_ranks,
    unreadable,
    unreadable_notes,
    world_size,
)
from .ray_job import job_processes_here
from .slurm import slurm_scope
from .wholejob import Elsewhere, elsewhere, job_here

__all__ = ["Discovery", "MultipleJobs", "discover"]  # MultipleJobs: discover() raises it


@dataclass(frozen=True)
class Discovery:
    """The rank processes of a job on this node and how they were found."""

    ranks: tuple[RankProcess, ...]  # sorted by rank, unknown ranks last
    world_size: int | None
    notes: tuple[Note, ...]
    searched: str  # what was looked at, e.g. "MASTER_ADDR=h MASTER_PORT=p on vm: 213 processes"
    elsewhere: Elsewhere | None = None  # what the ranks say of the job's other nodes


# ------------------------------------------------------------------ choosing the scope


@dataclass(frozen=True)
class Scope:
    """The processes a spec takes in, and how to say what they are."""

    pids: list[int]
    what: str  # e.g. "pid 7 and its 3 descendants"
    nothing: str  # what to say when pids is empty: "no process has ..."
    hint: str = ""  # appended to that: what exists instead


def _scope(spec: JobSpec, table: ProcessTable, host: str) -> Scope:
    if spec.kind is JobKind.ENDPOINT:
        pids, nothing, hint = endpoint_scope(spec, table)
        return Scope(pids, f"MASTER_ADDR={spec.host} MASTER_PORT={spec.port}", nothing, hint)
    if spec.kind is JobKind.PID:
        pids, nothing, hint = _pid_scope(spec, table, host)
        return Scope(pids, f"pid {spec.pid} and its {len(pids) - 1} descendants", nothing, hint)
    pids, nothing, hint = slurm_scope(spec, table)
    return Scope(pids, str(spec), nothing, hint)


def _pid_scope(spec: JobSpec, table: ProcessTable, host: str) -> tuple[list[int], str, str]:
    assert spec.pid is not None
    if spec.pid not in table.procs:
        raise JobNotFound(f"no process with pid {spec.pid} on {host}")
    scope = [spec.pid] + [p.pid for p in table.descendants(spec.pid)]
    return scope, f"pid {spec.pid} and its descendants", ""


# ------------------------------------------------------------------ discovery


def _check_one_job(spec: JobSpec, selection: Selection, launchers: Mapping[int, int | None]) -> None:
    members = [Member(r.proc.pid, r.proc.env, launchers[r.proc.pid]) for r in selection.ranks]
    check_one_job(str(spec), members)


def _one_rank_note(spec: JobSpec, selection: Selection) -> list[Note]:
    if spec.kind is not JobKind.PID or len(selection.ranks) != 1:
        return []
    only = selection.ranks[0].proc
    if only.pid != spec.pid or not only.env or "MASTER_PORT" not in only.env:
        return []
    endpoint = f"{only.env.get('MASTER_ADDR', '?')}:{only.env['MASTER_PORT']}"
    return [Note(f"pid {spec.pid} is one rank; to see the whole job name it by {endpoint}", NoteKind.WIDENED)]


def _widen(
    spec: JobSpec, table: ProcessTable, scope: Scope, selection: Selection
) -> tuple[Selection, Note, str] | None:
    """A ``pid:``'s ranks widened to their job on this node (``wholejob.job_here``): the new
    selection, the note that says so and what was searched; None when the job has no other
    rank here, or the wider view would not keep the ranks the pid found."""
    job = job_here(table, selection.ranks)
    if job is None:
        return None
    uid = selection.ranks[0].proc.uid
    narrow = [pid for pid in scope.pids if table.procs[pid].uid == uid]
    wide = list(dict.fromkeys([*narrow, *job.pids]))
    if len(wide) == len(narrow):
        return None
    chosen = select_ranks(table, wide)
    found = {r.proc.pid for r in chosen.ranks}
    if len(found) <= len(selection.ranks) or not {r.proc.pid for r in selection.ranks} <= found:
        return None
    if job.spec is None or job.spec.startswith("pid:"):  # not one rendezvous: check it is one job
        try:
            launchers = {pid: launcher_of(table, pid, chosen.launchers) for pid in found}
            _check_one_job(spec, chosen, launchers)
        except MultipleJobs:
            return None
    mine = next((r for r in chosen.ranks if r.proc.pid == spec.pid), None)
    if mine is None:
        who = f"pid {spec.pid} started ranks of"
    elif mine.rank is None:
        who = f"pid {spec.pid} is a rank (number unknown) of"
    else:
        who = f"pid {spec.pid} is rank {mine.rank} of"
    note = f"{who} {job.name}; took in its {counted(len(chosen.ranks), 'rank', 'ranks')} on this node"
    if job.others:
        shown = ", ".join(f"pid {pid} (uid {table.procs[pid].uid})" for pid in job.others[:8])
        more = f" and {len(job.others) - 8} more" if len(job.others) > 8 else ""
        note += (
            f", not {counted(len(job.others), 'process', 'processes')} of other users "
            f"that name its rendezvous ({shown}{more})"
        )
    return chosen, Note(note, NoteKind.WIDENED), f"{scope.what}, widened to {job.name}"


def _keep_the_owners(
    spec: JobSpec, what: str, table: ProcessTable, selection: Selection, launchers: Mapping[int, int | None]
) -> list[Note]:
    """Leave out of ``selection`` the ranks of any user but the job's (``owners``); the note
    that names them, or a refusal when the job's user cannot be told."""
    groups = by_owner(table, (r.proc.pid for r in selection.ranks))
    if len(groups) < 2:
        return []
    owner = job_owner(
        table,
        (r.proc.pid for r in selection.ranks),
        launchers.values(),
        named_pid=spec.pid if spec.kind is JobKind.PID else None,
        port=spec.port if spec.kind is JobKind.ENDPOINT else None,
    )
    if owner is None:
        who = "; ".join(
            f"uid {uid}: pid {', '.join(map(str, pids[:4]))}{' ...' if len(pids) > 4 else ''}"
            for uid, pids in sorted(groups.items(), key=lambda g: (g[0] is None, g[0] or 0))
        )
        raise MultipleJobs(
            f"{what} takes in ranks of {len(groups)} users ({who}), and nothing here says whose "
            "job it is (no process of this node listens on its MASTER_PORT)",
            help="Name the job by pid:PID of its launcher or of one of its ranks, or diagnose it "
            "from the node whose process listens on MASTER_PORT.",
        )
    others = [pid for uid, pids in groups.items() if uid != owner.uid for pid in pids]
    selection.ranks = [r for r in selection.ranks if table.procs[r.proc.pid].uid == owner.uid]
    shown = ", ".join(f"pid {pid} (uid {table.procs[pid].uid})" for pid in others[:8])
    more = f" and {len(others) - 8} more" if len(others) > 8 else ""
    many = len(others) > 1
    note = (
        f"left out {len(others)} process{'es' if many else ''} of another user that "
        f"name{'' if many else 's'} this job ({shown}{more}): the job belongs to uid "
        f"{owner.uid}, {owner.how}; they were not read as ranks"
    )
    return [Note(note, NoteKind.OTHER_USER, pids=tuple(others))]


def _not_ranks_message(what: str, selection: Selection, table: ProcessTable) -> str:
    parts = [f"{describe(table.procs[pid])}: {why}" for pid, why in list(selection.rejected.items())[:4]]
    more = len(selection.rejected) - len(parts)
    tail = f"; {more} more" if more > 0 else ""
    return f"{what} matched {len(selection.rejected)} processes but none is a rank: {'; '.join(parts)}{tail}"


def discover(
    spec: JobSpec,
    host: str | None = None,
    table: ProcessTable | None = None,
    *,
    readable: Callable[[int], bool] | None = None,
) -> Discovery:
    """Find the ranks ``spec`` names on this node.

    Raises ``JobNotFound`` when there are none, ``PermissionDenied`` when there are none
    that can be read but some Python processes that may be ranks cannot, and
    ``MultipleJobs`` when a ``pid:`` or ``slurm:`` spec takes in ranks of several jobs.
    ``table`` is for callers that already read the process table (and for tests);
    ``readable`` is the caller's access policy (see ``read_process_table``).
    """
    host = host or socket.gethostname()
    if spec.kind is JobKind.RAY:
        assert spec.ray_job is not None
        found = job_processes_here(spec.ray_job, host)
        if readable is not None:
            found = tuple(p for p in found if readable(p.pid))
        if not found:
            raise JobNotFound(f"{spec}: no live actor of the job on this Ray node ({host})")
        return Discovery(found, None, (), f"the live actors of {spec} on this Ray node")
    if table is None:
        table = read_process_table(readable=readable)
    elif readable is not None:
        table = withhold(table, readable)
    scope = _scope(spec, table, host)
    counted = f"{len(table.procs)} processes, {table.unreadable} unreadable"
    searched = f"{scope.what} on {host} ({counted})"
    if not scope.pids:
        if hidden := unreadable(table.procs.values(), table):
            raise permission_denied(hidden, table, f"{scope.nothing} among the others; searched {counted} on {host}")
        raise JobNotFound(f"{scope.nothing}; searched {counted} on {host}{scope.hint}")

    selection = select_ranks(table, scope.pids)
    if not selection.ranks:
        if hidden := unreadable((table.procs[p] for p in scope.pids), table):
            raise permission_denied(hidden, table, f"searched {searched}")
        raise JobNotFound(_not_ranks_message(scope.what, selection, table))
    launchers = {r.proc.pid: launcher_of(table, r.proc.pid, selection.launchers) for r in selection.ranks}
    owner_notes = _keep_the_owners(spec, scope.what, table, selection, launchers)
    if spec.kind is not JobKind.ENDPOINT:  # an endpoint names one rendezvous already
        _check_one_job(spec, selection, launchers)
    scope_notes = _one_rank_note(spec, selection)
    if spec.kind is JobKind.PID and (widened := _widen(spec, table, scope, selection)):
        selection, widened_note, what = widened
        scope_notes = [widened_note]
        searched = f"{what} on {host} ({counted})"
        launchers = {r.proc.pid: launcher_of(table, r.proc.pid, selection.launchers) for r in selection.ranks}
    notes = (
        selection.notes
        + owner_notes
        + scope_notes
        + duplicate_notes(selection.ranks)
        + env_int_notes(r.proc for r in selection.ranks)
        + unreadable_notes(selection)
    )
    size = world_size(selection.ranks, notes)
    ranks = tuple(rank_process(r, host, launchers[r.proc.pid]) for r in selection.ranks)
    return Discovery(ranks, size, tuple(notes), searched, elsewhere(selection.ranks, size, host))
