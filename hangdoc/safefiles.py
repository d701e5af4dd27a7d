"""Opening and reading a file that someone else named, without waiting and within a limit.

A path given on the command line, or a name in a shared directory, may be a FIFO (opening
it would wait for a writer), a terminal (opening it could make it this process's
controlling terminal), a link planted by another user, or a file larger than memory or one
that grows while it is read. ``open_to_read`` opens without blocking, without taking a
terminal, closed on ``exec`` and, asked to, without following a link in the last name
(``ELOOP``); ``read_at_most`` reads a descriptor up to a limit, counting the bytes. What
kind of file it is (``os.fstat``) and what to say when it is refused are the caller's.
Imports only the standard library.
"""

from __future__ import annotations

import os

READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
_READ_CHUNK = 4 * 2**20


def open_to_read(path: str | os.PathLike[str], *, dir_fd: int | None = None, follow_links: bool = True) -> int:
    """A descriptor of ``path`` (relative to ``dir_fd`` when given) opened with ``READ_FLAGS``;
    with ``follow_links=False`` a link as the last name fails with ``ELOOP``. Raises
    ``OSError`` (``ValueError`` for a name with a NUL in it)."""
    return os.open(path, READ_FLAGS if follow_links else READ_FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)


def read_at_most(fd: int, limit: int) -> bytes | None:
    """The rest of ``fd``, or None when it holds more than ``limit`` bytes: at once when its
    size says so, else as it is read, since ``st_size`` can lie (files in /proc say 0, a
    file can grow while read): the bytes are counted."""
    if os.fstat(fd).st_size > limit:
        return None
    chunks, total = [], 0
    while chunk := os.read(fd, min(_READ_CHUNK, limit + 1 - total)):
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            return None
    return b"".join(chunks)
