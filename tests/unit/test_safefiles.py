"""Opening a file someone else named without waiting, and reading it within a limit."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from hangdoc.safefiles import open_to_read, read_at_most


def _read(path: Path, limit: int) -> bytes | None:
    fd = open_to_read(path)
    try:
        return read_at_most(fd, limit)
    finally:
        os.close(fd)


def test_a_file_within_the_limit_is_read_whole(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 10)
    assert _read(tmp_path / "f", 10) == b"x" * 10
    assert _read(tmp_path / "f", 9) is None  # its size says so: nothing read


def test_the_bytes_are_counted_where_the_size_says_nothing() -> None:
    read_end, write_end = os.pipe()  # st_size 0, like a file in /proc
    try:
        os.write(write_end, b"y" * 11)
        os.close(write_end)
        assert read_at_most(read_end, 10) is None
    finally:
        os.close(read_end)
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"y" * 10)
        os.close(write_end)
        assert read_at_most(read_end, 10) == b"y" * 10
    finally:
        os.close(read_end)


def test_a_fifo_is_opened_at_once_and_not_inherited(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    fd = open_to_read(tmp_path / "fifo")  # no writer: a blocking open would wait for ever
    try:
        assert not os.get_inheritable(fd)
        assert read_at_most(fd, 10) == b""
    finally:
        os.close(fd)


def test_a_link_is_followed_only_when_asked(tmp_path: Path) -> None:
    (tmp_path / "target").write_bytes(b"data")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    assert _read(tmp_path / "link", 10) == b"data"
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError) as raised:
            open_to_read("link", dir_fd=dir_fd, follow_links=False)
        assert raised.value.errno == errno.ELOOP
        fd = open_to_read("target", dir_fd=dir_fd, follow_links=False)
        os.close(fd)
    finally:
        os.close(dir_fd)
