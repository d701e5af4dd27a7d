"""The process table of this node, and what each process is by its command line.

``read_process_table`` reads every process once through psutil (``/proc``): parent, command
line, start time and the start-up environment from ``/proc/PID/environ``. Kernel threads, by
their ``PF_KTHREAD`` flag in ``/proc/PID/stat``, are left out; zombies and the reader itself
too. A process whose environment cannot be read (the kernel refused, or the caller's
``readable`` predicate withholds it) stays in the table with ``env=None``, so ancestry and
descendants still work.

The rest tells from a process's command line what it is: a Python interpreter and what it
runs (``python_target``), a launcher (torchrun, srun, mpirun, ...), multiprocessing's
resource tracker or forkserver, a spawn worker, or one of hangdoc's own processes
(``hangdoc agent/diagnose/watch``, py-spy).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import psutil

_PYTHON_NAME = re.compile(r"^(python|pypy)(\d+(\.\d+)*)?[dmu]*$")
# Programs and python modules that start ranks without being one.
_LAUNCHER_PROGRAMS = frozenset(
    (
        "torchrun",
        "deepspeed",
        "accelerate",
        "srun",
        "mpirun",
        "mpiexec",
        "orterun",
        "prterun",
        "prted",
        "orted",
        "hydra_pmi_proxy",
        "pmi_proxy",
        "slurmstepd",
    )
)
_LAUNCHER_MODULES = (
    "torch.distributed.run",
    "torch.distributed.launch",
    "torch.distributed.elastic",
    "deepspeed.launcher",
    "accelerate.commands",
)
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
    uid: int | None = None
    """Its effective user (the owner of /proc/PID); None when unknown."""


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


# ------------------------------------------------------------------ reading the table


def stat_flags(pid: int) -> int | None:
    """The kernel's per-process flags (``/proc/PID/stat`` field 9), or None if unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            line = stat.read()
        # comm (field 2) is in parentheses and may hold spaces and ")": split after the last
        return int(line[line.rindex(b")") + 2 :].split()[6])
    except (OSError, ValueError, IndexError):
        return None


def _is_kernel_thread(pid: int, cmdline: Iterable[str] | None) -> bool:
    """The kernel's own marker, PF_KTHREAD, is set; not "parent is pid 2", which in a container
    is an ordinary process. Kernel threads have no command line, so others are not read."""
    if cmdline:
        return False
    flags = stat_flags(pid)
    return flags is not None and bool(flags & PF_KTHREAD)


def read_process_table(exclude: Iterable[int] = (), *, readable: Callable[[int], bool] | None = None) -> ProcessTable:
    """Read every process once; environments that cannot be read are counted, not fatal.

    ``readable`` is a caller's access policy: a process for which ``readable(pid)`` is False
    stays in the tree (ancestry and descendants still work) but its environment is not read,
    exactly as if the kernel had refused it, and it is recorded in ``withheld``.
    """
    skip = set(exclude) | {os.getpid()}
    procs: dict[int, ProcInfo] = {}
    withheld: set[int] = set()
    attrs = ["pid", "ppid", "name", "exe", "cmdline", "create_time", "status", "uids"]
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
            uid=info["uids"].effective if info.get("uids") else None,
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
    procs = {pid: dataclasses.replace(p, env=None) if pid in hidden else p for pid, p in table.procs.items()}
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
        if arg == "-c" or (
            arg.startswith("-") and not arg.startswith("--") and arg.endswith("c") and arg[1:].isalpha()
        ):
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


def _program(proc: ProcInfo) -> str:
    """The program a process runs: argv[0]'s file name, else the process name."""
    return os.path.basename(proc.cmdline[0]) if proc.cmdline else proc.name


def launcher_name(proc: ProcInfo) -> str | None:
    """The launcher a process is known to be (torchrun, srun, ...), from its command line."""
    program = _program(proc)
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


def is_spawn_worker(proc: ProcInfo) -> bool:
    """A child started by multiprocessing's spawn or forkserver start method."""
    line = " ".join(proc.cmdline)
    return any(marker in line for marker in _SPAWN_MARKERS) or _FORKSERVER in line


def tool_kind(proc: ProcInfo) -> str | None:
    """``"hangdoc"`` (agent, diagnose, watch: its entry point or ``python -m hangdoc``) or
    ``"py-spy"``: hangdoc's own processes, never ranks nor launchers."""
    program = _program(proc)
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


def describe(proc: ProcInfo) -> str:
    """``pid 7 (python3)``: a process as a message names it."""
    return f"pid {proc.pid} ({proc.name or os.path.basename(proc.exe) or '?'})"
