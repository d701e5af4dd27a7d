"""Which processes of a dump file are ranks, and which rank each one is.

A dump shows no environment, so a process's rank is read from what the file does show,
first found wins:

1. its command line (py-spy's ``Process`` line, ``ray stack``'s ps line, the JSON's
   ``process_info``): an environment assignment (``RANK=3 python train.py``,
   ``SLURM_PROCID=3``) or a flag (``--rank 3``, ``--global-rank=3``);
2. the label just before its dump, when it names one rank (``=== rank 3 ===``,
   ``[rank3]``, ``Rank 3:``, and as ``dumplabels`` reads them ``TP0``, ``worker-2``), or
   the rank a pasted stack's label gave it (``dumpcondensed``);
3. a local rank on its command line (``--local_rank=3``, as DeepSpeed's launcher passes
   it, or ``LOCAL_RANK=3``), when no process shows a global one: one node is assumed;
4. otherwise the order of the dumps in the file.

The numbers of 1-3 are used only when every process has one and no two share one (a LoRA
script's ``--rank 16`` is the same on every process); otherwise the file's order is, and
the notes say why. The world size is read the same way (``WORLD_SIZE=4``,
``--world-size 4``) when every process that shows one agrees.

Processes that are not ranks are left out, by what their stacks or command lines show:
DataLoader workers (torch's ``_worker_loop``), launchers (torchrun's elastic agent,
``mp.spawn``'s parent), idle Ray workers (``ray::IDLE``) and, in ``ray stack`` output, Ray
workers of other actor classes than the ones in ``torch.distributed``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ...digits import bounded_int
from ...model import MAX_WORLD_SIZE, PID_MAX, RankSource, ThreadStack
from ..find.rankenv import LOCAL_RANK_VARS, RANK_VARS, WORLD_SIZE_VARS, parse_env_int
from .dumped import ProcessDump
from .dumplabels import LabelIndex, label_ranks

_RANK_FLAGS = ("rank", "global_rank")
_LOCAL_FLAGS = ("local_rank",)
_WORLD_FLAGS = ("world_size",)
_LABEL_RANK = re.compile(r"(?<![A-Za-z0-9_-])rank[\s:=#_-]*(\d{1,7})(?!\d)", re.IGNORECASE)
_LABEL_PID = re.compile(r"(?<![A-Za-z0-9_-])pid[\s:=#_-]*(\d{1,10})(?!\d)", re.IGNORECASE)
_RAY_ACTOR = re.compile(r"ray::([A-Za-z_][\w]*)")
_TORCH_DIST = "torch/distributed/"
_LAUNCHERS = ("torch/distributed/elastic/agent/", "torch/distributed/run.py", "torch/distributed/launch.py")
_SPAWN = "torch/multiprocessing/spawn.py"
_WORKER = "torch/utils/data/_utils/worker.py"


@dataclass(frozen=True)
class Hint:
    """What a process's command line and label say about it."""

    rank: int | None = None
    rank_words: str = ""  # where it was read, for ``RankProcess.rank_evidence``
    rank_is_env: bool = False  # an environment assignment (``RANK=3``), not a flag or label
    local_rank: int | None = None
    local_words: str = ""
    world_size: int | None = None
    pid: int | None = None  # a pid the label names ("pid 4711")
    env: tuple[tuple[str, str], ...] = ()  # the rank and size variables shown


@dataclass(frozen=True)
class Numbering:
    """The rank of each process, in the file's order, and how they were found."""

    ranks: tuple[tuple[int, RankSource, str], ...]  # (rank, source, evidence) per process
    world_size: int | None
    note: str


def hint(cmdline: str, label: str) -> Hint:
    """What ``cmdline`` and ``label`` say about a process's rank, local rank and world size."""
    rank = local = world = None
    rank_words = local_words = ""
    rank_is_env = False
    env: list[tuple[str, str]] = []
    tokens = cmdline.split()
    for i, token in enumerate(tokens):
        name, eq, value = token.partition("=")
        if eq and name in (*RANK_VARS, *LOCAL_RANK_VARS, *WORLD_SIZE_VARS):
            number, _ = parse_env_int(name, value)
            if number is None:
                continue
            env.append((name, value))
            if name in RANK_VARS and rank is None:
                rank, rank_words, rank_is_env = number, f"{token} on its command line", True
            elif name in LOCAL_RANK_VARS and local is None:
                local, local_words = number, f"{token} on its command line"
            elif name in WORLD_SIZE_VARS and world is None:
                world = number
            continue
        if not token.startswith("--"):
            continue
        flag = name[2:].replace("-", "_").lower()
        if eq:
            text, shown = value, token
        elif i + 1 < len(tokens):
            text, shown = tokens[i + 1], f"{token} {tokens[i + 1]}"
        else:
            continue
        if flag in _WORLD_FLAGS and world is None:
            world = bounded_int(text, 1, MAX_WORLD_SIZE)
            continue
        number = bounded_int(text, 0, MAX_WORLD_SIZE - 1)
        if number is None:
            continue
        if flag in _RANK_FLAGS and rank is None:
            rank, rank_words = number, f"{shown} on its command line"
        elif flag in _LOCAL_FLAGS and local is None:
            local, local_words = number, f"{shown} on its command line"
    if rank is None:
        named = {int(m.group(1)) for m in _LABEL_RANK.finditer(label)}
        if len(named) == 1 and (number := named.pop()) < MAX_WORLD_SIZE:
            line = next(ln for ln in label.splitlines() if _LABEL_RANK.search(ln))
            rank, rank_words = number, f"the line {line[:80]!r} before its dump"
        elif not named:
            rank, rank_words = _other_label_rank(label)
    pids = {int(m.group(1)) for m in _LABEL_PID.finditer(label)}
    pid = pids.pop() if len(pids) == 1 else None
    return Hint(
        rank,
        rank_words,
        rank_is_env,
        local,
        local_words,
        world,
        pid if pid is not None and 0 < pid <= PID_MAX else None,
        tuple(env),
    )


