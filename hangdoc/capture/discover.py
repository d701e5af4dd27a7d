"""Find the rank processes of a job on this node.

Discovery reads the process table once (psutil: parent, command line, start time and the
start-up environment from ``/proc/PID/environ``; kernel threads, by their ``PF_KTHREAD``
flag, are left out), selects the processes the job spec names, and tells ranks apart from
everything else a job runs:

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
  ``PermissionDenied``, not ``JobNotFound``.

A rank's number comes from its start-up environment (``RANK``, ``SLURM_PROCID``, ...),
read strictly: ASCII digits only, sizes from 1 to ``MAX_WORLD_SIZE``; other values are
ignored with a note and left out of the rank's environment. ``torch.multiprocessing.spawn``
children and scripts that set ``os.environ["RANK"]`` themselves have none there; their
numbers are inferred (``infer_spawn_ranks``) and marked ``RankSource.INFERRED``.

A ``pid:`` or ``slurm:`` scope may hold the ranks of several jobs; ``hangdoc.jobsplit``
tells them apart by rendezvous and refuses (``MultipleJobs``) rather than merge them.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import psutil

from ..errors import JobNotFound, PermissionDenied, UsageError
from ..model import MAX_WORLD_SIZE, RankProcess, RankSource
from .jobspec import JobKind, JobSpec
from .jobsplit import Member, MultipleJobs, check_one_job, pid_list, plural
from .redact import redact_argv, redact_env

__all__ = ["Discovery", "MultipleJobs", "ProcInfo", "ProcessTable", "discover",
           "read_process_table", "select_ranks"]  # MultipleJobs: discover() raises it

RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
WORLD_SIZE_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "SLURM_NPROCS", "OMPI_COMM_WORLD_SIZE",
                   "PMI_SIZE")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")

# Integer variables read here or downstream (analysis reads LOCAL_WORLD_SIZE, GROUP_RANK,
# ...): a value that is not one is ignored and left out of the rank's environment.
_RANK_INT_VARS = frozenset((*RANK_VARS, *LOCAL_RANK_VARS, "GROUP_RANK", "NODE_RANK",
                            "ROLE_RANK", "SLURM_NODEID"))
_SIZE_INT_VARS = frozenset((*WORLD_SIZE_VARS, "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE",
                            "ROLE_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"))
_ASCII_NUMBER = re.compile(r"[0-9]+")  # not str.isdigit(), which takes "²" and "٣"
_SHOWN_VALUE = 20  # characters of a bad value quoted in a note
# Why a Python process whose environment is not known is not a rank.
UNREADABLE_DENIED = "environment unreadable (permission denied)"
UNREADABLE_WITHHELD = "environment withheld from this caller"
# PermissionDenied's help when only the caller's access policy (``readable``) stood in the way.
WITHHELD_HELP = ("hangdoc shows this caller only the processes it may read: ask as the job's "
                 "user, or have the operator of hangdoc grant this caller access to the job.")

# The environment variables a RankProcess keeps (then redacted): what distributed debugging
# needs, not the user's whole shell.
_ENV_NAMES = frozenset((
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "NODE_RANK", "NNODES", "OMP_NUM_THREADS",
    "LD_PRELOAD", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV",
    "TP_SOCKET_IFNAME", "HOSTNAME",
))
_ENV_PREFIXES = (
    "MASTER_", "TORCHELASTIC_", "SLURM_", "SLURMD_", "OMPI_", "PMI_", "PMIX_", "NCCL_",
    "TORCH_", "TORCHINDUCTOR_", "PYTORCH_", "GLOO_", "CUDA_", "NVIDIA_", "PYTHON", "OMP_",
    "MKL_", "KMP_", "UCX_", "FI_", "HSA_", "HIP_", "ROCR_", "RCCL_", "NVTE_", "ACCELERATE_",
    "DEEPSPEED_", "RAY_",
)

_PYTHON_NAME = re.compile(r"^(python|pypy)(\d+(\.\d+)*)?[dmu]*$")
# Programs and python modules that start ranks without being one.
_LAUNCHER_PROGRAMS = frozenset((
    "torchrun", "deepspeed", "accelerate", "srun", "mpirun", "mpiexec", "orterun", "prterun",
    "prted", "orted", "hydra_pmi_proxy", "pmi_proxy", "slurmstepd",
))
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch",
                     "torch.distributed.elastic", "deepspeed.launcher", "accelerate.commands")
_TRACKERS = ("multiprocessing.resource_tracker", "multiprocessing.semaphore_tracker")
_FORKSERVER = "multiprocessing.forkserver"
_SPAWN_MARKERS = ("multiprocessing.spawn", "spawn_main", "--multiprocessing-fork")
# Interpreter options that take a value (python -W ignore -X dev script.py).
_PYTHON_VALUE_OPTIONS = frozenset(("-W", "-X", "-Q"))
# hangdoc's own processes (its entry point, python -m hangdoc[.cli]) and the py-spy it runs.
_HANGDOC = "hangdoc"
_PYSPY_PROGRAMS = frozenset(("py-spy", "py_spy"))
# include/linux/sched.h: "I am a kernel thread", in /proc/PID/stat field 9 (flags).
PF_KTHREAD = 0x00200000


@dataclass(frozen=True)
class ProcInfo:
    """One row of the process table as discovery read it."""

    pid: int
    ppid: int
    name: str
    exe: str
    cmdline: tuple[str, ...]
    create_time: float
    env: Mapping[str, str] | None = field(default=None, compare=False, hash=False)
    """The start-up environment; None when it could not be read."""


@dataclass
class ProcessTable:
    """Every (non-kernel) process of this node, with parent/child links."""

    procs: dict[int, ProcInfo]
    unreadable: int = 0  # processes whose environment could not be read (or was withheld)
    withheld: frozenset[int] = frozenset()  # of those, the pids the caller may not read

    @functools.cached_property
    def _children(self) -> dict[int, list[int]]:
        kids: dict[int, list[int]] = {}
        for proc in self.procs.values():
            kids.setdefault(proc.ppid, []).append(proc.pid)
        return kids

    def children(self, pid: int) -> list[ProcInfo]:
        return [self.procs[c] for c in self._children.get(pid, ())]

    def descendants(self, pid: int) -> list[ProcInfo]:
        out: list[ProcInfo] = []
        todo = [pid]
        seen = {pid}
        while todo:
            for child in self.children(todo.pop()):
                if child.pid not in seen:
                    seen.add(child.pid)
                    out.append(child)
                    todo.append(child.pid)
        return out

    def ancestors(self, pid: int) -> Iterator[ProcInfo]:
        """Parent first, up to (not including) pid 1."""
        seen = {pid}
        proc = self.procs.get(pid)
        while proc is not None and proc.ppid > 1 and proc.ppid not in seen:
            seen.add(proc.ppid)
            proc = self.procs.get(proc.ppid)
            if proc is not None:
                yield proc


@dataclass(frozen=True)
class Discovery:
    """The rank processes of a job on this node and how they were found."""

    ranks: tuple[RankProcess, ...]  # sorted by rank, unknown ranks last
    world_size: int | None
    notes: tuple[str, ...]
    searched: str  # what was looked at, e.g. "MASTER_ADDR=h MASTER_PORT=p on vm: 213 processes"


# ------------------------------------------------------------------ the process table


def stat_flags(pid: int) -> int | None:
    """The kernel's per-process flags (``/proc/PID/stat`` field 9), or None if unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            line = stat.read()
        # comm (field 2) is in parentheses and may hold spaces and ")": split after the last
        return int(line[line.rindex(b")") + 2:].split()[6])
    except (OSError, ValueError, IndexError):
        return None


