"""The processes of a Slurm job or job step on this node (a ``slurm:JOBID[.STEP]`` spec).

Asked first is Slurm itself (``scontrol listpids JOB``: every process of the job's steps);
where ``scontrol`` is missing or fails, the processes whose start-up environment names the
job (``SLURM_JOB_ID``, or ``SLURM_ARRAY_JOB_ID`` and ``SLURM_ARRAY_TASK_ID`` for an array
task ``1234_7``) and, for a step, ``SLURM_STEP_ID``. Telling ranks from the ``srun`` and
``slurmstepd`` processes among them is ``ranks``'s business.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping

from ...digits import ASCII_DIGITS
from .jobspec import JobSpec
from .processes import ProcessTable


def _scontrol_pids(job: str) -> list[int] | None:
    if shutil.which("scontrol") is None:
        return None
    try:
        out = subprocess.run(
            ["scontrol", "listpids", job], capture_output=True, text=True, timeout=5, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [
        int(line.split()[0]) for line in out.splitlines() if line.strip() and ASCII_DIGITS.fullmatch(line.split()[0])
    ]


def _slurm_env_matches(env: Mapping[str, str], job: str, step: str | None) -> bool:
    if "_" in job:
        array_job, task = job.split("_", 1)
        if (env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")) != (array_job, task):
            return False
    elif env.get("SLURM_JOB_ID", env.get("SLURM_JOBID")) != job:
        return False
    return step is None or env.get("SLURM_STEP_ID", env.get("SLURM_STEPID")) == step


def slurm_scope(spec: JobSpec, table: ProcessTable) -> tuple[list[int], str, str]:
    """The pids of ``spec``'s Slurm job (or step) on this node, what to say when there are
    none, and a hint (none)."""
    assert spec.slurm_job is not None
    name = str(spec)[len("slurm:") :]
    listed = _scontrol_pids(name)
    if listed is not None:
        scope = [p for p in listed if p in table.procs]
        return scope, f"no process in `scontrol listpids {name}`", ""
    scope = [
        p.pid for p in table.procs.values() if p.env and _slurm_env_matches(p.env, spec.slurm_job, spec.slurm_step)
    ]
    step = f" SLURM_STEP_ID={spec.slurm_step}" if spec.slurm_step is not None else ""
    return scope, f"no process has SLURM_JOB_ID={spec.slurm_job}{step}", ""
