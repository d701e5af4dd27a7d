"""Kernel-side counters of a process: what moves when a rank makes progress.

``read_state`` reads status, CPU time, threads, I/O characters, context switches and RSS
through psutil (``/proc/PID/stat``, ``status``, ``io``), and the same counters per thread
from ``/proc/PID/task/TID`` (``thread_counters``). ``rchar``/``wchar`` count
read()/write()-family calls only: gloo sends with ``writev`` (counted in wchar) but
receives with ``recv`` (not counted in rchar), so a rank that only receives shows no
I/O there. ``socket_bytes`` fills that gap from the kernel's TCP counters (``ss -ti``,
run in the process's network namespace); it costs a subprocess per namespace, so it is
separate and batched (``socket_bytes_many``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import replace

import psutil

from ...model import CaptureError, CaptureErrorKind, ProcessState, ThreadCounters

_SS_USER = re.compile(r"pid=(\d+),")
_SS_COUNTER = re.compile(r"\b(bytes_received|bytes_acked):(\d+)")


def read_state(pid: int) -> ProcessState | CaptureError:
    """The process's counters now, or PROCESS_GONE / PTRACE_DENIED."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            status = proc.status()
            if status == psutil.STATUS_ZOMBIE:
                return CaptureError(
                    CaptureErrorKind.PROCESS_GONE, f"pid {pid} exited (a zombie its parent has not reaped)"
                )
            cpu = proc.cpu_times()
            ctx = proc.num_ctx_switches()
            state = ProcessState(
                status=status,
                cpu_seconds=cpu.user + cpu.system,
                num_threads=proc.num_threads(),
                ctx_switches=ctx.voluntary + ctx.involuntary,
                rss_bytes=proc.memory_info().rss,
            )
    except psutil.NoSuchProcess:
        return CaptureError(CaptureErrorKind.PROCESS_GONE, f"pid {pid} exited")
    except psutil.AccessDenied as exc:
        return CaptureError(CaptureErrorKind.PTRACE_DENIED, f"cannot read pid {pid}: {exc}")
    return _with_io(proc, state)


def _with_io(proc: psutil.Process, state: ProcessState) -> ProcessState:
    """Add rchar/wchar; /proc/PID/io needs ptrace-read access, so it may be missing."""
    try:
        io = proc.io_counters()
    except (psutil.AccessDenied, psutil.NoSuchProcess, AttributeError):
        return replace(state, threads=thread_counters(proc.pid))
    return ProcessState(
        status=state.status,
        cpu_seconds=state.cpu_seconds,
        num_threads=state.num_threads,
        read_chars=io.read_chars,
        write_chars=io.write_chars,
        ctx_switches=state.ctx_switches,
        rss_bytes=state.rss_bytes,
        threads=thread_counters(proc.pid),
    )


# ------------------------------------------------------------------ per-thread counters

# A rank has tens of threads (gloo and OpenMP workers, the autograd engine, data loader
# pin-memory, NCCL's); reading three small files for each costs about 30 us. Past this many
# threads only the first are read, so a process that spawned thousands costs a bounded time.
MAX_THREADS_READ = 512
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read(8192)
    except OSError:
        return None


def _stat_cpu(text: str) -> float | None:
    """utime + stime in seconds from a ``stat`` line; the command name before them may hold
    spaces and parentheses, so fields are counted after its last ``)``."""
    fields = text.rpartition(")")[2].split()
    try:
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # fields 14, 15 of stat
    except (IndexError, ValueError):
        return None


def _counter(text: str | None, *keys: str) -> int | None:
    if text is None:
        return None
    total, found = 0, 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys and value.strip().isascii() and value.strip().isdigit():
            total += int(value)
            found += 1
    return total if found == len(keys) else None


def thread_counters(pid: int) -> tuple[ThreadCounters, ...]:
    """Each thread's CPU time, context switches and I/O characters, ``()`` when
    ``/proc/PID/task`` cannot be read. A thread that ends while being read is left out."""
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit())
    except OSError:
        return ()
    found = []
    for tid in tids[:MAX_THREADS_READ]:
        base = f"/proc/{pid}/task/{tid}"
        stat_text = _read_text(f"{base}/stat")
        cpu = _stat_cpu(stat_text) if stat_text else None
        if cpu is None:
            continue
        io = _read_text(f"{base}/io")
        found.append(
            ThreadCounters(
                native_id=tid,
                cpu_seconds=cpu,
                ctx_switches=_counter(
                    _read_text(f"{base}/status"), "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"
                ),
                read_chars=_counter(io, "rchar"),
                write_chars=_counter(io, "wchar"),
            )
        )
    return tuple(found)


# ------------------------------------------------------------------ socket counters


def _netns(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def parse_ss(text: str) -> dict[int, int]:
    """Sum bytes_received + bytes_acked per pid over ``ss -tinpH`` output.

    Each socket is a line naming its owners (``users:(("python",pid=42,fd=7))``) followed
    by an indented line of TCP info. A socket shared by several processes (inherited across
    fork) counts for each of them.
    """
    totals: dict[int, int] = {}
    owners: list[int] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            owners = list(dict.fromkeys(int(p) for p in _SS_USER.findall(line)))
            for pid in owners:
                totals.setdefault(pid, 0)
            continue
        moved = sum(int(value) for _, value in _SS_COUNTER.findall(line))
        for pid in owners:
            totals[pid] += moved
    return totals


def _run_ss(pid: int, same_ns: bool) -> str | None:
    ss = shutil.which("ss")
    if ss is None:
        return None
    argv = [ss, "-tinpH"]
    if not same_ns:
        nsenter = shutil.which("nsenter")
        if nsenter is None:
            return None
        argv = [nsenter, "-t", str(pid), "-n", *argv]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def socket_bytes_many(pids: Iterable[int]) -> dict[int, int | None]:
    """TCP bytes received + acknowledged per process, one ``ss`` run per network namespace.

    None for a process whose namespace or sockets cannot be read. A process with no TCP
    sockets has 0.
    """
    own = _netns(os.getpid())
    by_ns: dict[int | None, list[int]] = {}
    for pid in pids:
        by_ns.setdefault(_netns(pid), []).append(pid)
    result: dict[int, int | None] = {}
    for ns, members in by_ns.items():
        text = None if ns is None else _run_ss(members[0], same_ns=(ns == own))
        totals = parse_ss(text) if text is not None else {}
        for pid in members:
            result[pid] = totals.get(pid, 0) if text is not None else None
    return result


def socket_bytes(pid: int) -> int | None:
    """TCP bytes received + acknowledged by ``pid``'s sockets (see ``socket_bytes_many``)."""
    return socket_bytes_many([pid])[pid]
