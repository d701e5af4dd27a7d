"""Source files read as the traced process could: permissions, links, odd files, sizes."""

from __future__ import annotations

import os
import socket
import stat
import tempfile
import threading
from pathlib import Path

import pytest

from hangdoc.capture.read import sourcefs
from hangdoc.capture.read.sourcefs import Credentials, SourceReader, open_as, read_lines
from hangdoc.fleet.callers import (
    Caller,
    ProcCreds,
    identify,
    parse_peer,
    socket_holder,
    socket_owner,
)

ME = os.getpid()
USER = Credentials(fsuid=1000, fsgid=1000, groups=frozenset({1000, 27}))


def _st(mode: int, uid: int = 0, gid: int = 0) -> os.stat_result:
    return os.stat_result((mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))


@pytest.mark.parametrize(
    ("mode", "uid", "gid", "want", "allowed"),
    [
        (stat.S_IFREG | 0o600, 0, 0, 4, False),  # root's private file
        (stat.S_IFREG | 0o640, 0, 42, 4, False),  # group the user is not in (like /etc/shadow)
        (stat.S_IFREG | 0o640, 0, 27, 4, True),  # a supplementary group
        (stat.S_IFREG | 0o644, 0, 0, 4, True),
        (stat.S_IFREG | 0o066, 1000, 0, 4, False),  # owner bits rule for the owner, as in the kernel
        (stat.S_IFDIR | 0o700, 0, 0, 1, False),  # /root: no search for others
        (stat.S_IFDIR | 0o711, 0, 0, 1, True),
        (stat.S_IFDIR | 0o750, 0, 1000, 1, True),
    ],
)
def test_permission_bits_decide_as_the_kernel_does(mode, uid, gid, want, allowed) -> None:
    assert USER.may(_st(mode, uid, gid), want) is allowed


def test_dac_capabilities_read_everything_like_root() -> None:
    root = Credentials(0, 0, frozenset(), dac_override=True)
    assert root.may(_st(stat.S_IFREG | 0o000, 5, 5), 4)
    reader = Credentials(1000, 1000, frozenset(), dac_read_search=True)
    assert reader.may(_st(stat.S_IFDIR | 0o700, 5, 5), 1)
    assert not reader.may(_st(stat.S_IFREG | 0o000, 5, 5), 1)  # read-search does not execute


def test_credentials_of_this_process_match_the_kernel() -> None:
    creds = Credentials.of(ME)
    assert creds is not None and creds.fsuid == os.geteuid() and creds.fsgid == os.getegid()
    assert Credentials.of(2**22 + 1) is None


@pytest.fixture
def me() -> Credentials:
    creds = Credentials.of(ME)
    assert creds is not None
    return creds


def test_reads_a_plain_file_through_proc_root(tmp_path: Path, me) -> None:
    src = tmp_path / "train.py"
    src.write_text("a = 1\nb = 2\n")
    assert read_lines(ME, me, str(src)) == ("a = 1", "b = 2")
    assert SourceReader().line(str(src), 2) == "b = 2"
    assert SourceReader().line(str(src), 3) is None and SourceReader().line(str(src), 0) is None


@pytest.mark.parametrize("name", ["relative.py", "/a/../etc/passwd", "/x\0y", "/", "<string>"])
def test_only_plain_absolute_paths_are_tried(name: str, me) -> None:
    assert open_as(ME, me, name) is None


def test_no_link_is_followed_in_any_component(tmp_path: Path, me) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "t.py").write_text("x = 1\n")
    (tmp_path / "linkdir").symlink_to(real)
    (tmp_path / "link.py").symlink_to(real / "t.py")
    assert read_lines(ME, me, str(real / "t.py")) == ("x = 1",)
    assert read_lines(ME, me, str(tmp_path / "linkdir" / "t.py")) is None
    assert read_lines(ME, me, str(tmp_path / "link.py")) is None


def test_fifos_devices_and_directories_are_never_opened(tmp_path: Path, me) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = threading.Event()

    def read() -> None:
        assert read_lines(ME, me, str(fifo)) is None
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(5), "reading a FIFO blocked"
    assert read_lines(ME, me, "/dev/zero") is None
    assert read_lines(ME, me, str(tmp_path)) is None


def test_files_over_the_cap_are_not_read(tmp_path: Path, me, monkeypatch) -> None:
    big = tmp_path / "big.py"
    big.write_text("x = 1\n" * 100)
    monkeypatch.setattr(sourcefs, "MAX_SOURCE_BYTES", 599)
    assert read_lines(ME, me, str(big)) is None
    monkeypatch.setattr(sourcefs, "MAX_SOURCE_BYTES", 600)
    assert read_lines(ME, me, str(big)) is not None


