"""Which of the processes in a scope are ranks, and their numbers.

``select_ranks`` tells ranks apart from everything else a job runs:

- launchers (torchrun, srun-like task launchers, the parent of ``mp.spawn`` workers): the
  process above the ranks that has no rank of its own;
- children of a rank (DataLoader workers, compile workers, multiprocessing children): they
  inherit the rank's environment, so a process below a rank with the same rank identity
  is a child, not another rank;
- multiprocessing's resource tracker and forkserver, shells, anything not Python, and
  hangdoc's own processes (``hangdoc agent/diagnose/watch``, py-spy);
- processes whose environment cannot be read (the kernel refused, or the caller's
  ``readable`` predicate withholds them): they stay in the tree, so ancestry still works,
  but are never ranks. A scope that finds no rank because of them raises
  ``PermissionDenied`` (``permission_denied``), not ``JobNotFound``.

A rank's number comes from its start-up environment (``rankenv``).
``torch.multiprocessing.spawn`` children and scripts that set ``os.environ["RANK"]``
themselves have none there; their numbers are inferred and marked ``RankSource.INFERRED``:
from the local rank they were started with (``infer_local_ranks``), else from their place
among their siblings (``infer_spawn_ranks``). A launcher that is itself rank 0 (it starts its
other ranks with ``LOCAL_RANK`` 1, 2, ... and joins their rendezvous) is a rank, not a
launcher.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ...errors import PermissionDenied
from ...model import Note, NoteKind, RankProcess, RankSource, counted
from .jobsplit import pid_list, rendezvous_key
from .processes import (
    ProcessTable,
    ProcInfo,
    helper_kind,
    is_python,
    is_spawn_worker,
    launcher_name,
    tool_kind,
)
from .rankenv import (
    LOCAL_RANK_VARS,
    LOCAL_WORLD_SIZE_VARS,
    NODE_RANK_VARS,
    WORLD_SIZE_VARS,
    env_int,
    env_rank,
    select_env,
)
from .redact import redact_argv

# Why a Python process whose environment is not known is not a rank.
UNREADABLE_DENIED = "environment unreadable (permission denied)"
UNREADABLE_WITHHELD = "environment withheld from this caller"
# PermissionDenied's help when only the caller's access policy (``readable``) stood in the way.
WITHHELD_HELP = (
    "hangdoc shows this caller only the processes it may read: ask as the job's "
    "user, or have the operator of hangdoc grant this caller access to the job."
)


@dataclass(frozen=True)
class FoundRank:
    """A process chosen as a rank, before it becomes a RankProcess."""

    proc: ProcInfo
    rank: int | None
    source: RankSource | None
    evidence: str
    world_size: int | None
    local_rank: int | None


@dataclass
class Selection:
    """What ``select_ranks`` made of the processes in scope."""

    ranks: list[FoundRank]
    launchers: set[int]
    notes: list[Note]
    rejected: dict[int, str]  # pid -> why it is not a rank


# ------------------------------------------------------------------ telling ranks apart


def _not_a_rank_program(proc: ProcInfo, table: ProcessTable) -> str | None:
    """Why what ``proc`` runs is no rank (hangdoc, not Python, a launcher, a multiprocessing
    helper); None if it could be one."""
    if tool := tool_kind(proc):
        return f"{tool} itself"
    if not is_python(proc):
        return "not Python"
    if name := launcher_name(proc):
        return f"launcher {name}"
    return helper_kind(proc, table)


def _not_a_candidate(proc: ProcInfo, table: ProcessTable) -> str | None:
    """Why ``proc`` cannot be a rank, whatever its place in the tree; None if it can."""
    if why := _not_a_rank_program(proc, table):
        return why
    if proc.env is None:
        return UNREADABLE_WITHHELD if proc.pid in table.withheld else UNREADABLE_DENIED
    return None


def _could_be_rank(proc: ProcInfo, table: ProcessTable) -> bool:
    return _not_a_rank_program(proc, table) is None


def infer_spawn_ranks(table: ProcessTable, unranked: Iterable[int]) -> dict[int, FoundRank]:
    """Number spawn-style siblings that have no rank in their start-up environment.

    Siblings under the same Python parent that look like spawn workers (multiprocessing
    spawn command line, or all of the parent's children run the same command) are ranks
    0..n-1 in creation order (start time, then pid). This is a guess from process shape;
    a better source (the rank read from the process itself) should replace it.
    """
    groups: dict[int, list[ProcInfo]] = {}
    for pid in unranked:
        proc = table.procs[pid]
        groups.setdefault(proc.ppid, []).append(proc)
    found: dict[int, FoundRank] = {}
    for ppid, members in groups.items():
        parent = table.procs.get(ppid)
        if parent is None or not is_python(parent):
            continue
        siblings = [c for c in table.children(ppid) if helper_kind(c, table) is None]
        same_command = len(siblings) > 1 and len({c.cmdline for c in siblings}) == 1
        if not (any(is_spawn_worker(m) for m in members) or same_command):
            continue
        workers = [m for m in members if is_spawn_worker(m)]
        if workers:
            members = workers
        members.sort(key=lambda p: (p.create_time, p.pid))
        for index, proc in enumerate(members):
            evidence = f"inferred: spawn child #{index} of pid {ppid}, ordered by start time"
            found[proc.pid] = FoundRank(proc, index, RankSource.INFERRED, evidence, len(members), index)
    return found


def _local_rank(proc: ProcInfo) -> int | None:
    found = env_int(proc.env, LOCAL_RANK_VARS)
    return found[1] if found else None


def _from_local_rank(proc: ProcInfo, local: int, world: int | None, evidence: str) -> FoundRank:
    """A rank numbered by its local rank: offset by its node's (``GROUP_RANK`` or
    ``NODE_RANK`` times ``LOCAL_WORLD_SIZE``) where the environment gives both."""
    node = env_int(proc.env, NODE_RANK_VARS)
    per_node = env_int(proc.env, LOCAL_WORLD_SIZE_VARS)
    rank = local
    if node is not None and per_node is not None and node[1]:
        rank = node[1] * per_node[1] + local
        evidence += f", {node[0]}={node[1]} x {per_node[0]}={per_node[1]}"
    return FoundRank(proc, rank, RankSource.INFERRED, evidence, world, local)


def _world_of(procs: Iterable[ProcInfo]) -> int | None:
    sizes = [w[1] for p in procs if (w := env_int(p.env, WORLD_SIZE_VARS)) is not None]
    return max(sizes) if sizes else None


def infer_local_ranks(table: ProcessTable, unranked: Iterable[int]) -> dict[int, FoundRank]:
    """Number the processes that were started with a local rank but no rank.

    Siblings with distinct ``LOCAL_RANK``s (a launcher that sets only the local rank, or
    scripts that set ``RANK`` in code) are ranks by their local rank. Their parent, when it
    is an unnumbered candidate in the same rendezvous (``MASTER_ADDR``/``MASTER_PORT``, ...)
    and they are numbered 1, 2, ..., is local rank 0: a launcher that is itself a rank (it
    started the others and joins them). A lone process with a local rank is numbered only
    as such a child. A process with the local rank of a numbered ancestor inherited its
    environment: it is that rank's child (a DataLoader worker), left to the caller. World
    sizes come from ``WORLD_SIZE`` (never from counting processes).
    """
    candidates = set(unranked)
    groups: dict[int, list[tuple[ProcInfo, int]]] = {}
    for pid in candidates:
        proc = table.procs[pid]
        local = _local_rank(proc)
        if local is not None:
            groups.setdefault(proc.ppid, []).append((proc, local))
    found: dict[int, FoundRank] = {}

    def inherited(proc: ProcInfo, local: int) -> bool:
        return any(a.pid in found and found[a.pid].local_rank == local for a in table.ancestors(proc.pid))

    depth = {ppid: sum(1 for _ in table.ancestors(ppid)) for ppid in groups}
    for ppid in sorted(groups, key=lambda p: (depth[p], p)):
        members = [(p, n) for p, n in groups[ppid] if not inherited(p, n)]
        numbers = sorted(n for _, n in members)
        if not members or len(set(numbers)) != len(numbers):
            continue  # one local rank twice: workers of one rank, not ranks
        parent = table.procs.get(ppid)
        keys = {rendezvous_key(p.env) for p, _ in members}
        world = _world_of(p for p, _ in members)
        rank0 = (
            parent is not None
            and ppid in candidates
            and ppid not in found
            and _local_rank(parent) in (None, 0)
            and len(keys) == 1
            and None not in keys
            and rendezvous_key(parent.env) in keys
            and numbers == list(range(1, len(numbers) + 1))
        )
        if len(members) < 2 and not rank0:
            continue
        for proc, local in members:
            evidence = f"inferred: LOCAL_RANK={local} (no rank in its start-up environment)"
            found[proc.pid] = _from_local_rank(proc, local, world, evidence)
        if rank0:
            assert parent is not None
            shown = ", ".join(map(str, numbers))
            evidence = f"inferred: local rank 0: it started local ranks {shown} and shares their rendezvous"
            found[ppid] = _from_local_rank(parent, 0, _world_of([parent]) or world, evidence)
    return found


def _env_rank_of(proc: ProcInfo) -> FoundRank:
    key = env_rank(proc)
    assert key is not None
    world = env_int(proc.env, WORLD_SIZE_VARS)
    local = env_int(proc.env, LOCAL_RANK_VARS)
    return FoundRank(
        proc, key[1], RankSource.ENV, f"{key[0]}={key[1]}", world[1] if world else None, local[1] if local else None
    )


def select_ranks(table: ProcessTable, scope: Iterable[int]) -> Selection:
    """Split the processes in scope into ranks, launchers, children and the rest."""
    scope = list(dict.fromkeys(scope))
    rejected: dict[int, str] = {}
    candidates = []
    for pid in scope:
        proc = table.procs[pid]
        if why := _not_a_candidate(proc, table):
            rejected[pid] = why
        else:
            candidates.append(proc)

    # A Python ancestor with another rank identity (or none) above a ranked process is a
    # launcher; one with the same identity makes the process its child.
    launchers: set[int] = set()
    children: dict[int, ProcInfo] = {}
    for proc in candidates:
        identity = env_rank(proc)
        if identity is None:
            continue
        for anc in table.ancestors(proc.pid):
            if not _could_be_rank(anc, table):
                continue
            if env_rank(anc) == identity:
                children[proc.pid] = anc
            else:
                launchers.add(anc.pid)
    env_ranked = {
        p.pid: _env_rank_of(p)
        for p in candidates
        if env_rank(p) is not None and p.pid not in launchers and p.pid not in children
    }

    def below_rank(pid: int, ranked: Mapping[int, FoundRank]) -> ProcInfo | None:
        return next((a for a in table.ancestors(pid) if a.pid in ranked), None)

    unranked = [
        p.pid
        for p in candidates
        if p.pid not in env_ranked
        and p.pid not in launchers
        and p.pid not in children
        and below_rank(p.pid, env_ranked) is None
    ]
    local_ranked = infer_local_ranks(table, unranked)
    unranked = [pid for pid in unranked if pid not in local_ranked and below_rank(pid, local_ranked) is None]
    inferred = infer_spawn_ranks(table, unranked)
    # Inferred groups nested under other inferred ranks are those ranks' workers.
    inferred = {pid: r for pid, r in inferred.items() if below_rank(pid, inferred) is None}
    launchers |= {r.proc.ppid for r in inferred.values()}
    ranked: dict[int, FoundRank] = {**env_ranked, **local_ranked, **inferred}

    notes: list[Note] = []
    for proc in candidates:
        if proc.pid in ranked or proc.pid in launchers:
            continue
        parent_rank = children.get(proc.pid) or below_rank(proc.pid, ranked)
        if parent_rank is not None:
            identity = env_rank(parent_rank)
            rank = ranked[parent_rank.pid].rank if parent_rank.pid in ranked else (identity[1] if identity else None)
            rejected[proc.pid] = f"child of rank {rank} (pid {parent_rank.pid})"
        elif any(r.pid in ranked for r in table.descendants(proc.pid)):
            launchers.add(proc.pid)
        else:
            ranked[proc.pid] = FoundRank(proc, None, None, "no rank in its start-up environment", None, None)
            notes.append(
                Note(f"pid {proc.pid} has no rank in its start-up environment; its rank is unknown", NoteKind.NO_RANK)
            )
    for pid in launchers:
        if pid in table.procs and pid in scope:
            rejected.setdefault(pid, "launcher (starts ranks, has no rank itself)")
    kids = [(pid, why) for pid, why in rejected.items() if why.startswith("child of")]
    if kids:
        listed = "pid " + ", ".join(f"{pid} ({why})" for pid, why in kids)
        notes.append(
            Note(
                "not counted as ranks (DataLoader/compile/multiprocessing workers)",
                NoteKind.NOT_RANKS,
                pids=tuple(pid for pid, _ in kids),
                listed=listed,
            )
        )
    if inferred:
        notes.append(
            Note(
                f"ranks of {len(inferred)} spawn children were inferred from their start "
                "order (they have no RANK in their start-up environment); on several "
                "nodes these are local indices",
                NoteKind.SPAWN_ORDER,
            )
        )
    if local_ranked:
        notes.append(_local_ranks_note(local_ranked))
    return Selection(sorted(ranked.values(), key=_rank_order), launchers, notes, rejected)


def _local_ranks_note(found: Mapping[int, FoundRank]) -> Note:
    pids = sorted(found, key=lambda pid: (found[pid].rank or 0, pid))
    shown = ", ".join(f"{pid} (rank {found[pid].rank})" for pid in pids[:8])
    more = f" and {len(pids) - 8} more" if len(pids) > 8 else ""
    rank0 = [pid for pid in pids if any(r.proc.ppid == pid for r in found.values())]
    launcher = (
        (f"; pid {rank0[0]} started the others and shares their rendezvous: it is local rank 0, not a launcher")
        if rank0
        else ""
    )
    return Note(
        "ranks inferred from their local rank (no RANK in their start-up environment)",
        NoteKind.LOCAL_RANKS,
        pids=tuple(pids),
        listed=f"pid {shown}{more}{launcher}",
    )


def _rank_order(rank: FoundRank) -> tuple[bool, int, int]:
    return (rank.rank is None, rank.rank or 0, rank.proc.pid)


def launcher_of(table: ProcessTable, pid: int, launchers: set[int]) -> int | None:
    """The nearest ancestor of ``pid`` that is one of ``launchers`` or a known launcher."""
    for anc in table.ancestors(pid):
        if anc.pid in launchers or launcher_name(anc) is not None:
            return anc.pid
    return None


# ------------------------------------------------------------------ what the ranks say


def rank_process(found: FoundRank, host: str, launcher: int | None) -> RankProcess:
    """``found`` as the model's RankProcess: command line redacted, environment selected."""
    return RankProcess(
        pid=found.proc.pid,
        host=host,
        rank=found.rank,
        rank_source=found.source,
        rank_evidence=found.evidence,
        world_size=found.world_size,
        local_rank=found.local_rank,
        cmdline=redact_argv(found.proc.cmdline),
        env=select_env(found.proc.env),
        launcher_pid=launcher,
    )


