"""Launch the corpus of real hung torch.distributed jobs (``tests/jobs/``) and clean up after.

Each job script starts with two header lines the harness parses::

    # hangdoc-expect: verdict=collective_mismatch culprits=3
    # hangdoc-launch: mode=torchrun nproc=4

``launch(meta, workdir)`` starts the job the way its launch mode says (direct, torchrun,
spawn, slurm via ``launchers/fake_srun.py``, netns), tags every process with
``HANGDOC_TEST_TAG`` and always kills all of them on exit — including torchrun workers that
live in their own sessions and orphans reparented away from the launcher.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from .paths import TESTS as TESTS_DIR
from .waiting import alive

JOBS_DIR = TESTS_DIR / "jobs"
FAKE_SRUN = TESTS_DIR / "launchers" / "fake_srun.py"

MODES = ("direct", "torchrun", "spawn", "slurm", "netns")
VERDICTS = (
    "external_wait",
    "not_hung",
    "cleanup_deadlock",
    "collective_mismatch",
    "nccl_timeout",
    "straggler",
    "rank_missing",
    "init_deadlock",
)
_EXPECT = "# hangdoc-expect:"
_LAUNCH = "# hangdoc-launch:"
_HEADER_LINES = 5  # the header must be within the first lines of the script
_TAG_VAR = "HANGDOC_TEST_TAG"
_SRUN_TASK_EXIT = re.compile(r"srun: error: task (\d+): Exited with exit code -?\d+")
# Variables of an enclosing launcher that must not leak into a job's ranks.
_SCRUB = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    _TAG_VAR,
    "HANGDOC_READY_DIR",
    "HANGDOC_TEST_NPROC",
    "GLOO_SOCKET_IFNAME",
)


@dataclass(frozen=True)
class JobMeta:
    """What a corpus job expects (verdict, culprits) and how to launch it."""

    path: Path
    name: str
    verdict: str
    culprits: tuple[int, ...]
    mode: str
    nproc: int
    world: int
    ranks: tuple[int, ...]
    ready: tuple[int, ...]
    spec: str
    cut: bool
    settle: float


def _pairs(line: str, prefix: str, path: Path) -> dict[str, str]:
    pairs = {}
    for item in line[len(prefix) :].split():
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise ValueError(f"{path}: malformed header item {item!r}")
        pairs[key] = value
    return pairs


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def _header(path: Path) -> tuple[dict[str, str], dict[str, str]] | None:
    with path.open(encoding="utf-8") as handle:
        lines = [handle.readline().strip() for _ in range(_HEADER_LINES)]
    expect = next((ln for ln in lines if ln.startswith(_EXPECT)), None)
    launch_line = next((ln for ln in lines if ln.startswith(_LAUNCH)), None)
    if expect is None and launch_line is None:
        return None
    if expect is None or launch_line is None:
        raise ValueError(f"{path}: needs both {_EXPECT!r} and {_LAUNCH!r} header lines")
    return _pairs(expect, _EXPECT, path), _pairs(launch_line, _LAUNCH, path)


def load_meta(path: Path) -> JobMeta:
    """Parse a job script's header; ValueError when it is missing or inconsistent."""
    path = Path(path).resolve()
    header = _header(path)
    if header is None:
        raise ValueError(f"{path}: no hangdoc header")
    expect, launch_kv = header
    mode, nproc = launch_kv["mode"], int(launch_kv["nproc"])
    ranks = _ints(launch_kv["ranks"]) if "ranks" in launch_kv else tuple(range(nproc))
    culprits_text = expect.get("culprits", "none")
    meta = JobMeta(
        path=path,
        name=path.stem,
        verdict=expect["verdict"],
        culprits=() if culprits_text == "none" else _ints(culprits_text),
        mode=mode,
        nproc=nproc,
        world=int(launch_kv.get("world", nproc)),
        ranks=ranks,
        ready=_ints(launch_kv["ready"]) if "ready" in launch_kv else ranks,
        spec=launch_kv.get("spec", "port" if mode in ("direct", "netns") else "pid"),
        cut=launch_kv.get("cut", "0") == "1",
        settle=float(launch_kv.get("settle", "1.0")),
    )
    _validate(meta)
    return meta


