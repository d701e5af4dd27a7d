"""The report files a run writes besides its terminal or JSON report: ``--html``, ``--dot``,
``--svg``, and the sampled stacks for profilers' viewers, ``--speedscope`` and ``--folded``.

``check_targets`` runs before the capture, so that a path that cannot be written fails in
a second, not after a diagnosis; ``write_reports`` writes each file whole and private
(``hangdoc.outfiles``: 0600, never through a link nor over another user's file). Both
raise ``UsageError`` with the option's name and what to do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn

from ..errors import UsageError, shown
from ..model import Diagnosis, JobSnapshot
from ..outfiles import Refused, check_target, write_file

_HELP = "Give a file path in an existing directory this user can write."


def _renderers() -> dict[str, Callable[[Diagnosis, JobSnapshot], str]]:
    from .exports import render_folded, render_speedscope
    from .graph import render_dot, render_svg
    from .html import render_html

    return {
        "html": render_html,
        "dot": lambda diagnosis, _snapshot: render_dot(diagnosis),
        "svg": lambda diagnosis, _snapshot: render_svg(diagnosis),
        "speedscope": render_speedscope,
        "folded": render_folded,
    }


def check_targets(targets: Mapping[str, str | None]) -> None:
    """Refuse, before anything runs, a report path (``{"html": "r.html", ...}``) that
    ``write_reports`` would refuse, or in a directory that does not exist or cannot be
    written."""
    for kind, path in targets.items():
        if path:
            try:
                check_target(path)
            except (OSError, ValueError) as err:  # ValueError: a NUL in the path
                _fail(kind, path, err)


def write_reports(targets: Mapping[str, str | None], diagnosis: Diagnosis, snapshot: JobSnapshot) -> list[Path]:
    """Write each requested report (``html``, ``dot``, ``svg``, ``speedscope``, ``folded``
    -> path); returns the paths."""
    renderers = _renderers()
    written = []
    for kind, path in targets.items():
        if not path:
            continue
        text = renderers[kind](diagnosis, snapshot)
        written.append(_write(kind, Path(path), text))
    return written


def _write(kind: str, path: Path, text: str) -> Path:
    try:
        return write_file(path, text.encode("utf-8", "backslashreplace"))
    except (OSError, ValueError) as err:  # ValueError: a NUL in the path
        _fail(kind, str(path), err)


def _fail(kind: str, path: str, err: Exception) -> NoReturn:
    if isinstance(err, Refused):
        raise UsageError(f"--{kind} {shown(path, 200)}: {err.why}", help=err.help)
    reason = (err.strerror if isinstance(err, OSError) else None) or str(err)
    raise UsageError(f"--{kind} {shown(path, 200)}: cannot be written: {reason}", help=_HELP)