def world_size(ranks: list[FoundRank], notes: list[Note]) -> int | None:
    """The largest world size the ranks give; a note in ``notes`` when they disagree."""
    sizes = sorted({r.world_size for r in ranks if r.world_size is not None})
    if len(sizes) > 1:
        notes.append(Note(f"ranks disagree on the world size: {', '.join(map(str, sizes))}"))
    return sizes[-1] if sizes else None


def duplicate_notes(ranks: list[FoundRank]) -> list[Note]:
    """One note per rank number that several processes claim."""
    by_rank: dict[int, list[int]] = {}
    for r in ranks:
        if r.rank is not None:
            by_rank.setdefault(r.rank, []).append(r.proc.pid)
    return [
        Note(
            f"rank {rank} is claimed by {len(pids)} processes (pids "
            f"{', '.join(map(str, pids))}): does the spec match more than one job?",
            NoteKind.RANK_CLAIMED,
            pids=tuple(pids),
        )
        for rank, pids in sorted(by_rank.items())
        if len(pids) > 1
    ]


# ------------------------------------------------------------------ unreadable processes


def unreadable(procs: Iterable[ProcInfo], table: ProcessTable) -> list[ProcInfo]:
    """The processes that could be ranks but whose environment is unknown."""
    return [p for p in procs if _not_a_candidate(p, table) in (UNREADABLE_DENIED, UNREADABLE_WITHHELD)]