def _other_label_rank(label: str) -> tuple[int | None, str]:
    """The one rank a TP, GPU or worker label names (``[2025-03-10 16:29:01 TP0] Pyspy dump
    for PID 4711:``), the nearest line first; (None, "") when none names one."""
    for line in reversed(label.splitlines()):
        found = label_ranks(line)
        if (
            found is not None and found.kind in (LabelIndex.TP, LabelIndex.WORKER) and len(found.ranks) == 1
        ):  # a local rank or GPU alone is not the rank
            return found.ranks[0], f"the line {line[:80]!r} before its dump ({found.kind.value})"
    return None, ""


def dump_hint(dump: ProcessDump) -> Hint:
    """What ``dump`` shows of its rank: its command line and label (``hint``), or the rank
    and world size a pasted stack's label and text gave it."""
    found = hint(dump.cmdline, dump.label) if dump.rank is None else Hint(dump.rank, dump.rank_words)
    if found.world_size is None and dump.world_size is not None:
        found = Hint(
            found.rank,
            found.rank_words,
            found.rank_is_env,
            found.local_rank,
            found.local_words,
            dump.world_size,
            found.pid,
            found.env,
        )
    return found


def number(hints: Sequence[Hint]) -> Numbering:
    """Each process's rank (see the module docstring), and a note on how they were found."""
    n = len(hints)
    worlds = {h.world_size for h in hints if h.world_size is not None}
    world = worlds.pop() if len(worlds) == 1 else None
    shown = [h.rank for h in hints]
    if n and all(r is not None for r in shown) and len(set(shown)) == n:
        ranks = tuple(
            (h.rank or 0, RankSource.ENV if h.rank_is_env else RankSource.INFERRED, h.rank_words) for h in hints
        )
        on_line = {"command line" in h.rank_words for h in hints}
        where = (
            "each process's command line"
            if on_line == {True}
            else "the line before each dump"
            if on_line == {False}
            else "command lines and the lines before the dumps"
        )
        return Numbering(ranks, world, f"ranks read from {where}")
    local = [h.local_rank for h in hints]
    if n and all(r is None for r in shown) and all(r is not None for r in local) and len(set(local)) == n:
        ranks = tuple((h.local_rank or 0, RankSource.INFERRED, f"{h.local_words} (one node assumed)") for h in hints)
        return Numbering(ranks, world, "ranks read from the local ranks on the command lines: one node assumed")
    why = (
        "no process shows its rank"
        if all(r is None for r in shown)
        else "ranks shown on only some processes"
        if None in shown
        else "processes show the same rank"
    )
    return Numbering(
        tuple((i, RankSource.INFERRED, f"dump {i + 1} of {n} in the file") for i in range(n)),
        world,
        f"ranks taken from the order of the dumps in the file ({why}): rank numbers, "
        "and so the culprits' numbers, may not be the job's",
    )


def not_a_rank(threads: Sequence[ThreadStack], cmdline: str) -> str | None:
    """Why a process is not a rank, by its stacks and command line; None when it may be one."""
    if cmdline.startswith("ray::IDLE"):
        return "an idle Ray worker"
    frames = [f for th in threads for f in th.frames if not f.native]
    paths = {(f.origin.module_path, f.function.rsplit(".", 1)[-1]) for f in frames}
    if any(path == _WORKER and name == "_worker_loop" for path, name in paths):
        return "a DataLoader worker"
    main = next((th for th in threads if th.is_main), None)
    main_paths = {f.origin.module_path for f in main.frames} if main else set()
    if any(p.startswith(_LAUNCHERS) for p in main_paths):
        return "a launcher (torchrun's elastic agent)"
    spawn = {name for path, name in paths if path == _SPAWN}
    if spawn & {"start_processes", "spawn", "join"} and "_wrap" not in spawn:
        return "a launcher (mp.spawn's parent)"
    return None


def uses_torch_distributed(threads: Sequence[ThreadStack]) -> bool:
    return any(f.origin.under(_TORCH_DIST) for th in threads for f in th.frames)


def ray_actor(cmdline: str) -> str | None:
    """The actor class (or task) a Ray worker's command line names (``ray::Trainer.step``)."""
    m = _RAY_ACTOR.match(cmdline)
    return m.group(1) if m else None


def ray_training_classes(dumps: Sequence[ProcessDump]) -> set[str]:
    """The actor classes of the Ray workers that are in torch.distributed."""
    return {actor for d in dumps if (actor := ray_actor(d.cmdline)) and uses_torch_distributed(d.threads)}