def _is_kernel_thread(pid: int, cmdline: Iterable[str] | None) -> bool:
    """The kernel's own marker, PF_KTHREAD, is set; not "parent is pid 2", which in a container
    is an ordinary process. Kernel threads have no command line, so others are not read."""
    if cmdline:
        return False
    flags = stat_flags(pid)
    return flags is not None and bool(flags & PF_KTHREAD)


def read_process_table(exclude: Iterable[int] = (), *,
                       readable: Callable[[int], bool] | None = None) -> ProcessTable:
    """Read every process once; environments that cannot be read are counted, not fatal.

    ``readable`` is a caller's access policy: a process for which ``readable(pid)`` is False
    stays in the tree (ancestry and descendants still work) but its environment is not read,
    exactly as if the kernel had refused it, and it is recorded in ``withheld``.
    """
    skip = set(exclude) | {os.getpid()}
    procs: dict[int, ProcInfo] = {}
    withheld: set[int] = set()
    attrs = ["pid", "ppid", "name", "exe", "cmdline", "create_time", "status"]
    for proc in psutil.process_iter(attrs):
        info = proc.info
        pid = info["pid"]
        if pid in skip or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if _is_kernel_thread(pid, info["cmdline"]):
            continue
        env: Mapping[str, str] | None = None
        if readable is not None and not readable(pid):
            withheld.add(pid)
        else:
            try:
                env = proc.environ()
            except psutil.NoSuchProcess:
                continue
            except (psutil.AccessDenied, OSError):
                pass  # env stays None: counted as unreadable
        procs[pid] = ProcInfo(
            pid=pid,
            ppid=info["ppid"] or 0,
            name=info["name"] or "",
            exe=info["exe"] or "",
            cmdline=tuple(info["cmdline"] or ()),
            create_time=info["create_time"] or 0.0,
            env=env,
        )
    unreadable = sum(1 for p in procs.values() if p.env is None)
    return ProcessTable(procs, unreadable, frozenset(withheld))


