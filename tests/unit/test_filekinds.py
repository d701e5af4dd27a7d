"""The words for a file that is not a regular file, from a real one of each kind."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

from hangdoc.filekinds import file_kind


def test_each_kind_of_file_has_its_words(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "sock"))
        modes = {name: os.stat(tmp_path / name).st_mode for name in ("fifo", "sock")}
    assert file_kind(modes["fifo"]) == "a FIFO (named pipe)"
    assert file_kind(modes["sock"]) == "a socket"
    assert file_kind(os.stat(tmp_path).st_mode) == "a directory"
    assert file_kind(os.stat("/dev/null").st_mode) == "a character device"
    assert file_kind(stat.S_IFBLK) == "a block device"


def test_any_other_kind_has_the_caller_s_words(tmp_path: Path) -> None:
    (tmp_path / "f").touch()
    assert file_kind(os.stat(tmp_path / "f").st_mode) == "not a regular file"
    assert file_kind(os.lstat(tmp_path / "f").st_mode | stat.S_IFLNK, "a special file") == "a special file"
