"""What a process's start-up environment says about its rank, and what of it a rank keeps.

A rank's number comes from its start-up environment (``RANK``, ``SLURM_PROCID``,
``OMPI_COMM_WORLD_RANK``, ...), its world size and local rank likewise. These are read
strictly (``parse_env_int``): ASCII digits only, sizes from 1 to ``MAX_WORLD_SIZE``, ranks
below it; other values are ignored with a note (``env_int_notes``) and left out of the
environment a rank keeps (``select_env``: the distributed-debugging variables, not the
user's whole shell, secrets redacted).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ...digits import ASCII_DIGITS, bounded_int
from ...model import MAX_WORLD_SIZE, Note, NoteKind
from .jobsplit import pid_list
from .processes import ProcInfo
from .redact import redact_env

RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
WORLD_SIZE_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "SLURM_NPROCS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
LOCAL_WORLD_SIZE_VARS = ("LOCAL_WORLD_SIZE",)
NODE_RANK_VARS = ("GROUP_RANK", "NODE_RANK")

# Integer variables read here or downstream (analysis reads LOCAL_WORLD_SIZE, GROUP_RANK,
# ...): a value that is not one is ignored and left out of the rank's environment.
_RANK_INT_VARS = frozenset((*RANK_VARS, *LOCAL_RANK_VARS, "GROUP_RANK", "NODE_RANK", "ROLE_RANK", "SLURM_NODEID"))
_SIZE_INT_VARS = frozenset(
    (*WORLD_SIZE_VARS, "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "SLURM_NTASKS_PER_NODE")
)
_SHOWN_VALUE = 20  # characters of a bad value quoted in a note

# The environment variables a RankProcess keeps (then redacted): what distributed debugging
# needs, not the user's whole shell.
_ENV_NAMES = frozenset(
    (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "NODE_RANK",
        "NNODES",
        "OMP_NUM_THREADS",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "CONDA_DEFAULT_ENV",
        "TP_SOCKET_IFNAME",
        "HOSTNAME",
    )
)
_ENV_PREFIXES = (
    "MASTER_",
    "TORCHELASTIC_",
    "SLURM_",
    "SLURMD_",
    "OMPI_",
    "PMI_",
    "PMIX_",
    "NCCL_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "PYTORCH_",
    "GLOO_",
    "CUDA_",
    "NVIDIA_",
    "PYTHON",
    "OMP_",
    "MKL_",
    "KMP_",
    "UCX_",
    "FI_",
    "HSA_",
    "HIP_",
    "ROCR_",
    "RCCL_",
    "NVTE_",
    "ACCELERATE_",
    "DEEPSPEED_",
    "RAY_",
)


def parse_env_int(name: str, value: str) -> tuple[int | None, str]:
    """``(number, "")`` when ``value`` is a valid ``name`` (a rank or size variable), else
    ``(None, why)``. Strict: ASCII digits only (``str.isdigit()`` takes ``"²"``, which
    ``int()`` refuses), a size from 1 to ``MAX_WORLD_SIZE``, a rank below it."""
    text = value.strip()
    if not ASCII_DIGITS.fullmatch(text):
        return None, "not a whole number in ASCII digits"
    if name in _SIZE_INT_VARS:
        size = bounded_int(text, 1, MAX_WORLD_SIZE)
        return (size, "") if size is not None else (None, f"not a size from 1 to {MAX_WORLD_SIZE:,}")
    rank = bounded_int(text, 0, MAX_WORLD_SIZE - 1)
    return (rank, "") if rank is not None else (None, f"not a rank below {MAX_WORLD_SIZE:,}")


def _is_bad_int(name: str, value: str) -> bool:
    """A rank or size variable set (not empty) to something that is not one."""
    if name not in _RANK_INT_VARS and name not in _SIZE_INT_VARS or not value.strip():
        return False
    return parse_env_int(name, value)[0] is None


def env_int(env: Mapping[str, str] | None, names: Iterable[str]) -> tuple[str, int] | None:
    """The first of ``names`` set to a valid value (others are skipped; see ``env_int_notes``)."""
    if not env:
        return None
    for name in names:
        number, _ = parse_env_int(name, env.get(name, ""))
        if number is not None:
            return name, number
    return None


def env_rank(proc: ProcInfo) -> tuple[str, int] | None:
    """``("RANK", 3)`` from the first rank variable set in the start-up environment."""
    return env_int(proc.env, RANK_VARS)


def select_env(env: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    """The distributed-debugging variables of an environment, sorted, secrets redacted; rank
    and size variables that hold no valid number are left out (``env_int_notes`` says so)."""
    if not env:
        return ()
    chosen = sorted(
        (k, v) for k, v in env.items() if (k in _ENV_NAMES or k.startswith(_ENV_PREFIXES)) and not _is_bad_int(k, v)
    )
    return redact_env(chosen)


def env_int_notes(procs: Iterable[ProcInfo]) -> list[Note]:
    """One note per bad rank/size value in the processes' environments: it was ignored."""
    bad: dict[tuple[str, str], list[int]] = {}
    for proc in procs:
        for name, value in sorted((proc.env or {}).items()):
            if _is_bad_int(name, value):
                bad.setdefault((name, value), []).append(proc.pid)
    notes = []
    for (name, value), pids in bad.items():
        shown = repr(value[:_SHOWN_VALUE]) + ("..." if len(value) > _SHOWN_VALUE else "")
        notes.append(
            Note(
                f"{name}={shown} ignored and left out of the rank's environment ({parse_env_int(name, value)[1]})",
                NoteKind.BAD_ENV,
                pids=tuple(sorted(pids)),
                listed=pid_list(pids),
            )
        )
    return notes
