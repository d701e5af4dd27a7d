"""``hangdoc analyze FILE``: a saved snapshot, or the stack dumps a user already has, as a
``JobSnapshot``.

``load_evidence`` reads the file as ``bundle`` reads a snapshot (regular files only, size
caps, gzip recognised by its content) and tells by the content what it holds:

- a JSON object: a snapshot written by ``--save`` (``bundle.snapshot_from_bytes``, with its
  own errors for reports and corrupt files);
- ``Stack dump for`` lines: ``ray stack`` output; ``Process N:`` or ``Thread N (idle)``
  lines: the text of ``py-spy dump``, for one process or many (``dumptext``);
- JSON lists: ``py-spy dump --json`` output, one dump or several (``dumpjson``);
- stacks as people paste them: frame lines without py-spy's headers, tracebacks,
  faulthandler's output, under labels such as ``TP0 stuck in:`` (``dumpcondensed``);
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
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from ... import __version__
from ...bundle import read_input, snapshot_from_bytes
from ...errors import DumpFileError
from ...model import (
    MAX_WORLD_SIZE,
    PID_MAX,
    CaptureError,
    CaptureErrorKind,
    JobSnapshot,
    Note,
    RankProcess,
    RankSnapshot,
    Sample,
)
from ...safefiles import read_at_most
from ..find.redact import redact_argv
from .dumpcondensed import describe, looks_condensed, parse_condensed
from .dumped import ProcessDump
from .dumpjson import parse_json
from .dumpranks import dump_hint, not_a_rank, number, ray_actor, ray_training_classes
from .dumptext import looks_like_text_dump, parse_text
from .flight_files import read_flight_dir

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
    CONDENSED = "pasted stacks (frame lines or tracebacks under labels)"


def sniff(text: str) -> DumpFormat | None:
    """What ``text`` holds, by its content; None when it is none of the formats."""
    stripped = text.lstrip("\ufeff \t\r\n")
    if not stripped or stripped[0] == "{":
        return DumpFormat.SNAPSHOT
    lines = text.splitlines()
    if looks_like_text_dump(lines):
        ray = any(line.lstrip().startswith("Stack dump for ") for line in lines)
        return DumpFormat.RAY_STACK if ray else DumpFormat.PYSPY_TEXT
    json = any(line.lstrip().startswith("[") for line in lines)
    if looks_condensed(lines) and not (json and _json_list(stripped)):
        return DumpFormat.CONDENSED
    if json:
        return DumpFormat.PYSPY_JSON
    return None


def _json_list(text: str) -> bool:
    """Whether ``text`` opens as a JSON list (``[{`` or ``[]``), not ``[rank3]:`` text."""
    return text.startswith("[") and text[1:].lstrip()[:1] in ("{", "[", "]")


def read_stdin(stream: BinaryIO) -> bytes:
    """What ``hangdoc analyze -`` reads: standard input, at most ``MAX_DUMP_BYTES``."""
    try:
        raw = read_at_most(stream.fileno(), MAX_DUMP_BYTES)
    except OSError as err:
        raise DumpFileError(f"standard input could not be read: {err.strerror or err}") from None
    if raw is None:
        raise DumpFileError(
            f"more than {MAX_DUMP_BYTES // 2**20} MiB on standard input, more "
            "than hangdoc reads as dumps: save it to a file and pass that"
        )
    if raw.startswith(b"\x1f\x8b"):
        raise DumpFileError(
            "gzip data on standard input: pass the file itself "
            "(`hangdoc analyze FILE.gz`) or inflate it (`zcat FILE.gz | "
            "hangdoc analyze -`)"
        )
    return raw


def load_evidence(path: str | Path, stdin: BinaryIO | None = None) -> JobSnapshot:
    """The snapshot in the file ``path``: a saved one, or one built from stack dumps; with
    ``stdin``, what it holds (``path`` is ``-``).

    Raises ``BundleError`` (``DumpFileError`` for dumps) and nothing else.
    """
    path = Path("<stdin>") if stdin is not None else Path(path)
    if stdin is None and path.is_dir():  # torch's flight recorder: one dump per rank
        return read_flight_dir(path)
    return evidence_from_bytes(read_stdin(stdin) if stdin is not None else read_input(path), path)


def evidence_from_bytes(raw: bytes, path: Path) -> JobSnapshot:
    """The snapshot in ``raw``, the (inflated) content of a file ``load_evidence`` reads,
    named ``path`` in the snapshot and in errors. Raises ``BundleError`` and nothing else."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return snapshot_from_bytes(raw, path)  # says what a binary file is not
    fmt = sniff(text)
    if fmt is DumpFormat.SNAPSHOT:
        del text  # the reader decodes raw itself, a chunk at a time
        return snapshot_from_bytes(raw, path)
    if fmt is None:
        raise DumpFileError(
            f"{path}: neither a hangdoc snapshot nor a stack dump: no "
            "'Process N:' or 'Thread N (idle)' line of py-spy's text, no "
            "'Stack dump for' line of ray stack, no JSON, no frame line "
            "('function (file.py:LINE)') and no traceback "
            "('File \"file.py\", line N, in function')"
        )
    if len(raw) > MAX_DUMP_BYTES:
        raise DumpFileError(
            f"{path}: {len(raw):,} bytes of {fmt.value}, more than the "
            f"{MAX_DUMP_BYTES // 2**20} MiB hangdoc reads as dumps: split it "
            "by node and analyse each part"
        )
    del raw
    skipped = 0
    read_notes: list[str] = []
    if fmt is DumpFormat.PYSPY_JSON:
        dumps = parse_json(text, str(path))
    elif fmt is DumpFormat.CONDENSED:
        condensed = parse_condensed(text.splitlines(), str(path))
        dumps = list(condensed.dumps)
        read_notes = describe(condensed, path.name)
    else:
        dumps, skipped = parse_text(text.splitlines(), str(path))
    if not dumps:
        raise DumpFileError(f"{path}: {fmt.value} without a single dump in it" + "".join(f"; {n}" for n in read_notes))
    return snapshot_of(dumps, fmt, path, skipped, read_notes)


def snapshot_of(
    dumps: Sequence[ProcessDump], fmt: DumpFormat, path: Path, skipped: int = 0, read_notes: Sequence[str] = ()
) -> JobSnapshot:
    """The snapshot of the dumps a file holds (see the module docstring); ``read_notes``
    say what its reader took from the text and what it skipped."""
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
        raise DumpFileError(
            f"{path}: dumps of {len(kept):,} processes, more than the {MAX_WORLD_SIZE:,} ranks hangdoc analyses"
        )
    hints = [dump_hint(group[0]) for group in kept]
    numbering = number(hints)
    ranks = []
    for group, h, (rank, source, evidence) in zip(kept, hints, numbering.ranks, strict=False):
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
    notes.append(
        f"read from {fmt.value} in {path.name}: {count} dump"
        f"{'s' if count != 1 else ''} of {len(processes)} process"
        f"{'es' if len(processes) != 1 else ''}"
    )
    notes.append(numbering.note)
    notes.extend(read_notes)
    for why, who in left_out.items():
        notes.append(f"left out as not a rank ({why}): {_listed(who)}")
    if inferred_pids:
        notes.append(f"no 'Process' line for {_listed(inferred_pids)}: the pid is the id of its main thread")
    if any(not g[0].pid for g in kept):
        notes.append("some dumps show no pid (pid 0 in this report)")
    if numbering.world_size is None:
        notes.append("no world size shown: a rank with no dump in the file is not seen, and not reported missing")
    dumped_again = sum(1 for g in kept if len(g) > 1)
    if dumped_again:
        notes.append(
            f"{dumped_again} of {len(kept)} processes dumped more than once: their "
            "dumps are samples in the file's order; the time between them is unknown"
        )
    else:
        notes.append(
            "one dump per process: whether the job moves is unknown (dump every "
            "process again into the same file, or run `hangdoc diagnose` on the job)"
        )
    notes.append(
        "a dump has no CPU, I/O or timing counters and no source lines: states are "
        "read from stacks alone, and a `finally:` around a wait is not seen"
    )
    if skipped:
        notes.append(f"{skipped} line{'s' if skipped != 1 else ''} longer than py-spy prints skipped")
    return JobSnapshot(
        spec=f"{path.name} ({fmt.value})",
        ranks=tuple(ranks),
        world_size=numbering.world_size,
        hangdoc_version=__version__,
        notes=tuple(map(Note, notes)),
        stacks_may_be_cut=fmt in (DumpFormat.PYSPY_TEXT, DumpFormat.RAY_STACK, DumpFormat.CONDENSED),
        nodes_searched=False,  # the processes someone dumped, not every process of a node
    )


def _processes(dumps: Sequence[ProcessDump]) -> tuple[list[list[ProcessDump]], list[str]]:
    """The dumps grouped by process, in order of first appearance; a dump without a pid
    takes the one its label names, else its main thread's OS id (the pid, on Linux).
    Dumps of one pid that show different ranks are of different processes (nodes whose
    containers number processes alike)."""
    groups: dict[object, list[ProcessDump]] = {}
    inferred: list[str] = []
    for k, dump in enumerate(dumps):
        shown = dump_hint(dump)
        pid = dump.pid
        if pid is None:
            pid = shown.pid
        if pid is None:
            main = next((t for t in dump.threads if t.is_main and t.native_id), None)
            if main is not None and main.native_id is not None and main.native_id <= PID_MAX:
                pid = main.native_id
                inferred.append(f"pid {pid}")
        if pid is not None and pid != dump.pid:
            dump = replace(dump, pid=pid)
        groups.setdefault((pid, shown.rank) if pid is not None else ("dump", k), []).append(dump)
    return list(groups.values()), list(dict.fromkeys(inferred))


def _sample(dump: ProcessDump) -> Sample:
    error = dump.error
    if error is None and not dump.threads:
        error = CaptureError(CaptureErrorKind.PYSPY_FAILED, f"the dump at line {dump.line} shows no thread")
    return Sample(t=0.0, threads=dump.threads if error is None else (), error=error)


def _who(dump: ProcessDump) -> str:
    return f"pid {dump.pid}" if dump.pid else f"the dump at line {dump.line}"


def _listed(items: Sequence[str]) -> str:
    more = len(items) - _LISTED
    return ", ".join(items[:_LISTED]) + (f" and {more} more" if more > 0 else "")
