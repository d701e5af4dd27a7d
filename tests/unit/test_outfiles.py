"""``hangdoc.outfiles``: the files hangdoc writes are private, never written through a link,
and never another user's replaced; the CLI refuses such a path in one line, before the work."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from support.paths import REPO

from hangdoc.bundle import load_snapshot
from hangdoc.cli import main
from hangdoc.outfiles import Refused, check_target, write_file, write_new_dir

BUNDLE = REPO / "tests" / "data" / "demo_mismatch.json.gz"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def umask_open():
    old = os.umask(0)  # the files are private whatever the umask
    yield
    os.umask(old)


def test_a_new_file_is_private_and_whole(tmp_path: Path, umask_open: None) -> None:
    path = tmp_path / "out.json"
    assert write_file(path, b"data") == path
    assert path.read_bytes() == b"data" and _mode(path) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary file left


def test_ones_own_regular_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    path.write_bytes(b"old and longer")
    path.chmod(0o644)
    before = path.stat().st_ino
    write_file(path, b"new")
    assert path.read_bytes() == b"new" and _mode(path) == 0o600
    assert path.stat().st_ino != before  # replaced whole, never written into


def test_a_relative_name_writes_in_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_file("here.html", b"x")
    assert (tmp_path / "here.html").read_bytes() == b"x"


@pytest.mark.parametrize("dangling", [False, True])
def test_a_link_is_refused_and_its_target_untouched(tmp_path: Path, dangling: bool) -> None:
    victim = tmp_path / "victim"
    if not dangling:
        victim.write_bytes(b"precious")
    link = tmp_path / "out.json"
    link.symlink_to(victim)
    for call in (lambda: check_target(link), lambda: write_file(link, b"evil")):
        with pytest.raises(Refused, match="is a symbolic link; hangdoc never writes through one") as err:
            call()
        assert "readlink" in err.value.help
    assert link.is_symlink()
    assert victim.read_bytes() == b"precious" if not dangling else not victim.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out.json"] + ([] if dangling else ["victim"]))


def test_a_link_planted_while_writing_is_replaced_not_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    path = tmp_path / "out.json"
    real = os.fdopen

    def plant(fd: int, *args, **kwargs):  # the attacker wins the race after the first check
        path.symlink_to(victim)
        return real(fd, *args, **kwargs)

    monkeypatch.setattr("hangdoc.outfiles.os.fdopen", plant)
    with pytest.raises(Refused, match="symbolic link"):  # the second check sees it
        write_file(path, b"evil")
    assert victim.read_bytes() == b"precious" and path.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "victim"]


@pytest.mark.parametrize("kind", ["directory", "fifo", "dot"])
def test_what_is_not_a_regular_file_is_refused(tmp_path: Path, kind: str) -> None:
    path = {"directory": tmp_path, "fifo": tmp_path / "p", "dot": tmp_path / "."}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    with pytest.raises(Refused, match=r"is a (directory|FIFO \(named pipe\))"):
        write_file(path, b"x")


def test_a_device_is_refused_not_replaced() -> None:
    with pytest.raises(Refused, match="is a character device; hangdoc writes only regular files"):
        write_file("/dev/null", b"x")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_another_users_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "theirs.json"
    path.write_bytes(b"theirs")
    monkeypatch.setattr("hangdoc.outfiles.os.geteuid", lambda: os.getuid() + 4242)  # as if it were not ours
    with pytest.raises(Refused, match="not to this user; hangdoc replaces only its own files") as err:
        write_file(path, b"mine")
    assert "Remove the file first" in err.value.help
    assert path.read_bytes() == b"theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["theirs.json"]


def test_a_missing_directory_says_so(tmp_path: Path) -> None:
    with pytest.raises(Refused, match="directory .*/missing does not exist"):
        check_target(tmp_path / "missing" / "x.html")
    (tmp_path / "afile").write_text("")
    with pytest.raises(Refused, match="afile is not a directory"):
        write_file(tmp_path / "afile" / "x.html", b"x")


def test_links_on_the_way_are_followed(tmp_path: Path) -> None:
    """The directories are the user's to name (``/var/run`` is a link); only the last name is not."""
    (tmp_path / "real").mkdir()
    (tmp_path / "via").symlink_to(tmp_path / "real")
    write_file(tmp_path / "via" / "x.json", b"x")
    assert (tmp_path / "real" / "x.json").read_bytes() == b"x"


def test_a_new_directory_is_private_and_never_a_link(tmp_path: Path, umask_open: None) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "hang-1").symlink_to(victim)
    path = write_new_dir(tmp_path, "hang-1", {"a.txt": b"a", "report.json": b"{}"})
    assert path == tmp_path / "hang-1-2" and not path.is_symlink()
    assert _mode(path) == 0o700 and list(victim.iterdir()) == []
    assert [p.name for p in sorted(path.iterdir(), key=lambda p: p.stat().st_mtime_ns)] == ["a.txt", "report.json"]
    assert all(_mode(p) == 0o600 for p in path.iterdir())


# ------------------------------------------------------------------- through the CLI


@pytest.mark.parametrize("option", ["--html", "--dot", "--svg"])
def test_the_cli_refuses_a_link_in_one_line_before_the_work(
    tmp_path: Path, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "out").symlink_to(victim)
    assert main(["analyze", str(BUNDLE), option, str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and victim.read_text() == "precious"
    first, help_line = captured.err.splitlines()
    assert first.startswith(f"hangdoc: error: {option} ") and first.endswith(
        "out': is a symbolic link; hangdoc never writes through one"
    )
    assert help_line.startswith("  help: Name the file itself")


def test_the_cli_writes_private_report_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outs = {kind: tmp_path / f"r.{kind}" for kind in ("html", "dot", "svg")}
    outs["html"].write_text("an old report of mine")
    argv = ["analyze", str(BUNDLE), "--json"] + [a for k, p in outs.items() for a in (f"--{k}", str(p))]
    assert main(argv) == 0
    assert all(_mode(p) == 0o600 and p.stat().st_size > 0 for p in outs.values())
    assert "an old report" not in outs["html"].read_text()


def test_diagnose_save_refuses_a_link_before_the_capture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_capture(*args, **kwargs):
        raise AssertionError("captured although --save was refused")

    monkeypatch.setattr("hangdoc.pipeline.diagnose", no_capture)
    (tmp_path / "snap.json").symlink_to(tmp_path / "victim")
    assert main(["diagnose", "pid:1", "--save", str(tmp_path / "snap.json")]) == 6
    first = capsys.readouterr().err.splitlines()[0]
    assert (
        first == f"hangdoc: error: cannot write snapshot to {tmp_path}/snap.json: is a symbolic link; "
        "hangdoc never writes through one"
    )
    assert not (tmp_path / "victim").exists()


def test_diagnose_save_writes_a_private_bundle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hangdoc.analysis.analyse import analyse

    snap = load_snapshot(BUNDLE)
    monkeypatch.setattr("hangdoc.pipeline.diagnose", lambda *args, **kwargs: (snap, analyse(snap)))
    saved = tmp_path / "snap.json.gz"
    assert main(["diagnose", "pid:1", "--save", str(saved), "--json", "-q"]) == 0
    assert _mode(saved) == 0o600 and load_snapshot(saved) == snap
