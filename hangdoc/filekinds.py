"""What a file that is not a regular file is, in words, for the one-line errors of every
floor that opens files it was given (snapshots, flight recorder dumps, output paths)."""

from __future__ import annotations

import stat

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int, other: str = "not a regular file") -> str:
    """``a FIFO (named pipe)``, ``a directory``, ... for ``st_mode``; ``other`` for any other
    kind (a regular file included: callers ask only of files that are not)."""
    return next((name for test, name in _KINDS if test(mode)), other)
