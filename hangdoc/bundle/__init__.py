"""Save a ``JobSnapshot`` to a file and read it back (``diagnose --save``, ``analyze``).

A bundle is one JSON object (gzip-compressed when the path ends in ``.gz``). Version 2
stores every value that repeats once, in tables (docs/json-schema.md, "Snapshot files")::

    {"kind": "hangdoc-snapshot", "schema_version": 2, "hangdoc_version": "0.1.0",
     "strings": ["MainThread", "sleeping", ...],
     "frames": [{"function": ..., "filename": ..., "line": ..., "native": ..., "code": ...}],
     "stacks": [[0, 1, 2], ...],
     "tables": {"ThreadStack": {"n": 800000, "columns": {"thread_id": {"runs": [...]}, ...},
                                "shared": {"n": 259, "columns": {"frames": [...], ...}},
                                "shared_row": [...]},
                "ThreadStack[]": {"n": 100000, "lengths": [...], "items": {"runs": [...]}},
                "(str,str)[]": {"n": 100000, "width": 19, "items": {"runs": [...]}},
                ...},
     "snapshot": {"spec": ..., "ranks": [{"process": 0, "samples": 0}, ...], ...}}

- **Frames and stacks** are interned as in version 1: every distinct frame once in
  ``frames``, every distinct stack once in ``stacks`` as frame indices.
- **Records** of the types in ``TABLED`` (the per-rank, per-sample and per-thread ones:
  ``RankProcess``, ``Sample``, ``ProcessState``, ``ThreadCounters``, ``ThreadStack``,
  ``FrameLocals``, ``CaptureError``) live in one table per type, each distinct record once,
  and are referred to by row number. So are the tuples these records hold (a sample's
  threads ``ThreadStack[]``, an environment ``(str,str)[]``, a command line ``str[]``) and
  the fixed tuples inside them (an environment pair ``(str,str)``). A waiting rank's three
  samples share their threads; ranks share their command line and environment pairs.
- **Tables are columnar**: ``n`` rows, and one list of ``n`` values per field. A string is
  an index into ``strings``; a frame, stack or record an index into its table. A column of
  integers may be written ``{"runs": [first, delta, count, delta, count, ...]}`` (the
  deltas between rows, run-length coded), which makes thread ids, pids, ranks and row
  numbers that count up cost a few numbers per rank instead of one per row. A column left
  out holds the field's default on every row. Fields whose values repeat as a group (a
  thread's name, stack and flags) may be stored once per distinct combination under
  ``shared``, with ``shared_row`` giving each row's combination. A table of tuples holds
  their ``lengths`` and all their ``items`` in one column, or, when every tuple has the
  same length, its ``width`` and the items position after position (every rank's first
  environment variable, then every rank's second, ...).
- **The rest** (``snapshot``: the ``JobSnapshot`` and its ranks, flight records, GPU state,
  sources, ...) is written field for field as in version 1, a field of a tabled type
  holding a row number (a rank's ``process`` and ``samples``). A field equal to its
  dataclass default is left out of its object.

Version 1 (one JSON object per record, only frames and stacks interned) is still read,
and written by ``snapshot_to_dict(..., schema_version=1)``. On a synthetic 100k-rank job
(3 samples, 4 to 12 threads and 19 environment variables a rank) version 1 takes 3,430
bytes a rank (116 gzipped); ``first`` reads it a rank at a time, with equal records shared
as version 2 shares them: ``hangdoc analyze --json`` of it takes about 10.7 s and 0.8 GB,
where version 2 takes 151 bytes a rank (17) and 4.5 s and 0.5 GB (docs/benchmarks.md).

The conversion is driven by the model's type hints, not written field by field: each type
gets its converters (a codec for the ``snapshot`` part, a column layout for a table)
compiled once from its annotations, so a field added to ``model.py`` is saved and loaded
without touching this package. Tables are read a column at a time: a column's types and
ranges are checked in one pass over it and its records are built with the slot setters
of their classes (``TABLED`` classes are plain frozen slot dataclasses; this is checked),
without a Python call per field and row. A long list of objects written field for field
(a snapshot's ranks) is read the same way when they all have the same keys. Loading
shares what the file shares: one object per distinct stack, frame, string, record and
tuple, so equal threads of a rank's samples are the same object.

Reading a bad file raises ``BundleError`` with one line that says what is wrong and where
(``at tables.ThreadStack.columns.native_id[17]: ...``), and nothing else: only regular
files are opened (never blocking on a FIFO or reading ``/dev/zero``), the file and its
decompressed text are read up to a cap, integers are checked against the ranges in
``limits`` (a bool is not an int), and since a shared record or stack can be used many
times, the records and frames reachable from the snapshot are counted each time they are
used and capped, so that no file can make the analysis allocate or walk without bound
(``world_size: 2e9`` would ask for two billion expected ranks).

The files, each importing only those above it:

- ``files``: the bytes of a file, read safely within the size caps, and the path to save
  one to, refused before a capture;
- ``limits``: the integer ranges and the caps on what interning multiplies;
- ``invalid``: ``_Invalid``, a decoding failure and where it is;
- ``stacks``: ``StackTable``, frames and stacks numbered (the wire and the HTML report use
  it too);
- ``layout``: the kind, the version, and each table's layout from the type hints;
- ``columns``: a column as written (runs) and as read, checked a column at a time;
- ``tables``: ``_Tables``, a bundle being read, and what it has used (for the caps);
- ``codec``: the converters by type hints, and reading one column of any kind;
- ``writer``: ``snapshot_to_dict``, ``snapshot_bytes``, ``save_snapshot``;
- ``reader``: ``snapshot_from_dict``, ``snapshot_from_bytes``, ``load_snapshot``;
- ``first``: a version 1 bundle read a rank at a time (``reader`` falls back to the whole
  text for anything it does not expect, so errors stay the same).
"""

from __future__ import annotations

from ..model import MAX_WORLD_SIZE
from .files import MAX_FILE_BYTES, MAX_JSON_BYTES, check_save_path, read_input
from .layout import BUNDLE_SCHEMA_VERSION, KIND, TABLED
from .limits import (
    MAX_RECORDS,
    MAX_STACK_DEPTH,
    MAX_TABLE_ITEMS,
    MAX_TABLE_ROWS,
    MAX_THREAD_FRAMES,
)
from .reader import load_snapshot, snapshot_from_bytes, snapshot_from_dict
from .stacks import StackTable
from .writer import GZIP_LEVEL, save_snapshot, snapshot_bytes, snapshot_to_dict

# MAX_WORLD_SIZE is the model's; the ranges here rest on it
__all__ = [
    "BUNDLE_SCHEMA_VERSION",
    "GZIP_LEVEL",
    "KIND",
    "MAX_FILE_BYTES",
    "MAX_JSON_BYTES",
    "MAX_RECORDS",
    "MAX_STACK_DEPTH",
    "MAX_TABLE_ITEMS",
    "MAX_TABLE_ROWS",
    "MAX_THREAD_FRAMES",
    "MAX_WORLD_SIZE",
    "TABLED",
    "StackTable",
    "check_save_path",
    "load_snapshot",
    "read_input",
    "save_snapshot",
    "snapshot_bytes",
    "snapshot_from_bytes",
    "snapshot_from_dict",
    "snapshot_to_dict",
]
