"""Starting the in-process probe (``hangdoc.probe``) without touching the training script.

One switch, ``HANGDOC_PROBE`` (``1``, or ``verbose`` to hear from each process on stderr),
read by two hooks that Python runs at start-up:

- ``hangdoc-probe.pth``: the build puts a copy in site-packages (``setup.py``: wheel and
  editable installs alike), so every Python of that environment runs its one line. Unset,
  it costs one environment lookup; set, it starts the probe, and where hangdoc cannot be
  imported it does nothing, silently.
- ``sitecustomize.py``: ``hangdoc run`` puts this directory first on ``PYTHONPATH``
  (``run_environment``), so every Python process the command starts, in any environment,
  starts the probe: from its own hangdoc, or else from the probe module of the hangdoc
  that ran the command (``HANGDOC_PROBE_FILE``). It needs no ``.pth``, and runs the
  ``sitecustomize`` it shadows.

A process started with ``python -S`` (no site) or ``-E``/``-I`` (no PYTHONPATH) is not
reached by the second; only ``start()`` in the script reaches every process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ..probe import ENV

BOOT_DIR = Path(__file__).resolve().parent  # holds sitecustomize.py: first on PYTHONPATH
PTH_NAME = "hangdoc-probe.pth"
PROBE_FILE_ENV = "HANGDOC_PROBE_FILE"


def run_environment(env: Mapping[str, str], verbose: bool = False) -> dict[str, str]:
    """``env`` for a command whose Python processes all start the probe."""
    out = dict(env)
    out[ENV] = "verbose" if verbose else "1"
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(BOOT_DIR)]
    out["PYTHONPATH"] = os.pathsep.join([str(BOOT_DIR), *paths])
    out[PROBE_FILE_ENV] = str(BOOT_DIR.parent / "probe.py")
    return out
