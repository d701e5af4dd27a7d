"""Tell apart the jobs whose ranks one discovery scope holds.

``pid:PID`` takes in every process below PID and ``slurm:JOBID`` every step of the job, so a
shell or tmux server that started two torchrun jobs, or PID 1 of a container, holds the
ranks of several jobs. Merged, they would give a confident wrong verdict ("10 of 4 rank
processes found", a rank listed twice). The ranks of one job share a rendezvous; its key is,
in order of preference:

1. ``MASTER_ADDR`` and ``MASTER_PORT`` (torchrun, most launchers, scripts that export them);
2. the Slurm step: ``SLURM_JOB_ID`` and ``SLURM_STEP_ID``;
3. ``TORCHELASTIC_RUN_ID``.

``check_one_job`` raises ``MultipleJobs`` when the ranks carry more than one key, naming each
job by the spec that names it alone. Ranks with none of these variables have no key: they do
not make a second job, and stay with the one there is (as discovery always kept them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ...errors import UsageError
from ...model import counted
from .jobspec import normalise_host, parse_job_spec

_ENDPOINT = ("MASTER_ADDR", "MASTER_PORT")
_SLURM_STEP = ("SLURM_JOB_ID", "SLURM_STEP_ID")
_ELASTIC = ("TORCHELASTIC_RUN_ID",)
_LISTED_PIDS = 5  # pids named in a message before "and N more"
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9._:+-]{1,64}", re.ASCII)
_SHOWN_CHARS = 40


class MultipleJobs(UsageError):
    """A ``pid:`` or ``slurm:`` spec takes in the ranks of more than one job."""

    exit_code = 2  # like any spec that does not name one job
    help = (
        "Diagnose each job on its own, by the spec listed for it: pid:PID takes in every "
        "process below PID and slurm:JOBID every step of the job, so they can hold several "
        "jobs."
    )

    def __init__(self, message: str, jobs: tuple[str, ...] = (), help: str | None = None) -> None:
        # jobs defaults: the coordinator re-raises a class with a message alone
        super().__init__(message, help)
        self.jobs = jobs  # each job's name: a spec where one names it alone


class Member(NamedTuple):
    """A rank as job splitting sees it."""

    pid: int
    env: Mapping[str, str] | None  # its start-up environment
    launcher: int | None  # the launcher above it, if any


@dataclass(frozen=True)
class RendezvousKey:
    """What the ranks of one job share: some variables of their start-up environment."""

    variables: tuple[str, ...]  # _ENDPOINT, _SLURM_STEP or _ELASTIC
    values: tuple[str, ...]

    def spec(self) -> str | None:
        """The job spec for this key, or None when no spec form names it (or it is malformed)."""
        if self.variables == _ENDPOINT:
            host, port = self.values
            text = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        elif self.variables == _SLURM_STEP:
            job, step = self.values
            text = f"slurm:{job}.{step}" if step else f"slurm:{job}"
        else:
            return None
        try:
            return str(parse_job_spec(text))
        except UsageError:
            return None

    def __str__(self) -> str:
        return " ".join(f"{name}={_shown(value)}" for name, value in zip(self.variables, self.values, strict=False))


def _shown(value: str) -> str:
    """A value from a process's environment as a message may show it: as it is when plain,
    else quoted (``repr`` escapes control and bidi characters) and cut short."""
    if _PLAIN_VALUE.fullmatch(value):
        return value
    return repr(value[:_SHOWN_CHARS]) + ("..." if len(value) > _SHOWN_CHARS else "")


def rendezvous_key(env: Mapping[str, str] | None) -> RendezvousKey | None:
    """The key of the first rendezvous ``env`` names (see the module docstring), or None."""
    if not env:
        return None
    addr = normalise_host(env.get("MASTER_ADDR", ""))
    port = env.get("MASTER_PORT", "").strip()
    if addr and port:
        return RendezvousKey(_ENDPOINT, (addr, port))
    job = env.get("SLURM_JOB_ID", env.get("SLURM_JOBID", "")).strip()
    if job:
        step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", "")).strip()
        return RendezvousKey(_SLURM_STEP, (job, step))
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    return RendezvousKey(_ELASTIC, (run_id,)) if run_id else None


@dataclass
class Job:
    """The ranks that share one rendezvous key."""

    key: RendezvousKey
    members: list[Member] = field(default_factory=list)

    @property
    def launchers(self) -> list[int]:
        return sorted({m.launcher for m in self.members if m.launcher is not None})


def split_jobs(members: Iterable[Member]) -> tuple[list[Job], list[Member]]:
    """The jobs among ``members`` (by lowest pid) and the members that have no key."""
    jobs: dict[RendezvousKey, Job] = {}
    keyless: list[Member] = []
    for member in members:
        key = rendezvous_key(member.env)
        if key is None:
            keyless.append(member)
        else:
            jobs.setdefault(key, Job(key)).members.append(member)
    return sorted(jobs.values(), key=lambda j: min(m.pid for m in j.members)), keyless


def check_one_job(spec: str, members: Sequence[Member]) -> None:
    """Raise ``MultipleJobs`` when ``members``, the ranks ``spec`` found, hold several jobs."""
    jobs, keyless = split_jobs(members)
    if len(jobs) < 2:
        return
    names = job_names(jobs)
    listed = ", ".join(f"{names[i]} ({_shape(job)})" for i, job in enumerate(jobs))
    tail = ""
    if keyless:
        tail = (
            f"; and {counted(len(keyless), 'rank process', 'rank processes')} with no "
            f"rendezvous variables ({pid_list(m.pid for m in keyless)})"
        )
    example = next((n for n in names if _is_spec(n)), None)
    advice = f"{MultipleJobs.help} E.g. `hangdoc diagnose {example}`." if example else None
    raise MultipleJobs(f"{spec} holds the ranks of {len(jobs)} jobs: {listed}{tail}", tuple(names), advice)


def job_names(jobs: Sequence[Job]) -> list[str]:
    """Each job's name: its key's spec where that names it alone, else ``pid:LAUNCHER`` where
    the job has one launcher of its own, else its key (e.g. ``TORCHELASTIC_RUN_ID=abc``)."""
    specs = [job.key.spec() for job in jobs]
    names = []
    for index, job in enumerate(jobs):
        spec = specs[index]
        if spec is not None and not _overlaps(spec, specs[:index] + specs[index + 1 :]):
            names.append(spec)
        elif (launcher := _own_launcher(job, jobs)) is not None:
            names.append(f"pid:{launcher}")
        else:
            names.append(str(job.key))
    return names


def _overlaps(spec: str, others: list[str | None]) -> bool:
    """Another job's spec takes in some of the same processes: an endpoint with the same port
    (a local host has several names), or ``slurm:J`` and ``slurm:J.S``."""
    return any(other is not None and _same_processes(spec, other) for other in others)


def _same_processes(a: str, b: str) -> bool:
    slurm_a, slurm_b = a.startswith("slurm:"), b.startswith("slurm:")
    if slurm_a != slurm_b:
        return False
    if not slurm_a:
        return a.rsplit(":", 1)[1] == b.rsplit(":", 1)[1]
    job_a, _, step_a = a.partition(".")
    job_b, _, step_b = b.partition(".")
    return job_a == job_b and (not step_a or not step_b or step_a == step_b)


def _own_launcher(job: Job, jobs: Sequence[Job]) -> int | None:
    if len(job.launchers) != 1:
        return None
    launcher = job.launchers[0]
    shared = any(launcher in other.launchers for other in jobs if other is not job)
    return None if shared else launcher


def _is_spec(name: str) -> bool:
    return "=" not in name


def _shape(job: Job) -> str:
    ranks = counted(len(job.members), "rank", "ranks")
    launchers = job.launchers
    if len(launchers) == 1:
        return f"{ranks}, launcher pid {launchers[0]}"
    if launchers:
        return f"{ranks}, launcher pids {', '.join(map(str, launchers))}"
    return f"{ranks}: {pid_list(m.pid for m in job.members)}"


def pid_list(pids: Iterable[int]) -> str:
    """``pid 3, 5, 8`` (sorted; the first few, then ``and N more``)."""
    ordered = sorted(pids)
    shown = ", ".join(map(str, ordered[:_LISTED_PIDS]))
    more = len(ordered) - _LISTED_PIDS
    return f"pid {shown}" + (f" and {more} more" if more > 0 else "")
