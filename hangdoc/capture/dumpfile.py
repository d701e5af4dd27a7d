"""``hangdoc analyze FILE``: a saved snapshot, or the stack dumps a user already has, as a
``JobSnapshot``.

``load_evidence`` reads the file as ``bundle`` reads a snapshot (regular files only, size
caps, gzip recognised by its content) and tells by the content what it holds:

- a JSON object: a snapshot written by ``--save`` (``bundle.snapshot_from_bytes``, with its
  own errors for reports and corrupt files);
- ``Stack dump for`` lines: ``ray stack`` output; ``Process N:`` or ``Thread N (idle)``
  lines: the text of ``py-spy dump``, for one process or many (``dumptext``);
- JSON lists: ``py-spy dump --json`` output, one dump or several (``dumpjson``);
- a directory: flight recorder dumps, one file per rank (``flight_files``).

A dump file becomes a snapshot with one ``RankSnapshot`` per process (several dumps of one
pid are its samples, in the file's order), each rank numbered as ``dumpranks`` finds it,
and notes that say what a file cannot show: where the ranks came from, which processes
were left out, a world size nobody showed, no timing, CPU or I/O counters, no source
lines. Whether the job moves is judged only where a process was dumped more than once.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from pathlib import Path

from .. import __version__
from ..bundle import read_input, snapshot_from_bytes
from ..errors import DumpFileError
from ..model import (
    MAX_WORLD_SIZE,
    PID_MAX,
    CaptureError,
    CaptureErrorKind,
    JobSnapshot,
    RankProcess,
    RankSnapshot,
    Sample,
)
from .dumped import ProcessDump
from .dumpjson import parse_json
from .dumpranks import hint, not_a_rank, number, ray_actor, ray_training_classes
from .dumptext import looks_like_text_dump, parse_text
from .flight_files import read_flight_dir
from .redact import redact_argv

# A py-spy dump of one process is 2-50 kB (a thousand ranks with --locals stay under
# 64 MiB); a larger file is not a set of dumps, and parsing it would take minutes.
MAX_DUMP_BYTES = 64 * 2**20
_LISTED = 6  # pids named in a note before "and N more"


class DumpFormat(enum.Enum):
    """What a file given to ``hangdoc analyze`` holds."""

    SNAPSHOT = "a hangdoc snapshot"
    PYSPY_TEXT = "py-spy dump text"
    PYSPY_JSON = "py-spy dump --json output"
    RAY_STACK = "ray stack output"


def sniff(text: str) -> DumpFormat | None:
    """What ``text`` holds, by its content; None when it is none of the formats."""
    stripped = text.lstrip("\ufeff \t\r\n")
    if not stripped or stripped[0] == "{":
        return DumpFormat.SNAPSHOT
    lines = text.splitlines()
    if looks_like_text_dump(lines):
        ray = any(line.lstrip().startswith("Stack dump for ") for line in lines)
        return DumpFormat.RAY_STACK if ray else DumpFormat.PYSPY_TEXT
    if any(line.lstrip().startswith("[") for line in lines):
        return DumpFormat.PYSPY_JSON
    return None


def load_evidence(path: str | Path) -> JobSnapshot:
    """The snapshot in the file ``path``: a saved one, or one built from stack dumps.

    Raises ``BundleError`` (``DumpFileError`` for dumps) and nothing else.
    """
    path = Path(path)
    if path.is_dir():  # torch writes one flight recorder dump per rank into a directory
        return read_flight_dir(path)
    raw = read_input(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return snapshot_from_bytes(raw, path)  # says what a binary file is not
    fmt = sniff(text)
    if fmt is DumpFormat.SNAPSHOT:
        return snapshot_from_bytes(raw, path)
    if fmt is None:
        raise DumpFileError(f"{path}: neither a hangdoc snapshot nor a stack dump: no "
                            "'Process N:' or 'Thread N (idle)' line of py-spy's text, no "
                            "'Stack dump for' line of ray stack, no JSON")
    if len(raw) > MAX_DUMP_BYTES:
        raise DumpFileError(f"{path}: {len(raw):,} bytes of {fmt.value}, more than the "
                            f"{MAX_DUMP_BYTES // 2**20} MiB hangdoc reads as dumps: split it "
                            "by node and analyse each part")
    del raw
    skipped = 0
    if fmt is DumpFormat.PYSPY_JSON:
        dumps = parse_json(text, str(path))
    else:
        dumps, skipped = parse_text(text.splitlines(), str(path))
    if not dumps:
        raise DumpFileError(f"{path}: {fmt.value} without a single dump in it")
    return snapshot_of(dumps, fmt, path, skipped)


def snapshot_of(dumps: Sequence[ProcessDump], fmt: DumpFormat, path: Path,
                skipped: int = 0) -> JobSnapshot:
    """The snapshot of the dumps a file holds (see the module docstring)."""
    notes: list[str] = []
    processes, inferred_pids = _processes(dumps)
    left_out: dict[str, list[str]] = {}
    training = ray_training_classes(dumps) if fmt is DumpFormat.RAY_STACK else set()
    kept: list[list[ProcessDump]] = []
    for group in processes:
        first = group[0]
        threads = next((d.threads for d in group if d.threads), ())
        why = not_a_rank(threads, first.cmdline)
        actor = ray_actor(first.cmdline)
        if why is None and training and actor not in training:
            why = f"a Ray worker of another actor class than {', '.join(sorted(training))}"
        if why is not None:
            left_out.setdefault(why, []).append(_who(first))
        else:
            kept.append(group)
    if len(kept) > MAX_WORLD_SIZE:
        raise DumpFileError(f"{path}: dumps of {len(kept):,} processes, more than the "
                            f"{MAX_WORLD_SIZE:,} ranks hangdoc analyses")
    hints = [hint(group[0].cmdline, group[0].label) for group in kept]
    numbering = number(hints)
    ranks = []
    for group, h, (rank, source, evidence) in zip(kept, hints, numbering.ranks):
        process = RankProcess(
            pid=group[0].pid or 0,
            host="",
            rank=rank,
            rank_source=source,
            rank_evidence=evidence,
            world_size=numbering.world_size,
            local_rank=h.local_rank,
            cmdline=redact_argv(group[0].cmdline.split()),
            env=tuple(sorted(h.env)),
        )
        ranks.append(RankSnapshot(process, tuple(_sample(d) for d in group)))

    count = sum(len(g) for g in processes)
    notes.append(f"read from {fmt.value} in {path.name}: {count} dump"
                 f"{'s' if count != 1 else ''} of {len(processes)} process"
                 f"{'es' if len(processes) != 1 else ''}")
    notes.append(numbering.note)
    for why, who in left_out.items():
        notes.append(f"left out as not a rank ({why}): {_listed(who)}")
    if inferred_pids:
        notes.append(f"no 'Process' line for {_listed(inferred_pids)}: the pid is the id of "
                     "its main thread")
    if any(not g[0].pid for g in kept):
        notes.append("some dumps show no pid (pid 0 in this report)")
    if numbering.world_size is None:
        notes.append("no world size shown: a rank with no dump in the file is not seen, "
                     "and not reported missing")
    dumped_again = sum(1 for g in kept if len(g) > 1)
    if dumped_again:
        notes.append(f"{dumped_again} of {len(kept)} processes dumped more than once: their "
                     "dumps are samples in the file's order; the time between them is unknown")
    else:
        notes.append("one dump per process: whether the job moves is unknown (dump every "
                     "process again into the same file, or run `hangdoc diagnose` on the job)")
    notes.append("a dump has no CPU, I/O or timing counters and no source lines: states are "
                 "read from stacks alone, and a `finally:` around a wait is not seen")
    if skipped:
        notes.append(f"{skipped} line{'s' if skipped != 1 else ''} longer than py-spy "
                     "prints skipped")
    return JobSnapshot(
        spec=f"{path.name} ({fmt.value})",
        ranks=tuple(ranks),
        world_size=numbering.world_size,
        hangdoc_version=__version__,
        notes=tuple(notes),
        stacks_may_be_cut=fmt in (DumpFormat.PYSPY_TEXT, DumpFormat.RAY_STACK),
    )


def _processes(dumps: Sequence[ProcessDump]) -> tuple[list[list[ProcessDump]], list[str]]:
    """The dumps grouped by process, in order of first appearance; a dump without a pid
    takes the one its label names, else its main thread's OS id (the pid, on Linux).
    Dumps of one pid that show different ranks are of different processes (nodes whose
    containers number processes alike)."""
    groups: dict[object, list[ProcessDump]] = {}
    inferred: list[str] = []
    for k, dump in enumerate(dumps):
        shown = hint(dump.cmdline, dump.label)
        pid = dump.pid
        if pid is None:
            pid = shown.pid
        if pid is None:
            main = next((t for t in dump.threads if t.is_main and t.native_id), None)
            if main is not None and main.native_id is not None and main.native_id <= PID_MAX:
                pid = main.native_id
                inferred.append(f"pid {pid}")
        if pid is not None and pid != dump.pid:
            dump = ProcessDump(dump.line, pid, dump.cmdline, dump.label, dump.threads,
                               dump.error, dump.python)
        groups.setdefault((pid, shown.rank) if pid is not None else ("dump", k), []).append(dump)
    return list(groups.values()), list(dict.fromkeys(inferred))


def _sample(dump: ProcessDump) -> Sample:
    error = dump.error
    if error is None and not dump.threads:
        error = CaptureError(CaptureErrorKind.PYSPY_FAILED,
                             f"the dump at line {dump.line} shows no thread")
    return Sample(t=0.0, threads=dump.threads if error is None else (), error=error)


def _who(dump: ProcessDump) -> str:
    return f"pid {dump.pid}" if dump.pid else f"the dump at line {dump.line}"


def _listed(items: Sequence[str]) -> str:
    more = len(items) - _LISTED
    return ", ".join(items[:_LISTED]) + (f" and {more} more" if more > 0 else "")
