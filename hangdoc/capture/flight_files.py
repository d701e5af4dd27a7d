"""A directory of flight recorder dumps (one file per rank) as a ``JobSnapshot``.

torch writes one dump per rank, named with the rank at the end (``TORCH_FR_DUMP_TEMP_FILE``
is a prefix: ``/tmp/nccl_trace_rank_3``); torch's analyzer reads the rank from that
suffix, and so does this. Each file becomes a rank with its ``FlightRecord`` and no stack
sample: the verdict then rests on the dumps alone, and the notes say so. Bounded: at most
``MAX_FILES`` files of ``MAX_FILE_BYTES`` each; other files in the directory are named in
the notes, never read beyond their first bytes.
"""

from __future__ import annotations

import re
from pathlib import Path

from .. import __version__
from ..errors import BundleError
from ..model import JobSnapshot, RankProcess, RankSnapshot, RankSource
from .flight_recorder import FlightRecordInvalid, read_flight_record

MAX_FILES = 100_000
MAX_FILE_BYTES = 64 * 2**20
_RANK_AT_END = re.compile(r"(\d+)(?:\.json|\.pkl|\.pickle)?$")


class FlightDirError(BundleError):
    """A directory given to ``hangdoc analyze`` holds no flight recorder dump it can read."""

    help = ("Pass the directory torch wrote its flight recorder dumps to (TORCH_FR_DUMP_TEMP_FILE's "
            "directory): one file per rank, the rank at the end of the name.")


def read_flight_dir(path: Path) -> JobSnapshot:
    """Every dump in ``path`` (not recursive), as one rank each."""
    ranks: dict[int, RankSnapshot] = {}
    skipped: list[str] = []
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))[:MAX_FILES]
    for file in files:
        match = _RANK_AT_END.search(file.name)
        if match is None or file.stat().st_size > MAX_FILE_BYTES:
            skipped.append(file.name)
            continue
        try:
            record = read_flight_record(file.read_bytes(), source=f"file {file.name}")
        except (FlightRecordInvalid, OSError) as err:
            skipped.append(f"{file.name} ({err})")
            continue
        rank = int(match.group(1))
        if rank in ranks:
            raise FlightDirError(f"{path}: two dumps for rank {rank} ({file.name} and another)",
                                 help=FlightDirError.help)
        process = RankProcess(pid=0, host="", rank=rank, rank_source=RankSource.INFERRED,
                              rank_evidence=f"from the dump's file name {file.name}")
        ranks[rank] = RankSnapshot(process=process, samples=(), flight=record)
    if not ranks:
        raise FlightDirError(f"{path}: no flight recorder dump in it" +
                             (f" (not read: {', '.join(skipped[:5])})" if skipped else ""),
                             help=FlightDirError.help)
    notes = [(f"flight recorder dumps of {len(ranks)} rank(s) from {path}; no stacks: "
             "the verdict rests on the dumps alone")]
    if skipped:
        notes.append(f"not read as dumps: {', '.join(skipped[:8])}" + (" ..." if len(skipped) > 8 else ""))
    return JobSnapshot(spec=f"flight recorder dumps in {path.name}", ranks=tuple(ranks[r] for r in sorted(ranks)),
                       hangdoc_version=__version__, notes=tuple(notes))
