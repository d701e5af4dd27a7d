"""A job that only sleeps, for testing the harness itself."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

from .harness import JOBS_DIR

TINY_JOB = textwrap.dedent('''\
    # hangdoc-expect: verdict=not_hung culprits=none
    # hangdoc-launch: {launch}
    """A job that only sleeps, for testing the harness."""
    import os
    import sys
    import time

    from _ready import mark_ready


    def worker(rank):
        print(f"rank={{rank}} world={{os.environ.get('WORLD_SIZE')}} "
              f"slurm={{os.environ.get('SLURM_PROCID')}} "
              f"master={{os.environ.get('MASTER_ADDR')}}:{{os.environ.get('MASTER_PORT')}}",
              flush=True)
        mark_ready(rank)
        time.sleep(600)


    if __name__ == "__main__":
        if "HANGDOC_TEST_NPROC" in os.environ:
            import multiprocessing as mp
            ctx = mp.get_context("spawn")
            procs = [ctx.Process(target=worker, args=(r,))
                     for r in range(int(os.environ["HANGDOC_TEST_NPROC"]))]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
        else:
            worker(int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "-1"))))
''')


def write_job(tmp_path: Path, launch_line: str) -> Path:
    script = tmp_path / "job" / "tiny_job.py"
    script.parent.mkdir()
    script.write_text(TINY_JOB.format(launch=launch_line))
    shutil.copy(JOBS_DIR / "_ready.py", script.parent / "_ready.py")
    return script