def permission_denied(procs: list[ProcInfo], table: ProcessTable, rest: str) -> PermissionDenied:
    """The job may be among ``procs``, the ``unreadable`` ones: say that first, then ``rest``
    (what was searched). Withheld processes are counted, not named: the caller may not see
    them."""
    denied = [p.pid for p in procs if p.pid not in table.withheld]
    withheld = len(procs) - len(denied)
    parts = []
    if denied:
        parts.append(
            f"permission denied reading the environment of {_python_processes(len(denied))} ({pid_list(denied)})"
        )
    if withheld:
        parts.append(f"this caller may not read {_python_processes(withheld)}")
    message = f"{' and '.join(parts)}: the job's ranks may be among them; {rest}"
    if denied:
        return PermissionDenied(message)
    return PermissionDenied(message, help=WITHHELD_HELP)


def _python_processes(count: int) -> str:
    return counted(count, "Python process", "Python processes")


def unreadable_notes(selection: Selection) -> list[Note]:
    """Processes in scope that may be ranks of the job but could not be read."""
    unknown = {pid: why for pid, why in selection.rejected.items() if pid not in selection.launchers}
    denied = [pid for pid, why in unknown.items() if why == UNREADABLE_DENIED]
    withheld = sum(1 for why in unknown.values() if why == UNREADABLE_WITHHELD)
    notes = []
    if denied:
        notes.append(
            Note(
                "not counted as ranks, their environment could not be read (permission denied)",
                NoteKind.UNREADABLE,
                pids=tuple(sorted(denied)),
                listed=pid_list(denied),
            )
        )
    if withheld:
        notes.append(
            Note(f"not counted as ranks: {_python_processes(withheld)} this caller may not read", NoteKind.UNREADABLE)
        )
    return notes
