"""Root writes its outputs into a world-writable sticky directory where nobody planted names.

The attacker is uid 65534 (nobody), run through `setpriv`: it plants a symbolic link to a
root-only file, or a file of its own, at the path root is about to write with `--save`,
`--html`, `--dot` or `--svg`. Root must refuse both in one line and leave every file as it
was; what root does write is private (files 0600, `watch`'s hang directories 0700).
"""

from __future__ import annotations

import datetime
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.paths import REPO

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot, save_snapshot
from hangdoc.errors import BundleError
from hangdoc.watch.incident import write_incident
from hangdoc.watch.stall import Signal, Trigger

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to act as another user"
    ),
]

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
BUNDLE = REPO / "tests" / "data" / "demo_mismatch.json.gz"
SECRET = b"ROOT-ONLY\n"
REPORTS = ("--html", "--dot", "--svg")


class Area:
    """``shared``: a /tmp-like directory (1777); ``secret``: a root-only file elsewhere."""

    def __init__(self, root: Path) -> None:
        self.shared = root / "shared"
        self.shared.mkdir()
        self.shared.chmod(0o1777)
        private = root / "private"
        private.mkdir(mode=0o700)
        self.secret = private / "secret"
        self.secret.write_bytes(SECRET)
        self.secret.chmod(0o600)

    def plant_link(self, name: str) -> Path:
        path = self.shared / name
        subprocess.run([*AS_NOBODY, "ln", "-s", str(self.secret), str(path)], check=True, timeout=10)
        assert path.is_symlink() and path.lstat().st_uid == NOBODY
        return path

    def plant_file(self, name: str) -> Path:
        path = self.shared / name
        subprocess.run([*AS_NOBODY, "sh", "-c", 'printf theirs > "$1"', "sh", str(path)], check=True, timeout=10)
        assert path.stat().st_uid == NOBODY
        return path

    def untouched(self) -> None:
        assert self.secret.read_bytes() == SECRET and stat.S_IMODE(self.secret.stat().st_mode) == 0o600


@pytest.fixture
def area() -> Iterator[Area]:
    root = Path(tempfile.mkdtemp(prefix="hdfiles-"))
    root.chmod(0o755)
    try:
        yield Area(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _hangdoc(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hangdoc", *argv],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
        env={**os.environ, "HANGDOC_NO_HELP": "1"},
    )


def _one_line(done: subprocess.CompletedProcess[str], code: int, ending: str) -> None:
    assert done.returncode == code, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("hangdoc: error: "), done.stderr
    assert done.stderr.rstrip().endswith(ending), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


# -------------------------------------------------- a link planted at the path: refused


def test_report_files_never_follow_a_planted_link(area: Area) -> None:
    links = [area.plant_link(f"report{option[1:]}") for option in REPORTS]
    for option, link in zip(REPORTS, links, strict=True):
        _one_line(
            _hangdoc("analyze", str(BUNDLE), option, str(link)),
            2,
            "is a symbolic link; hangdoc never writes through one",
        )
        assert link.is_symlink()
    area.untouched()


def test_diagnose_save_never_follows_a_planted_link(area: Area) -> None:
    link = area.plant_link("snap.json")
    # refused before the job is even looked for
    _one_line(
        _hangdoc("diagnose", "127.0.0.1:1", "--save", str(link)),
        6,
        f"cannot write snapshot to {link}: is a symbolic link; hangdoc never writes through one",
    )
    with pytest.raises(BundleError, match="is a symbolic link"):  # and by the writer itself
        save_snapshot(load_snapshot(BUNDLE), link)
    assert link.is_symlink()
    area.untouched()


# ---------------------------------------------- a file of nobody's at the path: refused


def test_another_users_file_is_never_replaced(area: Area) -> None:
    theirs = {option: area.plant_file(f"theirs{option[1:]}") for option in (*REPORTS, "--save")}
    for option in REPORTS:
        _one_line(
            _hangdoc("analyze", str(BUNDLE), option, str(theirs[option])),
            2,
            f"belongs to user nobody (uid {NOBODY}), not to this user; hangdoc replaces only its own files",
        )
    _one_line(
        _hangdoc("diagnose", "127.0.0.1:1", "--save", str(theirs["--save"])),
        6,
        "not to this user; hangdoc replaces only its own files",
    )
    with pytest.raises(BundleError, match="not to this user"):
        save_snapshot(load_snapshot(BUNDLE), theirs["--save"])
    for path in theirs.values():
        assert path.read_bytes() == b"theirs" and path.stat().st_uid == NOBODY


# ------------------------------------------------------ what root writes is private


def test_root_writes_new_private_files(area: Area) -> None:
    outs = {option: area.shared / f"new{option[1:]}" for option in REPORTS}
    done = _hangdoc("analyze", str(BUNDLE), "--json", *[a for o, p in outs.items() for a in (o, str(p))])
    assert done.returncode == 0, done.stderr
    saved = area.shared / "snap.json.gz"
    save_snapshot(load_snapshot(BUNDLE), saved)
    for path in (*outs.values(), saved):
        info = path.lstat()
        assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == 0, path
    assert sorted(p.name for p in area.shared.iterdir()) == sorted(["snap.json.gz", *(p.name for p in outs.values())])


def test_watch_hang_directory_is_private_and_never_a_planted_link(area: Area) -> None:
    out = area.shared / "hangs"
    out.mkdir()
    out.chmod(0o1777)  # a shared --out: nobody may plant the next names in it
    now = datetime.datetime.now(datetime.UTC)
    victim = area.shared / "nobodys"
    subprocess.run([*AS_NOBODY, "mkdir", str(victim)], check=True, timeout=10)
    stamps = [f"hang-{now + datetime.timedelta(seconds=s):%Y%m%dT%H%M%SZ}" for s in range(-1, 30)]
    subprocess.run(
        [*AS_NOBODY, "sh", "-c", 'cd "$1"; shift; for s; do ln -s "$0" "$s"; done', str(victim), str(out), *stamps],
        check=True,
        timeout=10,
    )
    snap = load_snapshot(BUNDLE)
    trigger = Trigger(Signal.OUTPUT, 2.0, 1.0, "--stall-after", 1.0, 3, None, now.isoformat())
    old = os.umask(0o022)
    try:
        where = write_incident(
            out, snap, analyse(snap), trigger, "confirmed by diagnosis", warn=lambda _level, text: pytest.fail(text)
        )
    finally:
        os.umask(old)
    assert where is not None and where.parent == out and where.name.endswith("-2")
    info = where.lstat()
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == 0
    assert sorted(p.name for p in where.iterdir()) == ["report.html", "report.json", "report.txt", "snapshot.json.gz"]
    assert all(stat.S_IMODE(p.lstat().st_mode) == 0o600 for p in where.iterdir())
    assert list(victim.iterdir()) == []