def withhold(table: ProcessTable, readable: Callable[[int], bool]) -> ProcessTable:
    """``table`` as a caller sees it for whom ``readable(pid)`` is False for some processes:
    their environments dropped and counted as unreadable, as ``read_process_table`` does."""
    hidden = {pid for pid in table.procs if not readable(pid)}
    if not hidden:
        return table
    newly = sum(1 for pid in hidden if table.procs[pid].env is not None)
    procs = {pid: dataclasses.replace(p, env=None) if pid in hidden else p
             for pid, p in table.procs.items()}
    return ProcessTable(procs, table.unreadable + newly, table.withheld | hidden)


# ------------------------------------------------------------------ what a process is


def is_python(proc: ProcInfo) -> bool:
    """The executable, argv[0] or process name is a Python interpreter."""
    names = [os.path.basename(proc.exe), proc.name]
    if proc.cmdline:
        names.append(os.path.basename(proc.cmdline[0]))
    return any(_PYTHON_NAME.match(n) for n in names if n)


def python_target(cmdline: tuple[str, ...]) -> str | None:
    """What a python command line runs: ``-m module``, ``-c``, the script path, or None."""
    args = iter(cmdline[1:])
    for arg in args:
        if arg == "-m":
            return f"-m {next(args, '')}"
        if arg == "-c" or (arg.startswith("-") and not arg.startswith("--") and arg.endswith("c")
                           and arg[1:].isalpha()):
            return "-c"
        if arg in _PYTHON_VALUE_OPTIONS:
            next(args, None)
            continue
        if arg.startswith("-m") and len(arg) > 2:
            return f"-m {arg[2:]}"
        if arg.startswith("-"):
            continue
        return arg
    return None


def launcher_name(proc: ProcInfo) -> str | None:
    """The launcher a process is known to be (torchrun, srun, ...), from its command line."""
    program = os.path.basename(proc.cmdline[0]) if proc.cmdline else proc.name
    if program in _LAUNCHER_PROGRAMS:
        return program
    if not is_python(proc):
        return None
    target = python_target(proc.cmdline) or ""
    if target.startswith("-m "):
        module = target[3:]
        return module if module.startswith(_LAUNCHER_MODULES) else None
    script = os.path.basename(target)
    return script if script in _LAUNCHER_PROGRAMS else None


