"""The corpus's readiness marker for the jobs of this folder: ``tests/jobs/_ready.py`` itself
(a job is run as ``python tests/jobs/beyond/JOB.py``, so this folder is where it imports from)."""

from pathlib import Path

_SHARED = Path(__file__).resolve().parent.parent / "_ready.py"
exec(compile(_SHARED.read_text(), str(_SHARED), "exec"))