def _validate(meta: JobMeta) -> None:
    problems = []
    if meta.verdict not in VERDICTS:
        problems.append(f"unknown verdict {meta.verdict!r}")
    if meta.mode not in MODES:
        problems.append(f"unknown mode {meta.mode!r}")
    if len(meta.ranks) != meta.nproc:
        problems.append(f"ranks={meta.ranks} does not have nproc={meta.nproc} entries")
    if meta.spec not in ("port", "pid", "slurm"):
        problems.append(f"unknown spec {meta.spec!r}")
    if meta.spec == "slurm" and meta.mode != "slurm":
        problems.append("spec=slurm needs mode=slurm")
    if meta.spec == "pid" and meta.mode in ("direct", "netns"):
        problems.append("spec=pid needs a launcher process (torchrun, spawn or slurm)")
    if meta.cut and meta.mode != "netns":
        problems.append("cut=1 only works with mode=netns")
    if not set(meta.ready) <= set(meta.ranks) and meta.mode in ("direct", "netns"):
        problems.append(f"ready={meta.ready} names ranks that are not started")
    if problems:
        raise ValueError(f"{meta.path}: " + "; ".join(problems))


def corpus(jobs_dir: Path = JOBS_DIR) -> list[JobMeta]:
    """Every job script with a header under ``tests/jobs``, sorted by name."""
    metas = []
    for path in sorted(jobs_dir.glob("*.py")):
        if _header(path) is not None:
            metas.append(load_meta(path))
    return metas


