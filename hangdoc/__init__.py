"""hangdoc: tells you why a distributed PyTorch job stopped making progress.

In a training loop, ``hangdoc.heartbeat(step)`` or ``with hangdoc.step():`` marks step
boundaries for the watchdog; they are dependency-free and cost well under a microsecond.
"""

__version__ = "0.1.0"
SCHEMA_VERSION = 1

from .heartbeat import heartbeat, step  # noqa: E402 - after the version, which it reads

__all__ = ["SCHEMA_VERSION", "__version__", "heartbeat", "step"]
