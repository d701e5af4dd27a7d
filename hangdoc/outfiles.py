"""Files and directories hangdoc writes for its user: ``--save``, ``--html``/``--dot``/``--svg``,
and ``watch``'s ``hang-<UTC>`` directories (and their fallback under ``$TMPDIR``).

They hold source lines, so they are private: files ``0600``, directories ``0700``, whatever
the umask. Nothing is ever written through a symbolic link, and nothing of another user is
ever replaced, even by root: in a world-writable directory such as ``/tmp`` a name can be
planted by anyone, pointing at a file that only root may write.

- ``write_file`` writes a temporary file, created exclusively without following links
  through a descriptor of the directory, and renames it into place. The target may be
  new, or a regular file of this user's own (it is replaced whole, never written into);
  a link, another user's file or anything that is not a regular file is ``Refused``.
  ``rename`` replaces a name, never what a link names, so a link planted between the
  check and the rename is replaced, not followed.
- ``write_new_dir`` makes a new directory (``mkdir`` fails on any name that exists, a link
  included) and writes every file inside it through its descriptor.

The directories on the way to the file are the user's to name and may be links (``/var/run``
is one); only the last name, the one a stranger can plant in a shared directory, may not.
"""

from __future__ import annotations

import os
import pwd
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from .filekinds import file_kind

FILE_MODE = 0o600
DIR_MODE = 0o700
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_PARENT = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC  # a directory one may not list
_ELSEWHERE = "Name a new file, or a regular file of your own, in a directory you can write."


class Refused(OSError):
    """A target hangdoc will not write: ``strerror`` says why in a few words, ``help`` what to do."""

    def __init__(self, why: str, help: str = _ELSEWHERE) -> None:
        super().__init__(why)
        self.strerror = self.why = why
        self.help = help

    def __str__(self) -> str:
        return self.why


def check_target(path: str | Path) -> None:
    """Refuse now, before any work, a ``path`` that ``write_file`` would refuse, or whose
    directory this user cannot write: raises ``Refused``, or ``OSError`` for a directory
    that cannot be opened."""
    path = Path(path)
    name = _name(path)
    dir_fd = _open_dir(path.parent)
    try:
        _check_name(dir_fd, name)
    finally:
        os.close(dir_fd)
    if not os.access(str(path.parent) or ".", os.W_OK | os.X_OK):
        raise Refused(f"directory {path.parent} is not writable", _ELSEWHERE)


def write_file(path: str | Path, data: bytes) -> Path:
    """``data`` as the whole of ``path``, mode 0600: a new file, or one that replaces this
    user's own regular file. Raises ``Refused`` (a link, another user's file, not a regular
    file) or ``OSError``; nothing is left behind either way."""
    path = Path(path)
    name = _name(path)
    dir_fd = _open_dir(path.parent)
    tmp = f".{name[:200]}.{secrets.token_hex(4)}.tmp"
    created = False
    try:
        _check_name(dir_fd, name)
        fd = os.open(tmp, _NEW, FILE_MODE, dir_fd=dir_fd)
        created = True
        _write_all(fd, data)
        _check_name(dir_fd, name)  # again: the time it took to write is the time to plant one
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        created = False
        return path
    finally:
        if created:
            _unlink_quietly(tmp, dir_fd)
        os.close(dir_fd)


def write_new_dir(base: Path, stamp: str, files: Mapping[str, bytes], tries: int = 999) -> Path:
    """A new directory ``base/stamp`` (``stamp-2``, ``stamp-3``... when taken), mode 0700,
    with ``files`` in it in their order, each 0600 and appearing whole (written under a
    temporary name, then renamed). ``base`` must exist. Raises ``OSError``."""
    base_fd = os.open(base, _PARENT)
    try:
        for n in range(1, tries + 1):
            name = stamp if n == 1 else f"{stamp}-{n}"
            try:
                os.mkdir(name, DIR_MODE, dir_fd=base_fd)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"too many directories named {stamp} in {base}")
        dir_fd = os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=base_fd)
    finally:
        os.close(base_fd)
    try:
        if os.fstat(dir_fd).st_uid != os.geteuid():  # swapped for another's between mkdir and open
            raise Refused(f"{name} was replaced by another user's directory")
        os.fchmod(dir_fd, DIR_MODE)  # whatever the umask
        for file, data in files.items():
            tmp = f".{file}.tmp"
            fd = os.open(tmp, _NEW, FILE_MODE, dir_fd=dir_fd)
            _write_all(fd, data)
            os.rename(tmp, file, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    return base / name


def _name(path: Path) -> str:
    if path.name in ("", ".", ".."):
        raise Refused("is a directory")
    return path.name


def _open_dir(directory: Path) -> int:
    """A descriptor of ``directory`` (``.`` when empty), links on its way followed."""
    try:
        return os.open(str(directory) or ".", _PARENT)
    except FileNotFoundError:
        raise Refused(
            f"directory {directory} does not exist", "Create the directory first, or name a file in one that exists."
        ) from None
    except NotADirectoryError:
        raise Refused(f"{directory} is not a directory", _ELSEWHERE) from None


def _check_name(dir_fd: int, name: str) -> None:
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise Refused(
            "is a symbolic link; hangdoc never writes through one",
            "Name the file itself (see `readlink -f`), or a new file.",
        )
    if not stat.S_ISREG(info.st_mode):
        raise Refused(f"is {file_kind(info.st_mode)}; hangdoc writes only regular files")
    if info.st_uid != os.geteuid():
        raise Refused(
            f"belongs to {_owner(info.st_uid)}, not to this user; hangdoc replaces only its own files",
            "Remove the file first if it should go, or name a new file.",
        )


def _owner(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _write_all(fd: int, data: bytes) -> None:
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _unlink_quietly(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