def helper_kind(proc: ProcInfo, table: ProcessTable) -> str | None:
    """multiprocessing's resource tracker or forkserver (not its forked workers)."""
    line = " ".join(proc.cmdline)
    if any(marker in line for marker in _TRACKERS):
        return "multiprocessing resource tracker"
    if _FORKSERVER in line:
        parent = table.procs.get(proc.ppid)
        if parent is None or _FORKSERVER not in " ".join(parent.cmdline):
            return "multiprocessing forkserver"
    return None


def tool_kind(proc: ProcInfo) -> str | None:
    """``"hangdoc"`` (agent, diagnose, watch: its entry point or ``python -m hangdoc``) or
    ``"py-spy"``: hangdoc's own processes, never ranks nor launchers."""
    program = os.path.basename(proc.cmdline[0]) if proc.cmdline else proc.name
    if program in _PYSPY_PROGRAMS or os.path.basename(proc.exe) in _PYSPY_PROGRAMS:
        return "py-spy"
    if program == _HANGDOC:
        return _HANGDOC
    if not is_python(proc):
        return None
    target = python_target(proc.cmdline) or ""
    if target == f"-m {_HANGDOC}" or target.startswith(f"-m {_HANGDOC}."):
        return _HANGDOC
    return _HANGDOC if os.path.basename(target) == _HANGDOC else None


def parse_env_int(name: str, value: str) -> tuple[int | None, str]:
    """``(number, "")`` when ``value`` is a valid ``name`` (a rank or size variable), else
    ``(None, why)``. Strict: ASCII digits only (``str.isdigit()`` takes ``"²"``, which
    ``int()`` refuses), a size from 1 to ``MAX_WORLD_SIZE``, a rank below it."""
    text = value.strip()
    if not _ASCII_NUMBER.fullmatch(text):
        return None, "not a whole number in ASCII digits"
    digits = text.lstrip("0") or "0"
    too_long = len(digits) > len(str(MAX_WORLD_SIZE))  # checked before int(): no huge parses
    number = MAX_WORLD_SIZE + 1 if too_long else int(digits)
    if name in _SIZE_INT_VARS:
        if not 1 <= number <= MAX_WORLD_SIZE:
            return None, f"not a size from 1 to {MAX_WORLD_SIZE:,}"
    elif number >= MAX_WORLD_SIZE:
        return None, f"not a rank below {MAX_WORLD_SIZE:,}"
    return number, ""


def _is_bad_int(name: str, value: str) -> bool:
    """A rank or size variable set (not empty) to something that is not one."""
    if name not in _RANK_INT_VARS and name not in _SIZE_INT_VARS or not value.strip():
        return False
    return parse_env_int(name, value)[0] is None


def _env_int(env: Mapping[str, str] | None, names: Iterable[str]) -> tuple[str, int] | None:
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
    return _env_int(proc.env, RANK_VARS)


def _could_be_rank(proc: ProcInfo, table: ProcessTable) -> bool:
    return is_python(proc) and launcher_name(proc) is None and \
        helper_kind(proc, table) is None and tool_kind(proc) is None


def _describe(proc: ProcInfo) -> str:
    return f"pid {proc.pid} ({proc.name or os.path.basename(proc.exe) or '?'})"


# ------------------------------------------------------------------ choosing the scope


@functools.lru_cache(maxsize=64)
def _addresses(name: str) -> frozenset[str]:
    try:
        return frozenset(str(info[4][0]) for info in socket.getaddrinfo(name, None))
    except (OSError, UnicodeError):
        return frozenset()


@functools.lru_cache(maxsize=1)
def _local_names() -> frozenset[str]:
    hostname = socket.gethostname().lower()
    names = {"localhost", "localhost.localdomain", "0.0.0.0", "::", hostname,
             hostname.split(".")[0]}
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            if addr.family in (socket.AF_INET, socket.AF_INET6):
                names.add(addr.address.split("%")[0].lower())
    return frozenset(names)


