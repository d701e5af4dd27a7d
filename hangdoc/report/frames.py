"""Which frames of a stack a report shows, and in what words: the one place that decides it
for every reporter (the terminal's tree, the ``--svg`` picture).

A frame of the job's own code is a line of its own. A run of frames of one library (one
package under ``site-packages``, a frozen module, native code) folds into one line that
names the library's function the job called by its package path
(``torch.distributed.all_reduce (torch/distributed/distributed_c10d.py:2800)``), not the
decorators it passes through; where the run goes deeper, the line goes on with the frames
it ends in. ``fold`` returns the lines as ``Row`` values; how a row is styled is each
reporter's business.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import printable
from ..model import Frame

_LIB_MARKERS = ("site-packages/", "dist-packages/", "/lib/python3")
# the native frames that say which collective the C++ side waits in: kept in a long run
_TELLING_NATIVE = re.compile(r"c10d::|gloo::|nccl|Reducer|Work::wait|ProcessGroup", re.IGNORECASE)
_CALLS = re.compile(r"([A-Za-z_]\w*)\s*\(")


class RowKind(enum.Enum):
    """What a ``Row`` stands for."""

    OWN = "own"  # one frame of the job's own code
    LIBRARY = "library"  # one frame of a library, alone (a run of one is not folded)
    NATIVE = "native"  # one native frame, alone
    FOLDED = "folded"  # a run of two or more frames of one library, in one line


@dataclass(frozen=True, slots=True)
class Row:
    """One line of a folded stack: ``words`` (printable), how many ``frames`` it stands
    for, its ``kind``; ``code``: the source line of a frame of the job's own, as captured."""

    words: str
    frames: int
    kind: RowKind
    code: str | None = None


def package(frame: Frame) -> str | None:
    """The library a frame belongs to (``torch``, ``runpy`` for ``<frozen runpy>``,
    ``native``), or None for the job's own code."""
    if frame.native:
        return "native"
    name = frame.filename.replace("\\", "/")
    if name.startswith("<"):
        words = name.strip("<>").split()  # "<frozen runpy>" -> "runpy"
        return words[-1] if words else name
    if any(marker in name for marker in _LIB_MARKERS):
        return frame.short_filename.split("/", 1)[0].removesuffix(".py")
    return None


def fold(frames: Sequence[Frame]) -> list[Row]:
    """One row per frame of the job's own, one per run of library frames of one package."""
    rows: list[Row] = []
    i = 0
    while i < len(frames):
        pkg = package(frames[i])
        j = i + 1
        while pkg is not None and j < len(frames) and package(frames[j]) == pkg:
            j += 1
        run = frames[i:j]
        caller = frames[i - 1] if i else None
        if len(run) > 1:
            rows.append(Row(run_name(pkg, run, caller), len(run), RowKind.FOLDED))
        else:
            rows.append(_frame_row(run[0]))
        i = j
    return rows


def _frame_row(frame: Frame) -> Row:
    if frame.native:
        return Row(f"{printable(str(frame))} [native]", 1, RowKind.NATIVE)
    if package(frame) is not None:
        return Row(printable(str(frame)), 1, RowKind.LIBRARY)
    return Row(printable(str(frame)), 1, RowKind.OWN, frame.code)


def _short_name(frame: Frame) -> str:
    """A frame's function without its class or closure path (``wrapper`` for
    ``_exception_logger.<locals>.wrapper``), a native one without its signature."""
    if frame.native:
        return frame.function.split("(", 1)[0].split("<", 1)[0]
    return frame.function.rsplit(".", 1)[-1]


def run_name(pkg: str | None, run: Sequence[Frame], caller: Frame | None) -> str:
    """A run of one library's frames in one line (printable): the function the job called
    by the name the library gives it (``torch.distributed.all_reduce``, not the decorator's
    ``wrapper`` it passes through), then, where the run goes deeper, the frames it ends in."""
    at = _called(run, caller)
    api = library_name(run[at])
    if api is None:  # native code, a frozen module: the run by its frames' names
        at, api = 0, f"{pkg}: {_short_name(run[0])}"
    last = run[-1]
    if at == len(run) - 1:
        return printable(f"{api} ({last.location})")
    names = [api, *(_short_name(f) for f in run[at + 1 : -1])]
    if len(names) > 3:
        keep = [n for n in names[1:-1] if _TELLING_NATIVE.search(n)][:3]
        hidden = len(names) - 2 - len(keep)
        names = [names[0], *keep, *([f"…{hidden} more…"] if hidden else []), names[-1]]
    return printable(" › ".join([*names, str(last)]))


def _called(run: Sequence[Frame], caller: Frame | None) -> int:
    """Which frame of a library's ``run`` the job called: the one its caller's source line
    calls by name (``dist.all_reduce(x)``), else the first that is not a closure (a
    decorator's ``<locals>.wrapper``), else the first."""
    if caller is not None and caller.code:
        names = set(_CALLS.findall(caller.code))
        hit = next((i for i, f in enumerate(run) if _short_name(f) in names), None)
        if hit is not None:
            return hit
    return next((i for i, f in enumerate(run) if "<locals>" not in f.function), 0)


def library_name(frame: Frame) -> str | None:
    """A library's function by its package's dotted path, where libraries export their API
    (``torch.distributed.all_reduce`` for ``all_reduce`` in
    ``torch/distributed/distributed_c10d.py``; ``threading.Event.wait``); None for native
    code and frozen modules."""
    if frame.native or frame.filename.startswith("<"):
        return None
    parts = frame.short_filename.replace("\\", "/").removesuffix(".py").split("/")
    path = parts[:-1] or parts  # a module that is no package's (threading.py) names itself
    return ".".join([*path, _short_name(frame) if "<locals>" in frame.function else frame.function])
