"""The report files a run writes besides its terminal or JSON report: ``--html``, ``--dot``,
``--svg``.

``check_targets`` runs before the capture, so that a path that cannot be written fails in
a second, not after a diagnosis; ``write_reports`` writes each file whole (a temporary
file renamed into place: a reader never sees half a report). Both raise ``UsageError``
with the option's name and what to do.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn

from ..errors import UsageError, shown
from ..model import Diagnosis, JobSnapshot

_HELP = "Give a file path in an existing directory this user can write."


def _renderers() -> dict[str, Callable[[Diagnosis, JobSnapshot], str]]:
    from .graph import render_dot, render_svg
    from .html import render_html

    return {
        "html": render_html,
        "dot": lambda diagnosis, _snapshot: render_dot(diagnosis),
        "svg": lambda diagnosis, _snapshot: render_svg(diagnosis),
    }


def check_targets(targets: Mapping[str, str | None]) -> None:
    """Refuse, before anything runs, a report path (``{"html": "r.html", ...}``) that is a
    directory or lies in a directory that does not exist or cannot be written."""
    for kind, path in targets.items():
        if not path:
            continue
        where = Path(path)
        parent = where.parent if str(where.parent) else Path(".")
        if where.is_dir():
            _fail(kind, path, "is a directory")
        if not parent.is_dir():
            _fail(kind, path, f"directory {shown(str(parent))} does not exist")
        if not os.access(parent, os.W_OK | os.X_OK):
            _fail(kind, path, f"directory {shown(str(parent))} is not writable")


def write_reports(targets: Mapping[str, str | None], diagnosis: Diagnosis, snapshot: JobSnapshot) -> list[Path]:
    """Write each requested report (``html``, ``dot``, ``svg`` -> path); returns the paths."""
    renderers = _renderers()
    written = []
    for kind, path in targets.items():
        if not path:
            continue
        text = renderers[kind](diagnosis, snapshot)
        written.append(_write(kind, Path(path), text))
    return written


def _write(kind: str, path: Path, text: str) -> Path:
    data = text.encode("utf-8", "backslashreplace")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    created = False
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
        created = True
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
        return path
    except (OSError, ValueError) as err:  # ValueError: a NUL in the path
        if created:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        reason = (err.strerror if isinstance(err, OSError) else None) or str(err)
        _fail(kind, str(path), f"cannot be written: {reason}")


def _fail(kind: str, path: str, why: str) -> NoReturn:
    raise UsageError(f"--{kind} {shown(path)}: {why}", help=_HELP)
