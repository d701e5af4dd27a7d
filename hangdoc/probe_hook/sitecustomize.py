"""``hangdoc run``'s start-up hook: first on PYTHONPATH, so every Python process the command
starts imports it at start-up, whatever environment that Python belongs to.

It starts the in-process probe (``hangdoc.probe.start_from_environment``); where that
Python cannot import hangdoc, from ``HANGDOC_PROBE_FILE`` (the probe module of the hangdoc
that ran the command: standard library only). Then it leaves ``sys.path`` as it would have
been and runs the ``sitecustomize`` it shadows, if there is one. Nothing here may break the
job: every failure is silent, or one line on stderr with ``HANGDOC_PROBE=verbose``.

Python 3.6 syntax at most: any Python the command starts reads this file.
"""

import os
import sys

TYPE_CHECKING = False  # typing is not imported at start-up: the annotations are strings
if TYPE_CHECKING:
    from collections.abc import Callable


def _hangdoc_start_probe() -> None:
    verbose = os.environ.get("HANGDOC_PROBE") == "verbose"
    try:
        start_from_environment = _probe_starter()
        if start_from_environment is not None:
            start_from_environment()
    except Exception as err:  # noqa: BLE001 - the job starts whatever happens here
        if verbose:
            print(f"hangdoc.probe: not started: {type(err).__name__}: {err}", file=sys.stderr)


def _probe_starter() -> "Callable[[], object] | None":
    """This Python's own hangdoc probe, or else the one from the file ``hangdoc run`` named."""
    try:
        from hangdoc.probe import start_from_environment
    except ImportError:
        return _load_probe_file()
    return start_from_environment


def _load_probe_file() -> "Callable[[], object] | None":
    """The probe module from the file ``hangdoc run`` named, under a private name."""
    path = os.environ.get("HANGDOC_PROBE_FILE")
    if not path or not os.path.isfile(path):
        return None
    import importlib.util

    spec = importlib.util.spec_from_file_location("_hangdoc_probe", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_hangdoc_probe"] = module  # one copy per process, as an import would keep
    spec.loader.exec_module(module)
    start_from_environment: Callable[[], object] = module.start_from_environment
    return start_from_environment


def _hangdoc_chain() -> None:
    """Leave sys.path without this directory, and run the sitecustomize it shadowed."""
    here = os.path.dirname(os.path.realpath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)  # its errors are reported by site, as without hangdoc


if __name__ == "sitecustomize":  # at start-up; imported by its package name, it does nothing
    _hangdoc_start_probe()
    _hangdoc_chain()
