"""hangdoc: tells you why a distributed PyTorch job stopped making progress.

In a training loop, ``hangdoc.heartbeat(step)`` or ``with hangdoc.step():`` marks step
boundaries for the watchdog; they are dependency-free and cost well under a microsecond.

``hangdoc.diagnose(spec)`` and ``hangdoc.analyze(path_or_text)`` are the commands of the
same names as functions, returning a ``hangdoc.Report`` (``hangdoc.api``,
docs/python-api.md). They are imported on first use, so ``import hangdoc`` stays cheap.
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"
SCHEMA_VERSION = 1

from .heartbeat import heartbeat, step  # noqa: E402 - after the version, which it reads

if TYPE_CHECKING:
    from .api import Report, analyze, diagnose, report_schema
else:

    def __getattr__(name: str) -> object:
        # PEP 562: the API's names are looked up in hangdoc.api the first time they are used
        if name in _LAZY:
            from . import api

            value = getattr(api, name)
            globals()[name] = value
            return value
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_LAZY = ("Report", "analyze", "diagnose", "report_schema")

__all__ = ["SCHEMA_VERSION", "Report", "__version__", "analyze", "diagnose", "heartbeat", "report_schema", "step"]


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
