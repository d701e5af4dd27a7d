"""Whether a rank's Python stacks cannot say where it waits, so that one native sample would.

The one question the analysis answers for capture before a diagnosis (``fleet.gather``
receives ``needs_native`` from ``diagnose.py``): the rank's last good sample has a thread

* idle with its Python stack ending inside the autograd engine (``backward()``, in the main
  thread or a training loop run in another thread: Ray Train's ``TrainingThread``), or in a
  C++ operator: only native frames show whether the engine waits in a gradient all-reduce;
* at a host sync by its Python frames (``device.python_host_sync``): only native frames show
  whether it waits in CUDA for an asynchronous collective, or computes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..model import Frame, RankProcess, Sample, ThreadStack
from .host_sync import python_host_sync, samples_gpu_evidence

# a Python stack ending in these torch modules may wait inside the C++ autograd engine
# (DDP's reducer), or in a C++ operator (a compiled graph's functional collective)
_ENGINE = ("torch/autograd/graph.py", "torch/autograd/__init__.py", "torch/_tensor.py", "torch/_ops.py")


def needs_native(samples: Sequence[Sample], process: RankProcess, code: Callable[[Frame], str | None]) -> bool:
    """One native sample of this rank would show where it waits (module doc); ``samples``
    are its samples so far, ``code`` gives a frame's source line."""
    good = [s for s in samples if s.error is None and s.threads]
    if not good:
        return False
    uses_gpu = samples_gpu_evidence(good, process) is not None
    return any(_in_engine(thread) or python_host_sync(thread, uses_gpu, code) for thread in good[-1].threads)


def _in_engine(thread: ThreadStack) -> bool:
    """Idle with its Python stack ending inside the autograd engine, whatever its name."""
    inner = thread.innermost_python
    return inner is not None and inner.origin.under(*_ENGINE) and not thread.active
