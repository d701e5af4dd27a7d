"""Read a rank's files as the rank itself could: how hangdoc reads source and heartbeats.

A frame's file name is the traced process's word, not a fact: any process can run code
under the name ``/etc/shadow`` (``exec(compile(src, "/etc/shadow", "exec"))``), and
hangdoc usually runs as root. So every source line hangdoc shows or saves (``Frame.code``,
``SourceFile``) is read here, and only

- through the process's own view of the filesystem (``/proc/PID/root``), so a rank in a
  container gets its own file and not the host's file at the same path;
- along a path of real directories: no symbolic link is followed, in any component, and
  no ``..``; the final component must be a regular file (a FIFO, device or socket is
  never opened, not even to look);
- when the process's own credentials allow it: search permission on every directory and
  read permission on the file, for its filesystem uid, gid and supplementary groups, as
  the kernel would decide (mode bits; ``CAP_DAC_OVERRIDE``/``CAP_DAC_READ_SEARCH`` in its
  effective set count only when the process is in hangdoc's own user namespace: in a
  namespace of its own, which any user can make with ``unshare -Ur``, every process has
  every capability, valid only for files owned by ids mapped into that namespace, so
  hangdoc counts none there);
- up to ``MAX_SOURCE_BYTES``.

The step-heartbeat records that a rank names through its environment
(``HANGDOC_HEARTBEAT_DIR``) are opened the same way (``read_as``). A file that fails any
test is simply not read: the frame keeps its name and line, without code. POSIX ACLs are
not consulted, so a file readable only through an ACL entry shows no source (the safe side).
"""

from __future__ import annotations

import functools
import io
import os
import stat
import tokenize
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

# The largest .py file in torch 2.13's wheel is 1.38 MB (common_methods_invocations.py);
# three times that leaves room for generated code without reading arbitrary blobs.
MAX_SOURCE_BYTES = 4 * 1024 * 1024
# Decoded files kept across dumps (keyed by inode and mtime, never by name, so the cache
# cannot serve a file that the permission walk did not just reach).
_CACHE_BYTES = 64 * 1024 * 1024

_CAP_DAC_OVERRIDE = 1 << 1
_CAP_DAC_READ_SEARCH = 1 << 2
_R, _X = 4, 1


def user_namespace(pid: int | str) -> tuple[int, int] | None:
    """The identity (device, inode) of ``pid``'s user namespace; ``"self"`` for ours."""
    try:
        st = os.stat(f"/proc/{pid}/ns/user")
    except OSError:
        return None
    return st.st_dev, st.st_ino


@functools.lru_cache(maxsize=1)
def _own_user_namespace() -> tuple[int, int] | None:
    return user_namespace("self")  # a process that does not unshare itself keeps its own


def in_our_user_namespace(pid: int) -> bool:
    """Whether ``pid``'s capabilities mean what they say here: it shares our user namespace.

    Any user can make a user namespace (``unshare -Ur``) in which it holds every capability;
    those are valid only inside it, so a process elsewhere counts as having none."""
    theirs = user_namespace(pid)
    return theirs is not None and theirs == _own_user_namespace()


def read_status(pid: int) -> dict[str, str] | None:
    """The fields of /proc/PID/status (``{"Uid": "0 0 0 0", ...}``), or None."""
    fields: dict[str, str] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
    except OSError:
        return None
    return fields


@dataclass(frozen=True)
class Credentials:
    """What the kernel checks when a process opens a file: fsuid, fsgid, groups, DAC caps."""

    fsuid: int
    fsgid: int
    groups: frozenset[int]
    dac_override: bool = False
    dac_read_search: bool = False

    @classmethod
    def of(cls, pid: int) -> Credentials | None:
        """The credentials of ``pid`` from /proc/PID/status; None when it cannot be read."""
        fields = read_status(pid)
        if fields is None:
            return None
        try:
            uids = fields["Uid"].split()
            gids = fields["Gid"].split()
            caps = int(fields.get("CapEff", "0"), 16) if in_our_user_namespace(pid) else 0
            return cls(
                fsuid=int(uids[3]),
                fsgid=int(gids[3]),
                groups=frozenset(int(g) for g in fields.get("Groups", "").split()),
                dac_override=bool(caps & _CAP_DAC_OVERRIDE),
                dac_read_search=bool(caps & _CAP_DAC_READ_SEARCH),
            )
        except (KeyError, IndexError, ValueError):
            return None

    def may(self, st: os.stat_result, want: int) -> bool:
        """Whether these credentials get ``want`` (read 4 / search 1) on a file like ``st``."""
        is_dir = stat.S_ISDIR(st.st_mode)
        if self.dac_override and (is_dir or want == _R):
            return True
        if self.dac_read_search and (want == _R or (is_dir and want == _X)):
            return True
        if st.st_uid == self.fsuid:
            bits = st.st_mode >> 6
        elif st.st_gid == self.fsgid or st.st_gid in self.groups:
            bits = st.st_mode >> 3
        else:
            bits = st.st_mode
        return bits & want == want