def test_unreadable_for_the_target_means_unread_even_for_root(tmp_path: Path) -> None:
    nobody = Credentials(65534, 65534, frozenset())
    hidden = tmp_path / "hidden.py"  # pytest's base directory is 0700: no search for others
    hidden.write_text("x = 1\n")
    assert read_lines(ME, nobody, str(hidden)) is None
    with tempfile.TemporaryDirectory() as open_dir:
        os.chmod(open_dir, 0o755)
        private = Path(open_dir) / "private.py"
        private.write_text("secret = 1\n")
        private.chmod(0o600)
        assert read_lines(ME, nobody, str(private)) is None
        private.chmod(0o644)
        assert read_lines(ME, nobody, str(private)) == ("secret = 1",)


def test_cache_is_keyed_by_inode_so_a_new_file_is_read_anew(tmp_path: Path, me) -> None:
    src = tmp_path / "t.py"
    src.write_text("old\n")
    assert read_lines(ME, me, str(src)) == ("old",)
    src.unlink()
    src.write_text("new!\n")
    assert read_lines(ME, me, str(src)) == ("new!",)


def test_a_coding_cookie_is_honoured(tmp_path: Path, me) -> None:
    src = tmp_path / "latin.py"
    src.write_bytes(b"# -*- coding: latin-1 -*-\nname = '\xe9'\n")
    assert read_lines(ME, me, str(src))[1] == "name = 'é'"


# ------------------------------------------------------------------ callers


@pytest.mark.parametrize(
    ("peer", "expected"),
    [
        ("ipv4:127.0.0.1:5000", ("127.0.0.1", 5000)),
        ("ipv6:[::1]:7", ("::1", 7)),
        ("ipv6:[::ffff:127.0.0.1]:9", ("127.0.0.1", 9)),
        ("unix:/run/x.sock", None),
        ("ipv4:127.0.0.1:99999999", None),
        ("", None),
    ],
)
def test_parse_peer(peer: str, expected) -> None:
    parsed = parse_peer(peer)
    assert (None if parsed is None else (str(parsed[0]), parsed[1])) == expected


def test_the_kernel_socket_table_names_a_loopback_caller() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        host, port = client.getsockname()
        owner = socket_owner(*parse_peer(f"ipv4:{host}:{port}"))  # type: ignore[misc]
        assert owner is not None and owner[0] == os.geteuid()
        assert owner[1] == os.fstat(client.fileno()).st_ino
        assert socket_holder(owner[0], owner[1]) == ME
        caller = identify(f"ipv4:{host}:{port}", trust_remote=False)
        assert caller.uid == os.getuid() and not caller.operator
        assert caller.pid == ME
        assert caller.may_read(ME)
    finally:
        for s in (client, accepted, server):
            s.close()


def test_unidentifiable_and_remote_callers() -> None:
    assert identify("unix:/x", trust_remote=True).uid is None
    nothing = identify("ipv4:127.0.0.1:1", trust_remote=False)  # no such connection
    assert nothing.uid is None and not nothing.may_read(ME)
    assert not identify("ipv4:10.1.2.3:4000", trust_remote=False).may_read(ME)
    assert identify("ipv4:10.1.2.3:4000", trust_remote=True).operator  # what --insecure means


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act for another user")
def test_a_user_may_read_only_its_own_dumpable_processes() -> None:
    import subprocess
    import sys

    as_nobody = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        sys.executable,
        "-c",
        "import time; time.sleep(60)",
    ]
    procs = [subprocess.Popen(as_nobody) for _ in range(2)]
    try:
        for _ in range(200):  # both switched user and exec'd python (dumpable again after exec)
            creds = [ProcCreds.of(p.pid) for p in procs]
            execd = all(os.readlink(f"/proc/{p.pid}/exe") == os.path.realpath(sys.executable) for p in procs)
            if execd and all(c and c.uids[0] == 65534 for c in creds):
                break
            threading.Event().wait(0.05)
        nobody = Caller(operator=False, uid=65534, pid=procs[0].pid, _creds=ProcCreds.of(procs[0].pid))
        assert nobody.may_read(procs[1].pid)
        assert not nobody.may_read(ME)  # a root process
        assert not nobody.may_read(1)
        assert Caller(operator=False, uid=0, pid=ME, _creds=ProcCreds.of(ME)).may_read(procs[1].pid)
        assert not Caller(operator=False, uid=0).may_read(procs[1].pid)  # no holder, no creds
    finally:
        for p in procs:
            p.kill()
            p.wait()