def _normalise_host(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _is_local(host: str) -> bool:
    if host in _local_names():
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def same_host(a: str, b: str) -> bool:
    """Loose host equality: the node's own names/addresses are all equal; names resolve."""
    a, b = _normalise_host(a), _normalise_host(b)
    if a == b or (_is_local(a) and _is_local(b)):
        return True
    if _is_ip(a) and _is_ip(b):
        return False
    addrs_a = {a} if _is_ip(a) else _addresses(a)
    addrs_b = {b} if _is_ip(b) else _addresses(b)
    return bool(addrs_a & addrs_b)


def _endpoint_scope(spec: JobSpec, table: ProcessTable) -> tuple[list[int], str, str]:
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


def _pid_scope(spec: JobSpec, table: ProcessTable, host: str) -> tuple[list[int], str, str]:
    assert spec.pid is not None
    if spec.pid not in table.procs:
        raise JobNotFound(f"no process with pid {spec.pid} on {host}")
    scope = [spec.pid] + [p.pid for p in table.descendants(spec.pid)]
    return scope, f"pid {spec.pid} and its descendants", ""


def _scontrol_pids(job: str) -> list[int] | None:
    if shutil.which("scontrol") is None:
        return None
    try:
        out = subprocess.run(["scontrol", "listpids", job], capture_output=True, text=True,
                             timeout=5, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [int(line.split()[0]) for line in out.splitlines()
            if line.strip() and _ASCII_NUMBER.fullmatch(line.split()[0])]


def _slurm_env_matches(env: Mapping[str, str], job: str, step: str | None) -> bool:
    if "_" in job:
        array_job, task = job.split("_", 1)
        if (env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")) != (array_job, task):
            return False
    elif env.get("SLURM_JOB_ID", env.get("SLURM_JOBID")) != job:
        return False
    return step is None or env.get("SLURM_STEP_ID", env.get("SLURM_STEPID")) == step


def _slurm_scope(spec: JobSpec, table: ProcessTable) -> tuple[list[int], str, str]:
    assert spec.slurm_job is not None
    name = str(spec)[len("slurm:"):]
    listed = _scontrol_pids(name)
    if listed is not None:
        scope = [p for p in listed if p in table.procs]
        return scope, f"no process in `scontrol listpids {name}`", ""
    scope = [p.pid for p in table.procs.values()
             if p.env and _slurm_env_matches(p.env, spec.slurm_job, spec.slurm_step)]
    step = f" SLURM_STEP_ID={spec.slurm_step}" if spec.slurm_step is not None else ""
    return scope, f"no process has SLURM_JOB_ID={spec.slurm_job}{step}", ""


# ------------------------------------------------------------------ telling ranks apart


@dataclass(frozen=True)
class FoundRank:
    """A process chosen as a rank, before it becomes a RankProcess."""

    proc: ProcInfo
    rank: int | None
    source: RankSource | None
    evidence: str
    world_size: int | None
    local_rank: int | None


def _is_spawn_worker(proc: ProcInfo) -> bool:
    line = " ".join(proc.cmdline)
    return any(marker in line for marker in _SPAWN_MARKERS) or _FORKSERVER in line


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
        if not (any(_is_spawn_worker(m) for m in members) or same_command):
            continue
        workers = [m for m in members if _is_spawn_worker(m)]
        if workers:
            members = workers
        members.sort(key=lambda p: (p.create_time, p.pid))
        for index, proc in enumerate(members):
            evidence = (f"inferred: spawn child #{index} of pid {ppid}, ordered by start time")
            found[proc.pid] = FoundRank(proc, index, RankSource.INFERRED, evidence, len(members),
                                    index)
    return found


def _env_rank_of(proc: ProcInfo) -> FoundRank:
    key = env_rank(proc)
    assert key is not None
    world = _env_int(proc.env, WORLD_SIZE_VARS)
    local = _env_int(proc.env, LOCAL_RANK_VARS)
    return FoundRank(proc, key[1], RankSource.ENV, f"{key[0]}={key[1]}",
                 world[1] if world else None, local[1] if local else None)


@dataclass
class Selection:
    """What ``select_ranks`` made of the processes in scope."""

    ranks: list[FoundRank]
    launchers: set[int]
    notes: list[str]
    rejected: dict[int, str]  # pid -> why it is not a rank


def _not_a_candidate(proc: ProcInfo, table: ProcessTable) -> str | None:
    """Why ``proc`` cannot be a rank, whatever its place in the tree; None if it can."""
    if tool := tool_kind(proc):
        return f"{tool} itself"
    if not is_python(proc):
        return "not Python"
    if name := launcher_name(proc):
        return f"launcher {name}"
    if kind := helper_kind(proc, table):
        return kind
    if proc.env is None:
        return UNREADABLE_WITHHELD if proc.pid in table.withheld else UNREADABLE_DENIED
    return None


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
    env_ranked = {p.pid: _env_rank_of(p) for p in candidates
                  if env_rank(p) is not None and p.pid not in launchers
                  and p.pid not in children}

    def below_rank(pid: int, ranked: Mapping[int, FoundRank]) -> ProcInfo | None:
        return next((a for a in table.ancestors(pid) if a.pid in ranked), None)

    unranked = [p.pid for p in candidates if p.pid not in env_ranked and p.pid not in launchers
                and p.pid not in children and below_rank(p.pid, env_ranked) is None]
    inferred = infer_spawn_ranks(table, unranked)
    # Inferred groups nested under other inferred ranks are those ranks' workers.
    inferred = {pid: r for pid, r in inferred.items() if below_rank(pid, inferred) is None}
    launchers |= {r.proc.ppid for r in inferred.values()}
    ranked: dict[int, FoundRank] = {**env_ranked, **inferred}

    notes: list[str] = []
    for proc in candidates:
        if proc.pid in ranked or proc.pid in launchers:
            continue
        parent_rank = children.get(proc.pid) or below_rank(proc.pid, ranked)
        if parent_rank is not None:
            identity = env_rank(parent_rank)
            rank = ranked[parent_rank.pid].rank if parent_rank.pid in ranked else \
                (identity[1] if identity else None)
            rejected[proc.pid] = f"child of rank {rank} (pid {parent_rank.pid})"
        elif any(r.pid in ranked for r in table.descendants(proc.pid)):
            launchers.add(proc.pid)
        else:
            ranked[proc.pid] = FoundRank(proc, None, None, "no rank in its start-up environment",
                                     None, None)
            notes.append(f"pid {proc.pid} has no rank in its start-up environment; "
                         "its rank is unknown")
    for pid in launchers:
        if pid in table.procs and pid in scope:
            rejected.setdefault(pid, "launcher (starts ranks, has no rank itself)")
    kids = [f"{pid} ({why})" for pid, why in rejected.items() if why.startswith("child of")]
    if kids:
        notes.append(f"not counted as ranks (DataLoader/compile/multiprocessing workers): "
                     f"pid {', '.join(kids)}")
    if inferred:
        notes.append(f"ranks of {len(inferred)} spawn children were inferred from their start "
                     "order (they have no RANK in their start-up environment); on several "
                     "nodes these are local indices")
    return Selection(sorted(ranked.values(), key=_rank_order), launchers, notes, rejected)


def _rank_order(rank: FoundRank) -> tuple[bool, int, int]:
    return (rank.rank is None, rank.rank or 0, rank.proc.pid)


def _launcher_of(table: ProcessTable, pid: int, launchers: set[int]) -> int | None:
    for anc in table.ancestors(pid):
        if anc.pid in launchers or launcher_name(anc) is not None:
            return anc.pid
    return None


# ------------------------------------------------------------------ building RankProcesses


def select_env(env: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    """The distributed-debugging variables of an environment, sorted, secrets redacted; rank
    and size variables that hold no valid number are left out (``env_int_notes`` says so)."""
    if not env:
        return ()
    chosen = sorted((k, v) for k, v in env.items()
                    if (k in _ENV_NAMES or k.startswith(_ENV_PREFIXES)) and not _is_bad_int(k, v))
    return redact_env(chosen)


def env_int_notes(ranks: Iterable[FoundRank]) -> list[str]:
    """One note per bad rank/size value in the ranks' environments: it was ignored."""
    bad: dict[tuple[str, str], list[int]] = {}
    for found in ranks:
        for name, value in sorted((found.proc.env or {}).items()):
            if _is_bad_int(name, value):
                bad.setdefault((name, value), []).append(found.proc.pid)
    notes = []
    for (name, value), pids in bad.items():
        shown = repr(value[:_SHOWN_VALUE]) + ("..." if len(value) > _SHOWN_VALUE else "")
        notes.append(f"{name}={shown} ignored and left out of the rank's environment "
                     f"({parse_env_int(name, value)[1]}): {pid_list(pids)}")
    return notes


def _to_rank_process(found: FoundRank, host: str, launcher: int | None) -> RankProcess:
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


def _world_size(ranks: list[FoundRank], notes: list[str]) -> int | None:
    sizes = sorted({r.world_size for r in ranks if r.world_size is not None})
    if len(sizes) > 1:
        notes.append(f"ranks disagree on the world size: {', '.join(map(str, sizes))}")
    return sizes[-1] if sizes else None


def _duplicate_notes(ranks: list[FoundRank]) -> list[str]:
    by_rank: dict[int, list[int]] = {}
    for r in ranks:
        if r.rank is not None:
            by_rank.setdefault(r.rank, []).append(r.proc.pid)
    return [f"rank {rank} is claimed by {len(pids)} processes (pids "
            f"{', '.join(map(str, pids))}): does the spec match more than one job?"
            for rank, pids in sorted(by_rank.items()) if len(pids) > 1]


def _not_ranks_message(what: str, selection: Selection, table: ProcessTable) -> str:
    parts = [f"{_describe(table.procs[pid])}: {why}"
             for pid, why in list(selection.rejected.items())[:4]]
    more = len(selection.rejected) - len(parts)
    tail = f"; {more} more" if more > 0 else ""
    return f"{what} matched {len(selection.rejected)} processes but none is a rank: " \
           f"{'; '.join(parts)}{tail}"


# ------------------------------------------------------------------ unreadable processes


def _unreadable(procs: Iterable[ProcInfo], table: ProcessTable) -> list[ProcInfo]:
    """The processes that could be ranks but whose environment is unknown."""
    return [p for p in procs if _not_a_candidate(p, table) in (UNREADABLE_DENIED,
                                                                UNREADABLE_WITHHELD)]


def _permission_denied(unreadable: list[ProcInfo], table: ProcessTable,
                       rest: str) -> PermissionDenied:
    """The job may be among ``unreadable``: say that first, then ``rest`` (what was searched).
    Withheld processes are counted, not named: the caller may not see them."""
    denied = [p.pid for p in unreadable if p.pid not in table.withheld]
    withheld = len(unreadable) - len(denied)
    parts = []
    if denied:
        parts.append(f"permission denied reading the environment of "
                     f"{_python_processes(len(denied))} ({pid_list(denied)})")
    if withheld:
        parts.append(f"this caller may not read {_python_processes(withheld)}")
    message = f"{' and '.join(parts)}: the job's ranks may be among them; {rest}"
    if denied:
        return PermissionDenied(message)
    return PermissionDenied(message, help=WITHHELD_HELP)


def _python_processes(count: int) -> str:
    return plural(count, "Python process", "Python processes")


def _unreadable_notes(selection: Selection) -> list[str]:
    """Processes in scope that may be ranks of the job but could not be read."""
    unknown = {pid: why for pid, why in selection.rejected.items()
               if pid not in selection.launchers}
    denied = [pid for pid, why in unknown.items() if why == UNREADABLE_DENIED]
    withheld = sum(1 for why in unknown.values() if why == UNREADABLE_WITHHELD)
    notes = []
    if denied:
        notes.append(f"not counted as ranks, their environment could not be read (permission "
                     f"denied): {pid_list(denied)}")
    if withheld:
        notes.append(f"not counted as ranks: {_python_processes(withheld)} this caller may "
                     "not read")
    return notes


# ------------------------------------------------------------------ discovery


@dataclass(frozen=True)
class Scope:
    """The processes a spec takes in, and how to say what they are."""

    pids: list[int]
    what: str  # e.g. "pid 7 and its 3 descendants"
    nothing: str  # what to say when pids is empty: "no process has ..."
    hint: str = ""  # appended to that: what exists instead


def _scope(spec: JobSpec, table: ProcessTable, host: str) -> Scope:
    if spec.kind is JobKind.ENDPOINT:
        pids, nothing, hint = _endpoint_scope(spec, table)
        return Scope(pids, f"MASTER_ADDR={spec.host} MASTER_PORT={spec.port}", nothing, hint)
    if spec.kind is JobKind.PID:
        pids, nothing, hint = _pid_scope(spec, table, host)
        return Scope(pids, f"pid {spec.pid} and its {len(pids) - 1} descendants", nothing, hint)
    pids, nothing, hint = _slurm_scope(spec, table)
    return Scope(pids, str(spec), nothing, hint)


def _check_one_job(spec: JobSpec, selection: Selection,
                   launchers: Mapping[int, int | None]) -> None:
    members = [Member(r.proc.pid, r.proc.env, launchers[r.proc.pid]) for r in selection.ranks]
    check_one_job(str(spec), members)


def _one_rank_note(spec: JobSpec, selection: Selection) -> list[str]:
    if spec.kind is not JobKind.PID or len(selection.ranks) != 1:
        return []
    only = selection.ranks[0].proc
    if only.pid != spec.pid or not only.env or "MASTER_PORT" not in only.env:
        return []
    endpoint = f"{only.env.get('MASTER_ADDR', '?')}:{only.env['MASTER_PORT']}"
    return [f"pid {spec.pid} is one rank; to see the whole job name it by {endpoint}"]


def discover(spec: JobSpec, host: str | None = None, table: ProcessTable | None = None, *,
             readable: Callable[[int], bool] | None = None) -> Discovery:
    """Find the ranks ``spec`` names on this node.

    Raises ``JobNotFound`` when there are none, ``PermissionDenied`` when there are none
    that can be read but some Python processes that may be ranks cannot, and
    ``MultipleJobs`` when a ``pid:`` or ``slurm:`` spec takes in ranks of several jobs.
    ``table`` is for callers that already read the process table (and for tests);
    ``readable`` is the caller's access policy (see ``read_process_table``).
    """
    if spec.kind is JobKind.RAY:
        raise UsageError(f"{spec}: Ray job discovery is not implemented yet; name the job by "
                         "its MASTER_ADDR:MASTER_PORT or a worker's pid:PID for now")
    host = host or socket.gethostname()
    if table is None:
        table = read_process_table(readable=readable)
    elif readable is not None:
        table = withhold(table, readable)
    scope = _scope(spec, table, host)
    counted = f"{len(table.procs)} processes, {table.unreadable} unreadable"
    searched = f"{scope.what} on {host} ({counted})"
    if not scope.pids:
        if unreadable := _unreadable(table.procs.values(), table):
            raise _permission_denied(unreadable, table, f"{scope.nothing} among the others; "
                                     f"searched {counted} on {host}")
        raise JobNotFound(f"{scope.nothing}; searched {counted} on {host}{scope.hint}")

    selection = select_ranks(table, scope.pids)
    if not selection.ranks:
        if unreadable := _unreadable((table.procs[p] for p in scope.pids), table):
            raise _permission_denied(unreadable, table, f"searched {searched}")
        raise JobNotFound(_not_ranks_message(scope.what, selection, table))
    launchers = {r.proc.pid: _launcher_of(table, r.proc.pid, selection.launchers)
                 for r in selection.ranks}
    if spec.kind is not JobKind.ENDPOINT:  # an endpoint names one rendezvous already
        _check_one_job(spec, selection, launchers)
    notes = selection.notes + _one_rank_note(spec, selection) + \
        _duplicate_notes(selection.ranks) + env_int_notes(selection.ranks) + \
        _unreadable_notes(selection)
    world_size = _world_size(selection.ranks, notes)
    ranks = tuple(_to_rank_process(r, host, launchers[r.proc.pid]) for r in selection.ranks)
    return Discovery(ranks, world_size, tuple(notes), searched)