def _components(filename: str) -> list[str] | None:
    """The path's names below the root; None for anything but a plain absolute path."""
    if not filename.startswith("/") or "\0" in filename:
        return None
    parts = [p for p in filename.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return parts


def open_as(pid: int, creds: Credentials, filename: str, limit: int | None = None) -> int | None:
    """A read-only fd for ``filename`` as process ``pid`` sees it and may read it, or None
    (also when the file is larger than ``limit``, by default ``MAX_SOURCE_BYTES``)."""
    parts = _components(filename)
    if parts is None:
        return None
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    fds: list[int] = []
    try:
        fds.append(os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        for name in parts[:-1]:
            if not creds.may(os.fstat(fds[-1]), _X):
                return None
            fds.append(os.open(name, flags | os.O_DIRECTORY, dir_fd=fds[-1]))
        if not creds.may(os.fstat(fds[-1]), _X):
            return None
        fds.append(os.open(parts[-1], flags, dir_fd=fds[-1]))
        st = os.fstat(fds[-1])
        too_big = st.st_size > (MAX_SOURCE_BYTES if limit is None else limit)
        if not stat.S_ISREG(st.st_mode) or not creds.may(st, _R) or too_big:
            return None
        # reopen the very inode that was checked (an O_PATH fd cannot be read)
        return os.open(f"/proc/self/fd/{fds[-1]}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    finally:
        for fd in fds:
            os.close(fd)


def read_as(pid: int, filename: str, limit: int) -> bytes | None:
    """Up to ``limit`` bytes of ``filename`` as process ``pid`` may read it, or None."""
    creds = Credentials.of(pid)
    fd = None if creds is None else open_as(pid, creds, filename, limit)
    if fd is None:
        return None
    try:
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


class _Cache:
    """Decoded source files by (device, inode, mtime, size), least recently used out."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self.files: OrderedDict[tuple[int, int, int, int], tuple[str, ...]] = OrderedDict()

    def get(self, key: tuple[int, int, int, int]) -> tuple[str, ...] | None:
        lines = self.files.get(key)
        if lines is not None:
            self.files.move_to_end(key)
        return lines

    def put(self, key: tuple[int, int, int, int], lines: tuple[str, ...]) -> None:
        self.files[key] = lines
        self.used += key[3]
        while self.used > self.budget and self.files:
            old, _ = self.files.popitem(last=False)
            self.used -= old[3]


_cache = _Cache(_CACHE_BYTES)


def _decode(raw: bytes) -> tuple[str, ...]:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError:
        encoding = "utf-8"
    try:
        text = raw.decode(encoding, errors="replace")
    except LookupError:
        text = raw.decode("utf-8", errors="replace")
    return tuple(text.splitlines())


def read_lines(pid: int, creds: Credentials, filename: str) -> tuple[str, ...] | None:
    """Every line of ``filename`` as ``pid`` may read it (see the module doc), or None."""
    fd = open_as(pid, creds, filename)
    if fd is None:
        return None
    try:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        lines = _cache.get(key)
        if lines is None:
            with os.fdopen(fd, "rb", closefd=False) as f:
                lines = _decode(f.read(MAX_SOURCE_BYTES + 1)[:MAX_SOURCE_BYTES])
            _cache.put(key, lines)
        return lines
    except OSError:
        return None
    finally:
        os.close(fd)


class SourceReader:
    """The source files of one process, read as that process could (one per dump or query)."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        self._creds: Credentials | None = None
        self._files: dict[str, tuple[str, ...] | None] = {}

    def lines(self, filename: str) -> Sequence[str] | None:
        """All lines of ``filename`` (index 0 is line 1), or None when it may not be read."""
        if filename not in self._files:
            if self._creds is None:
                self._creds = Credentials.of(self.pid)
            creds = self._creds
            self._files[filename] = None if creds is None else read_lines(self.pid, creds, filename)
        return self._files[filename]

    def line(self, filename: str, lineno: int | None) -> str | None:
        """Line ``lineno`` (1-based) of ``filename``, without its newline; None when unreadable."""
        if not lineno or lineno < 1:
            return None
        lines = self.lines(filename)
        if lines is None or lineno > len(lines):
            return None
        return lines[lineno - 1]