def free_port() -> int:
    """A TCP port nobody listens on right now (bind to 0 and release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _venv_bin(name: str) -> str:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def _tagged_pids(tag: str) -> set[int]:
    """Live (non-zombie) processes whose environment carries ``HANGDOC_TEST_TAG=tag``."""
    needle = f"{_TAG_VAR}={tag}".encode() + b"\0"
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as handle:
                if needle in handle.read() + b"\0" and alive(int(entry.name)):
                    found.add(int(entry.name))
        except OSError:
            continue
    return found


def _descendants(pid: int) -> set[int]:
    try:
        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


class RunningJob:
    """A launched corpus job: its launcher process(es), output, readiness and teardown."""

    def __init__(
        self,
        meta: JobMeta,
        workdir: Path,
        port: int,
        master_addr: str,
        procs: list[subprocess.Popen],
        tag: str,
        nodes: Any = None,
    ) -> None:
        self.meta = meta
        self.workdir = workdir
        self.port = port
        self.master_addr = master_addr
        self.procs = procs  # one per rank (direct, netns) or just the launcher
        self.tag = tag
        self.nodes = nodes  # NetnsNodes in netns mode
        self.ready_dir = workdir / "ready"
        self.log_path = workdir / "output.log"

    @property
    def launcher(self) -> subprocess.Popen:
        """The launcher (torchrun, spawn parent, fake_srun) or, without one, rank 0's process."""
        return self.procs[0]

    def job_spec(self) -> str:
        """``HOST:PORT``, ``pid:<launcher pid>`` or ``slurm:<job>.<step>``, as the header asks."""
        if self.meta.spec == "pid":
            return f"pid:{self.launcher.pid}"
        if self.meta.spec == "slurm":  # fake_srun's job id: SLURM_JOB_ID or 100000 + its pid
            return f"slurm:{os.environ.get('SLURM_JOB_ID', 100000 + self.launcher.pid)}.0"
        return f"{self.master_addr}:{self.port}"

    def pids(self) -> list[int]:
        """Every live process of the job: the launchers' descendants and tagged processes."""
        found = _tagged_pids(self.tag)
        for proc in self.procs:
            if proc.poll() is None:
                found.add(proc.pid)
                found |= _descendants(proc.pid)
        return sorted(pid for pid in found if alive(pid))

    def output(self) -> str:
        """Everything the job printed so far (stdout and stderr of all its processes)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def missing_ready(self) -> list[int]:
        return [r for r in self.meta.ready if not (self.ready_dir / f"ready.{r}").exists()]

    def wait_ready(self, timeout: float = 90) -> None:
        """Wait for every ready marker, cut the network if asked, then settle."""
        deadline = time.monotonic() + timeout
        while missing := self.missing_ready():
            if died := self._died_early():
                raise AssertionError(
                    f"{self.meta.name}: {died} before ready ranks {missing} "
                    f"were ready\n--- output tail ---\n{self._tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.meta.name}: ranks {missing} not ready after "
                    f"{timeout:.0f}s\n--- output tail ---\n{self._tail()}"
                )
            time.sleep(0.1)
        if self.meta.cut:
            self.nodes.cut()
        time.sleep(self.meta.settle)

    def _died_early(self) -> str | None:
        if self.meta.mode in ("direct", "netns"):
            for rank, proc in zip(self.meta.ranks, self.procs, strict=False):
                if rank in self.meta.ready and proc.poll() is not None and rank in self.missing_ready():
                    return f"rank {rank} exited with code {proc.returncode}"
            return None
        if self.procs and self.launcher.poll() is not None:
            return f"the launcher exited with code {self.launcher.returncode}"
        if self.meta.mode == "slurm":
            for match in _SRUN_TASK_EXIT.finditer(self.output()):
                if int(match[1]) in self.missing_ready():
                    return match[0]
        return None

    def _tail(self, chars: int = 6000) -> str:
        return self.output()[-chars:]

    def kill(self, timeout: float = 20) -> None:
        """SIGKILL every process of the job and wait until none is left; idempotent."""
        deadline = time.monotonic() + timeout
        while True:
            victims = set(self.pids())
            if not victims:
                break
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for proc in self.procs:
                if proc.poll() is None:
                    try:
                        proc.wait(timeout=0.5)
                    except subprocess.TimeoutExpired:
                        pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.meta.name}: processes {sorted(victims)} survive SIGKILL")
            time.sleep(0.05)
        for proc in self.procs:
            proc.wait()


def _base_env(meta: JobMeta, tag: str, ready_dir: Path, addr: str, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env.update(
        {
            _TAG_VAR: tag,
            "HANGDOC_READY_DIR": str(ready_dir),
            "MASTER_ADDR": addr,
            "MASTER_PORT": str(port),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",  # the corpus must run on 2 shared cores
        }
    )
    return env


def _rank_env(base: dict[str, str], meta: JobMeta, index: int, rank: int) -> dict[str, str]:
    env = dict(base)
    env.update(RANK=str(rank), WORLD_SIZE=str(meta.world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(meta.world))
    return env


def _launcher_argv(meta: JobMeta, port: int) -> list[str]:
    script = str(meta.path)
    if meta.mode == "torchrun":
        return [
            _venv_bin("torchrun"),
            "--nproc-per-node",
            str(meta.nproc),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            script,
        ]
    if meta.mode == "spawn":
        return [sys.executable, script]
    if meta.mode == "slurm":
        return [sys.executable, str(FAKE_SRUN), "-n", str(meta.nproc), sys.executable, script]
    raise ValueError(f"{meta.mode} has no single launcher")


def _netns_ifname(ns_prefix: list[str], ip: str) -> str | None:
    """The interface that holds ``ip`` inside a namespace, for GLOO_SOCKET_IFNAME."""
    out = subprocess.run(
        [*ns_prefix, "ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=False
    ).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3].split("/")[0] == ip:
            return fields[1].split("@")[0]
    return None


def _start(argv: list[str], env: dict[str, str], log: Any) -> subprocess.Popen:
    return subprocess.Popen(
        argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(JOBS_DIR)
    )


@contextmanager
def launch(meta: JobMeta, workdir: Path) -> Iterator[RunningJob]:
    """Start ``meta``'s job in ``workdir``; kill every process of it on exit, whatever happens."""
    workdir = Path(workdir)
    ready_dir = workdir / "ready"
    ready_dir.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex
    port = free_port()
    with ExitStack() as stack:
        nodes = None
        addr = "127.0.0.1"
        if meta.mode == "netns":
            from support.netns import NetnsNodes  # helper B's module; needs root and ip netns

            nodes = stack.enter_context(NetnsNodes(meta.nproc, f"hd{tag[:4]}"))
            addr = nodes.ip(0)
        log = stack.enter_context(open(workdir / "output.log", "ab", buffering=0))
        base = _base_env(meta, tag, ready_dir, addr, port)
        procs: list[subprocess.Popen] = []
        job = RunningJob(meta, workdir, port, addr, procs, tag, nodes)
        try:
            if meta.mode in ("direct", "netns"):
                for index, rank in enumerate(meta.ranks):
                    env = _rank_env(base, meta, index, rank)
                    argv = [sys.executable, str(meta.path)]
                    if nodes is not None:
                        prefix = nodes.exec_prefix(index)
                        ifname = _netns_ifname(prefix, nodes.ip(index))
                        if ifname:
                            env["GLOO_SOCKET_IFNAME"] = ifname
                        argv = [*prefix, *argv]
                    procs.append(_start(argv, env, log))
            else:
                if meta.mode == "spawn":
                    base["HANGDOC_TEST_NPROC"] = str(meta.nproc)
                if meta.mode == "torchrun":  # torchrun gets them as flags, sets them for workers
                    del base["MASTER_ADDR"], base["MASTER_PORT"]
                argv = _launcher_argv(meta, port)
                log.write(f"$ {shlex.join(argv)}\n".encode())
                procs.append(_start(argv, base, log))
            yield job
        finally:
            job.kill()


def tagged_pids(tag: str) -> set[int]:
    """Live processes started with ``HANGDOC_TEST_TAG=tag`` in their environment."""
    return _tagged_pids(tag)


def kill_tagged(tag: str, timeout: float = 20) -> None:
    """SIGKILL every live process carrying ``tag`` until none is left."""
    deadline = time.monotonic() + timeout
    while victims := _tagged_pids(tag):
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {sorted(victims)} survive SIGKILL")
        time.sleep(0.05)


def is_running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False
