"""A directory of flight recorder dumps (one file per rank) as a ``JobSnapshot``.

torch writes one dump per rank, named with the rank at the end (``TORCH_FR_DUMP_TEMP_FILE``
is a prefix: ``/tmp/nccl_trace_rank_3``); torch's analyzer reads the rank from that
suffix, and so does this. Each file becomes a rank with its ``FlightRecord`` and no stack
sample: the verdict then rests on the dumps alone, and the notes say so.

The directory may be a shared one (``hangdoc analyze /tmp``), so every file in it is
somebody else's until shown otherwise: the directory is opened once and each name in it
is opened relative to it without following a link and without blocking (a FIFO put in
place of a dump after the listing is refused at once, never waited on), checked to be a
regular file and read once: a file seen under two names (a hard link) is read once. A
file refused says why in the notes and the rest of the directory is still read.

Bounded: at most ``MAX_FILES`` dumps, each at most ``MAX_FILE_BYTES``, ``MAX_DIR_BYTES`` in
all (the files past it are named as not read), and ``MAX_DIR_ENTRIES`` entries kept in all:
with many ranks each keeps its newest ``MAX_DIR_ENTRIES // files``, the ops a hang is in.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from ... import __version__
from ...errors import BundleError
from ...filekinds import file_kind
from ...model import FlightRecord, JobSnapshot, Note, RankProcess, RankSnapshot, RankSource, counted
from ...safefiles import open_to_read, read_at_most
from ..read.flight_recorder import MAX_ENTRIES, FlightRecordInvalid, read_dump

# torch 2.13 (gloo, TORCH_FR_BUFFER_SIZE=2000, stacks on) writes 255 kB of pickle for a full
# ring of 2,000 entries and 0.95 MB of JSON (_dump_fr_trace_json): 16 MiB holds a ring ten
# times that size in JSON, sixty times in pickle
MAX_FILE_BYTES = 16 * 2**20
MAX_DIR_BYTES = 2**30  # 4,000 ranks of full 2,000-entry pickles
MAX_FILES = 50_000
MAX_DIR_ENTRIES = 500_000  # a kept entry costs about 500 bytes: 250 MB
_MAX_NAMES = 1_000_000  # names looked at in the directory, dumps or not
_LISTED = 8  # files named in a note
_RANK_AT_END = re.compile(r"(\d+)(?:\.json|\.pkl|\.pickle)?$")


_SPECIAL = "a special file"  # a kind of file without a name of its own here


class FlightDirError(BundleError):
    """A directory given to ``hangdoc analyze`` holds no flight recorder dump it can read."""

    help = (
        "Pass the directory torch wrote its flight recorder dumps to (TORCH_FR_DUMP_TEMP_FILE's "
        "directory): one file per rank, the rank at the end of the name."
    )


class _Refused(Exception):
    """One file not read as a dump; ``str()`` says why, in a few words."""


def read_flight_dir(path: Path) -> JobSnapshot:
    """Every dump in ``path`` (not recursive), as one rank each."""
    try:
        dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise FlightDirError(f"cannot read directory {path}: {err.strerror or err}", help=FlightDirError.help) from None
    try:
        return _read_all(path, dir_fd)
    finally:
        os.close(dir_fd)


def _read_all(path: Path, dir_fd: int) -> JobSnapshot:
    names, skipped, more = _list(path, dir_fd)
    ranks: dict[int, RankSnapshot] = {}
    seen: dict[tuple[int, int], str] = {}  # (st_dev, st_ino) of each file read: its name
    keep = min(MAX_ENTRIES, MAX_DIR_ENTRIES // max(1, len(names)))
    total = 0
    for at, (name, rank) in enumerate(names):
        if total >= MAX_DIR_BYTES:
            more.append(f"{counted(len(names) - at, 'file')} not read: {MAX_DIR_BYTES >> 20:,} MiB read already")
            break
        try:
            raw = _read(dir_fd, name, seen)
            total += len(raw)
            record = read_dump(raw, f"file {_shown(name)}", keep)
        except (_Refused, FlightRecordInvalid) as err:
            skipped.append(f"{_shown(name)} ({err})")
            continue
        if rank in ranks:
            raise FlightDirError(
                f"{path}: two dumps for rank {rank} ({_shown(name)} and another)", help=FlightDirError.help
            )
        process = RankProcess(
            pid=0,
            host="",
            rank=rank,
            rank_source=RankSource.INFERRED,
            rank_evidence=f"from the dump's file name {_shown(name)}",
            world_size=_world_size(record, rank),
        )
        ranks[rank] = RankSnapshot(process=process, samples=(), flight=record)
    skipped.sort()
    if not ranks:
        raise FlightDirError(
            f"{path}: no flight recorder dump in it" + (f" (not read: {', '.join(skipped[:5])})" if skipped else ""),
            help=FlightDirError.help,
        )
    notes = [
        f"flight recorder dumps of {counted(len(ranks), 'rank')} from {path}; "
        "no stacks: the verdict rests on the dumps alone"
    ]
    if keep < MAX_ENTRIES:
        notes.append(f"{len(names):,} dumps: the newest {keep:,} entries of each were kept")
    if skipped:
        notes.append(
            f"not read as dumps: {', '.join(skipped[:_LISTED])}"
            + (f" and {len(skipped) - _LISTED:,} more" if len(skipped) > _LISTED else "")
        )
    notes.extend(more)
    # the files hold the ranks someone dumped: a rank without one is not seen, never missing
    return JobSnapshot(
        spec=f"flight recorder dumps in {path.name}",
        ranks=tuple(ranks[r] for r in sorted(ranks)),
        hangdoc_version=__version__,
        notes=tuple(map(Note, notes)),
        nodes_searched=False,
    )


def _world_size(record: FlightRecord, rank: int) -> int | None:
    """The job's size by the dump's config of WORLD (``default_pg``; gloo names it ``''``):
    its ranks, where they are 0..n-1 and hold the rank that wrote it."""
    sizes = [
        len(g.ranks)
        for g in record.groups
        if (g.desc == "default_pg" or not g.name) and g.ranks == tuple(range(len(g.ranks))) and rank in g.ranks
    ]
    return max(sizes) if sizes else None


def _list(path: Path, dir_fd: int) -> tuple[list[tuple[str, int]], list[str], list[str]]:
    """The names that may be dumps (with their rank), sorted; the names refused, with why
    (other names only the first few); notes on limits reached."""
    names: list[tuple[str, int]] = []
    skipped: list[str] = []
    more: list[str] = []
    others = 0
    try:
        with os.scandir(dir_fd) as listing:
            for count, item in enumerate(listing):
                if count >= _MAX_NAMES or len(names) >= MAX_FILES:
                    more.append(f"more than {len(names):,} dumps or {count:,} names in {path}: the rest not read")
                    break
                match = _RANK_AT_END.search(item.name)
                if item.name.startswith("."):
                    continue
                if match is None or len(match.group(1)) > 9:
                    others += 1
                    if others <= _LISTED:
                        skipped.append(_shown(item.name))
                elif item.is_symlink():  # d_type: no system call; _read refuses one put in later
                    skipped.append(f"{_shown(item.name)} (a symbolic link, not followed)")
                elif not item.is_file(follow_symlinks=False):  # a device is never even opened
                    skipped.append(f"{_shown(item.name)} ({_kind_of(item)}, not a regular file)")
                else:
                    names.append((item.name, int(match.group(1))))
    except OSError as err:
        raise FlightDirError(f"cannot list directory {path}: {err.strerror or err}", help=FlightDirError.help) from None
    if others > _LISTED:
        more.append(f"{counted(others - _LISTED, 'more file')} without a rank at the end of the name not read")
    return sorted(names), skipped, more


def _read(dir_fd: int, name: str, seen: dict[tuple[int, int], str]) -> bytes:
    """The bytes of the regular file ``name`` in the directory, opened without following a
    link or blocking; ``_Refused`` for anything else, or a file already read."""
    try:
        fd = open_to_read(name, dir_fd=dir_fd, follow_links=False)
    except OSError as err:
        raise _Refused(
            "a symbolic link, not followed" if err.errno == errno.ELOOP else err.strerror or str(err)
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _Refused(f"{file_kind(info.st_mode, _SPECIAL)}, not a regular file")
        first = seen.setdefault((info.st_dev, info.st_ino), name)
        if first != name:
            raise _Refused(f"the same file as {_shown(first)}")
        raw = read_at_most(fd, MAX_FILE_BYTES)
        if raw is None:
            raise _Refused(f"larger than {MAX_FILE_BYTES >> 20} MiB, more than any flight recorder dump")
        return raw
    except OSError as err:
        raise _Refused(err.strerror or str(err)) from None
    finally:
        os.close(fd)


def _kind_of(item: os.DirEntry[str]) -> str:
    try:
        return file_kind(item.stat(follow_symlinks=False).st_mode, _SPECIAL)
    except OSError:  # gone since the listing
        return _SPECIAL


def _shown(name: str) -> str:
    """A file name for a one-line message: control characters escaped, at most 100 kept."""
    shown = name if name.isprintable() else ascii(name)[1:-1]
    return shown if len(shown) <= 100 else shown[:100] + "..."
