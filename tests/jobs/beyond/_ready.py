"""Readiness marker for corpus jobs: tells the test harness a rank is about to block.

A job calls ``mark_ready(rank)`` right before the call it hangs in (healthy jobs: after a
few warm-up steps). The marker is only a signal for the harness; nothing about the hang may
depend on it. Outside the harness (``HANGDOC_READY_DIR`` unset) it does nothing.
"""

import os
from pathlib import Path


def mark_ready(rank: int) -> None:
    """Write ``$HANGDOC_READY_DIR/ready.<rank>`` holding this process's pid."""
    ready_dir = os.environ.get("HANGDOC_READY_DIR")
    if not ready_dir:
        return
    tmp = Path(ready_dir, f".ready.{rank}.{os.getpid()}")
    tmp.write_text(str(os.getpid()))
    tmp.rename(Path(ready_dir, f"ready.{rank}"))
