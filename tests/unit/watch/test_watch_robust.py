"""``hangdoc watch`` never loses the job or the report: an ``--out`` that cannot be written
is refused before anything starts, a report that cannot be written at hang time goes to
stderr and a private fallback directory, and whatever stops the watch, the wrapped job's
processes are ended with it. The watches run as separate processes (a wrapping watchdog
makes itself a child subreaper, not for pytest)."""

from __future__ import annotations

import datetime
import json
import math
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from support.hostile import FUNCTION, NAMES, THREAD
from support.paths import TESTS
from support.said import Said

from hangdoc.cli import main
from hangdoc.errors import UsageError
from hangdoc.watch.activity import EventQueue, LogTail
from hangdoc.watch.config import Level
from hangdoc.watch.incident import write_failed_incident
from hangdoc.watch.stall import Signal, StallClock, StallPolicy, Trigger
from hangdoc.watch.watchdog import OnHang

WATCH = [sys.executable, "-m", "hangdoc", "watch"]


def _run(argv: list[str], tmp: Path, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TMPDIR=str(tmp / "tmp"), HANGDOC_NO_HELP="1")
    (tmp / "tmp").mkdir(exist_ok=True)
    return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp)


def _in_tmpfs(tmp: Path, options: str, argv: list[str]) -> list[str]:
    """``argv`` run with a tmpfs mounted on ``tmp/fs`` in a mount namespace of its own (gone
    with it): a read-only or full file system without touching the machine's."""
    (tmp / "fs").mkdir(exist_ok=True)
    return ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o {options} none fs && exec {shlex.join(argv)}"]


def _can_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        argv = _in_tmpfs(Path(tmp), "size=64k", ["true"])
        return subprocess.run(argv, check=False, cwd=tmp, capture_output=True).returncode == 0


CAN_MOUNT = _can_mount()
needs_mount = pytest.mark.skipif(not CAN_MOUNT, reason="needs root and mount namespaces (unshare -m)")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------- --out at the start


@pytest.mark.parametrize("kind", ["file", "under_a_file", "proc", "read_only"])
def test_an_out_that_cannot_be_written_is_refused_before_the_command_starts(kind: str, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    out = {
        "file": str(tmp_path / "afile"),
        "under_a_file": str(tmp_path / "afile" / "hangs"),
        "proc": "/proc/hangdoc-no-such/hangs",
        "read_only": str(tmp_path / "ro" / "hangs"),
    }[kind]
    started = tmp_path / "started"
    argv = [*WATCH, "--out", out, "--", "touch", str(started)]
    if kind == "read_only" and os.geteuid() != 0:
        (tmp_path / "ro").mkdir(mode=0o500)
    elif kind == "read_only":  # root writes into any directory: a read-only file system then
        if not CAN_MOUNT:
            pytest.skip("root, and no mount namespace for a read-only file system")
        out = "fs/hangs"
        argv = _in_tmpfs(tmp_path, "ro", [*WATCH, "--out", out, "--", "touch", str(started)])
    done = _run(argv, tmp_path)
    assert done.returncode == 2, done.stderr
    assert not started.exists(), "the command ran although --out was refused"
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"hangdoc: error: --out {out}: cannot write"), (
        done.stderr
    )
    assert "Traceback" not in done.stderr


def test_a_good_out_is_created_and_the_trial_file_removed(tmp_path: Path) -> None:
    out = tmp_path / "new" / "hangs"
    done = _run([*WATCH, "--out", str(out), "--", "true"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert out.is_dir() and list(out.iterdir()) == []


# ------------------------------------------------------ the report at hang time

SABOTAGE = "echo start; rmdir hangs; echo > hangs; "  # the job replaces OUT by a file after the start


def _fallback(tmp: Path) -> Path:
    (found,) = list((tmp / "tmp").glob("hangdoc-hang-*"))
    return found


def _report_on_stderr(stderr: str) -> dict:
    head = "hangdoc watch: could not write report to "
    assert stderr.count(head) == 1, stderr
    line_end = stderr.index("\n", stderr.index(head))
    assert stderr[:line_end].endswith("not a directory; report follows on stderr"), stderr
    report, _ = json.JSONDecoder().raw_decode(stderr[line_end + 1 :])
    return report


def test_a_report_that_cannot_be_written_goes_to_stderr_and_a_private_directory(tmp_path: Path) -> None:
    done = _run([*WATCH, "--stall-after", "1", "--out", "hangs", "--", "sh", "-c", SABOTAGE + "sleep 4"], tmp_path)
    assert done.returncode == 0, done.stderr  # the command's own status: the watch went on
    assert "Traceback" not in done.stderr
    report = _report_on_stderr(done.stderr)
    assert report["verdict"] == "unknown" and report["watch"]["signal"] == "output"
    fallback = _fallback(tmp_path)
    assert stat.S_IMODE(fallback.stat().st_mode) == 0o700
    assert json.loads((fallback / "report.json").read_text()) == report
    assert (fallback / "report.txt").exists()
    assert f"report: {fallback}/report.txt" in done.stderr
    assert "command exited with status 0" in done.stderr


@needs_mount
@pytest.mark.parametrize(
    ("options", "sabotage", "reason"),
    [
        ("size=64k", "cat /dev/zero > fs/fill 2>/dev/null; ", "No space left on device"),
        ("size=1m", "mount -o remount,ro fs; ", "Read-only file system"),
    ],
)
def test_a_full_or_read_only_out_at_hang_time(options: str, sabotage: str, reason: str, tmp_path: Path) -> None:
    argv = [*WATCH, "--stall-after", "1", "--out", "fs/hangs", "--", "sh", "-c", f"echo start; {sabotage}sleep 3"]
    done = _run(_in_tmpfs(tmp_path, options, argv), tmp_path)
    assert done.returncode == 0, done.stderr
    assert f": {reason}; report follows on stderr\n" in done.stderr
    assert (_fallback(tmp_path) / "report.json").exists()
    assert "Traceback" not in done.stderr


def test_on_hang_kill_still_kills_when_the_report_cannot_be_written(tmp_path: Path) -> None:
    t0 = time.monotonic()
    done = _run(
        [
            *WATCH,
            "--stall-after",
            "1",
            "--kill-grace",
            "1",
            "--on-hang",
            "kill",
            "--out",
            "hangs",
            "--",
            "sh",
            "-c",
            SABOTAGE + "sleep 60",
        ],
        tmp_path,
    )
    assert done.returncode == 124, done.stderr
    assert time.monotonic() - t0 < 45
    _report_on_stderr(done.stderr)
    assert (_fallback(tmp_path) / "report.json").exists()


def test_on_hang_exec_gets_the_fallback_directory(tmp_path: Path) -> None:
    hook = 'exec sh -c \'cp "$HANGDOC_REPORT" copied.json; echo "$0" > hook-arg\''
    done = _run(
        [*WATCH, "--stall-after", "1", "--on-hang", hook, "--out", "hangs", "--", "sh", "-c", SABOTAGE + "sleep 4"],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    fallback = _fallback(tmp_path)
    assert (tmp_path / "hook-arg").read_text().strip() == str(fallback)
    assert json.loads((tmp_path / "copied.json").read_text()) == _report_on_stderr(done.stderr)


def test_the_fallback_never_follows_a_planted_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base, victim = tmp_path / "tmp", tmp_path / "victim"
    base.mkdir()
    victim.mkdir()
    monkeypatch.setenv("TMPDIR", str(base))
    now = datetime.datetime.now(datetime.UTC)
    for s in range(-1, 30):  # every name the next seconds could take, first choice and second
        stamp = f"hangdoc-hang-{now + datetime.timedelta(seconds=s):%Y%m%dT%H%M%SZ}-{os.getpid()}"
        (base / stamp).symlink_to(victim)
        (base / f"{stamp}-2").symlink_to(victim / "nowhere")
    (tmp_path / "afile").write_text("")
    trigger = Trigger(Signal.OUTPUT, 2.0, 1.0, "--stall-after", 1.0, 3, None, now.isoformat())
    path = write_failed_incident(
        tmp_path / "afile", "pid:1", trigger, "boom", "", lambda _level, text: print(text, file=sys.stderr)
    )
    assert path is not None and path.parent == base and path.name.endswith("-3")
    assert not path.is_symlink() and stat.S_IMODE(path.lstat().st_mode) == 0o700
    assert list(victim.iterdir()) == []
    assert sorted(p.name for p in path.iterdir()) == ["report.json", "report.txt"]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in path.iterdir())
    err = capsys.readouterr().err
    assert json.loads(err.split("report follows on stderr\n", 1)[1]) == json.loads((path / "report.json").read_text())


def test_a_report_nowhere_to_write_is_still_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "afile"))  # the fallback cannot be made either
    trigger = Trigger(Signal.OUTPUT, 2.0, 1.0, "--stall-after", 1.0, 3, None, "2026-11-22T00:00:00+00:00")
    said = Said()
    assert write_failed_incident(tmp_path / "afile", "pid:1", trigger, "boom", "", said) is None
    assert [level for level, _text in said] == [Level.ERROR, Level.ERROR]
    assert said.texts[0].startswith(f"could not write report to {tmp_path / 'afile'}: not a directory")
    assert said.texts[1].startswith("could not write the report to ")
    assert json.loads(capsys.readouterr().err)["verdict"] == "unknown"


# ------------------------------------------------------ the job is never orphaned

CHILD = """\
import os, signal, subprocess, sys, time
if sys.argv[2] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {grandchild.pid}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
print("started", flush=True)
time.sleep(300)
"""

BROKEN_WATCH = """\
import os, sys
import {module}
original = {module}.{method}
def broken(self, *args, **kwargs):
    if not os.path.exists(sys.argv[-2]):  # the job's pid file: fail once it is all started
        return original(self, *args, **kwargs)
    raise {exc}
{module}.{method} = broken
from hangdoc.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _start_job(tmp: Path, watch: list[str], term: str) -> tuple[subprocess.Popen[str], list[int]]:
    (tmp / "child.py").write_text(CHILD)
    (tmp / "tmp").mkdir(exist_ok=True)
    pidfile = tmp / "pids"
    proc = subprocess.Popen(
        [
            *watch,
            "--out",
            str(tmp / "hangs"),
            "--kill-grace",
            "1",
            "--",
            sys.executable,
            str(tmp / "child.py"),
            str(pidfile),
            term,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp,
        env=dict(os.environ, TMPDIR=str(tmp / "tmp"), HANGDOC_NO_HELP="1"),
    )
    deadline = time.monotonic() + 30
    while not pidfile.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert pidfile.exists(), proc.communicate(timeout=30)
    return proc, [int(p) for p in pidfile.read_text().split()]


def _end(proc: subprocess.Popen[str], pids: list[int]) -> None:
    """The watch and its job's processes killed, whatever is left of them; the watch's
    stdout closed (never read; its stderr is closed by whoever reads it to the end)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)
    _kill(pids)
    if proc.stdout is not None:
        proc.stdout.close()


ON_STALL = "hangdoc.watch.respond.Responder.on_stall"  # on a stall
PUBLISH = "hangdoc.watch.metrics.MetricsBoard.publish"  # at every check


@pytest.mark.parametrize(
    ("exc", "method"),
    [
        ("RuntimeError('a bug')", ON_STALL),
        ("RuntimeError('a bug')", PUBLISH),
        ("OSError(5, 'Input/output error')", ON_STALL),
    ],
)
def test_an_error_in_the_watch_loop_stops_the_watching_not_the_job(exc: str, method: str, tmp_path: Path) -> None:
    module, _, attribute = method.rpartition(".")
    module, _, cls = module.rpartition(".")
    script = BROKEN_WATCH.format(exc=exc, module=module, method=f"{cls}.{attribute}")
    proc, pids = _start_job(tmp_path, [sys.executable, "-c", script, "watch", "--stall-after", "1"], "ignore-term")
    err = _Stderr(proc)
    try:
        assert err.wait_for("no longer watching for hangs"), err.text()
        line = err.line_with("internal error: ")
        assert line.endswith(
            f"{exc.split('(')[0]}: {'a bug' if 'bug' in exc else '[Errno 5] Input/output error'} "
            "(<string>:7); no longer watching for hangs: the job is left running, its output and "
            "signals passed through until it exits"
        ), line
        time.sleep(1.5)  # a check or two later: the job is still there, nothing signalled it
        assert [pid for pid in pids if _alive(pid)] == pids
        _kill(pids)  # the command ends, and its grandchild that holds its output pipes
        assert proc.wait(timeout=30) == 128 + signal.SIGKILL, err.text()  # the command's own status
        assert "command exited with status 137" in err.text() and "Traceback" not in err.text()
    finally:
        _end(proc, pids)


def test_an_interrupt_that_reaches_the_watch_ends_the_wrapped_job(tmp_path: Path) -> None:
    script = BROKEN_WATCH.format(exc="KeyboardInterrupt()", module="hangdoc.watch.respond", method="Responder.on_stall")
    # the child ignores SIGTERM: ended by SIGKILL after --kill-grace
    proc, pids = _start_job(tmp_path, [sys.executable, "-c", script, "watch", "--stall-after", "1"], "ignore-term")
    try:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "Traceback" not in err
        assert "hangdoc: interrupted" in err
        assert "ending the wrapped command (pid" in err and "and all its processes" in err
        assert [pid for pid in pids if _alive(pid)] == []
    finally:
        _end(proc, pids)


# an internal error while the watch responds to a stall: contained there (issue 23, item 5)
PATCHED_WATCH = """\
import os, sys
sys.path.insert(0, {tests!r})
import hangdoc.watch.respond as respond
from support.hostile import hostile
{patch}
from hangdoc.cli import main
sys.exit(main(sys.argv[1:]))
"""
DIAGNOSIS_BUG = """\
def diagnose(*args, **kwargs):
    raise RuntimeError("a bug")
respond.diagnose = diagnose"""
MARKUP_NAMES = "respond.diagnose = lambda *args, **kwargs: hostile()[::-1]  # (snapshot, diagnosis)"
REPORT_BUG = (
    MARKUP_NAMES
    + """
def write_incident(*args, **kwargs):
    raise RuntimeError("a bug in the report")
respond.write_incident = write_incident"""
)


class _Stderr:
    """A watch's stderr as it comes (a thread reads it)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        stderr = proc.stderr
        assert stderr is not None

        def read() -> None:
            with stderr:
                self.lines.extend(stderr)

        threading.Thread(target=read, daemon=True).start()

    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, words: str, timeout: float = 60) -> bool:
        deadline = time.monotonic() + timeout
        while words not in self.text():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def line_with(self, words: str) -> str:
        """The first line that says ``words``."""
        return next(line.rstrip("\n") for line in list(self.lines) if words in line)


def _patched(tmp: Path, patch: str, on_hang: str) -> tuple[subprocess.Popen[str], list[int], _Stderr]:
    script = PATCHED_WATCH.format(tests=str(TESTS), patch=patch)
    proc, pids = _start_job(
        tmp, [sys.executable, "-c", script, "watch", "--stall-after", "1", "--on-hang", on_hang], "default"
    )
    return proc, pids, _Stderr(proc)


def _left_running(proc: subprocess.Popen[str], pids: list[int], err: _Stderr) -> None:
    """The job runs on under a watch that keeps watching; a SIGTERM to the watch then ends it
    the ordinary way (passed on; the command's status)."""
    assert [pid for pid in pids if _alive(pid)] == pids, err.text()
    assert proc.poll() is None, err.text()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM, err.text()
    assert "Traceback" not in err.text()


@pytest.mark.parametrize("on_hang", ["report", "exec"])
def test_an_internal_error_in_the_diagnosis_reports_the_stall_and_leaves_the_job(on_hang: str, tmp_path: Path) -> None:
    hook = f"exec {sys.executable} -c 'import sys; open(sys.argv[1], \"w\").write(sys.argv[2])' hooked {{report}}"
    proc, pids, err = _patched(tmp_path, DIAGNOSIS_BUG, hook if on_hang == "exec" else on_hang)
    try:
        said = "ran --on-hang exec" if on_hang == "exec" else "keeping watch (--on-hang report)"
        assert err.wait_for(said), err.text()
        line = err.line_with("could not diagnose: ")
        assert line.startswith("hangdoc watch: could not diagnose: internal error: RuntimeError: a bug (<string>:"), (
            line
        )
        (hang,) = list((tmp_path / "hangs").iterdir())
        report = json.loads((hang / "report.json").read_text())
        assert report["verdict"] == "unknown" and "internal error: RuntimeError: a bug" in report["summary"]
        assert "HANG unknown: could not diagnose: internal error" in err.text()
        if on_hang == "exec":
            assert _until_written(tmp_path / "hooked", lambda text: text == str(hang)) == str(hang)
        _left_running(proc, pids, err)
    finally:
        _end(proc, pids)


def test_an_internal_error_in_the_diagnosis_with_on_hang_kill_ends_the_job(tmp_path: Path) -> None:
    proc, pids, err = _patched(tmp_path, DIAGNOSIS_BUG, "kill")
    try:
        assert proc.wait(timeout=60) == 124, err.text()  # kill asked for: an undiagnosed stall is a hang
        assert [pid for pid in pids if _alive(pid)] == []
        assert "could not diagnose: internal error: RuntimeError: a bug" in err.text()
    finally:
        _end(proc, pids)


def test_names_that_look_like_markup_are_reported_as_they_are(tmp_path: Path) -> None:
    proc, pids, err = _patched(tmp_path, MARKUP_NAMES, "report")
    try:
        assert err.wait_for("keeping watch (--on-hang report)"), err.text()
        assert f"HANG straggler (culprit ranks 1): rank 1 is blocked in {FUNCTION} ({THREAD}.py:5)" in err.text()
        (hang,) = list((tmp_path / "hangs").iterdir())
        text = (hang / "report.txt").read_text()
        assert all(name in text for name in NAMES), text
        assert sorted(p.name for p in hang.iterdir()) == [
            "report.html",
            "report.json",
            "report.txt",
            "snapshot.json.gz",
        ]
        assert "internal error" not in err.text()
        _left_running(proc, pids, err)
    finally:
        _end(proc, pids)


def test_an_internal_error_writing_the_report_still_reports_and_runs_the_hook(tmp_path: Path) -> None:
    hook = "exec sh -c 'cp \"$HANGDOC_REPORT\" copied.json'"
    proc, pids, err = _patched(tmp_path, REPORT_BUG, hook)
    try:
        assert err.wait_for("ran --on-hang exec"), err.text()
        line = err.line_with("a bug in the report")
        assert line.startswith("hangdoc watch: internal error: RuntimeError: a bug in the report (<string>:"), line
        assert line.endswith("; reporting the stall undiagnosed"), line
        report = json.loads(_until_written(tmp_path / "copied.json", _whole_json))
        assert report["verdict"] == "unknown" and "a bug in the report" in report["summary"]
        _left_running(proc, pids, err)
    finally:
        _end(proc, pids)


def _until_written(path: Path, done: Callable[[str], bool], timeout: float = 20) -> str:
    """The file's text once ``done`` holds of it: the hook creates the file before it writes
    it, so a read as soon as it exists can find it empty."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if done(text):
            break
        time.sleep(0.05)
    return text


def _whole_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_sigterm_to_the_watchdog_ends_the_job_in_every_session(tmp_path: Path) -> None:
    proc, pids = _start_job(tmp_path, [*WATCH], "default")
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM, err  # the command's own status
        assert "Traceback" not in err
        assert "leaving processes of its job running: ending them" in err
        assert [pid for pid in pids if _alive(pid)] == []
    finally:
        _end(proc, pids)


# ------------------------------------------------------------------- --on-hang


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("exec 'x", "cannot split it like a shell command line: no closing quotation"),
        ("exec x\\", "no escaped character"),
        ("exec", "exec needs a command"),
        ("  exec  ", "exec needs a command"),
        ("reboot", "expected report, kill or 'exec CMD [ARGS]'"),
        ("", "expected report, kill"),
    ],
)
def test_bad_on_hang_is_a_one_line_usage_error(
    text: str, message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(UsageError, match="--on-hang"):
        OnHang.parse(text)
    monkeypatch.setenv("HANGDOC_NO_HELP", "1")
    assert main(["watch", "--on-hang", text, "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_an_exec_hook_that_cannot_run_is_one_line_and_the_watch_goes_on(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-pager")
    done = _run(
        [
            *WATCH,
            "-q",
            "--stall-after",
            "1",
            "--on-hang",
            f"exec {missing} --now",
            "--out",
            "hangs",
            "--",
            "sh",
            "-c",
            "echo start; sleep 3; echo done",
        ],
        tmp_path,
    )
    assert done.returncode == 0 and done.stdout == "start\ndone\n", done.stderr
    lines = [line for line in done.stderr.splitlines() if "--on-hang exec" in line]
    assert lines == [
        (
            f"hangdoc watch: could not run the --on-hang exec command {missing!r}: "
            "No such file or directory; keeping watch"
        )
    ]
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------ numbers: no NaN


BAD = [math.nan, math.inf, -math.inf, 0.0, -1.0]


def _one(field: str, value: float) -> dict[str, Any]:
    return {field: value}


@pytest.mark.parametrize("field", ["stall_after", "warmup_timeout", "factor"])
@pytest.mark.parametrize("value", BAD)
def test_stall_policy_refuses_non_finite_or_non_positive_values(field: str, value: float) -> None:
    with pytest.raises(UsageError, match="need a finite number above 0"):
        StallPolicy(**_one(field, value))


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0])
def test_stall_policy_refuses_a_bad_minimum(value: float) -> None:
    with pytest.raises(UsageError, match="--min-stall"):
        StallPolicy(min_timeout=value)
    with pytest.raises(UsageError, match="--warmup-steps"):
        StallPolicy(warmup_steps=-1)


@pytest.mark.parametrize("value", [*BAD, 1e-9, 0.5, 1e9])
@pytest.mark.parametrize("field", ["stall_after", "warmup_timeout", "factor", "min_timeout"])
def test_no_nan_reaches_the_stall_comparison(field: str, value: float) -> None:
    """A policy that can be built always gives a finite timeout that a long enough silence
    passes: the comparison that fires the watchdog is never made with a NaN."""
    try:
        policy = StallPolicy(**_one(field, value))
    except UsageError:
        return
    clock = StallClock(policy, started=0.0)
    for t in range(1, 10):
        timeout = clock.timeout().seconds
        assert math.isfinite(timeout) and timeout >= 0
        assert clock.stalled(t + timeout + 1e10)
        clock.activity(float(t))


@pytest.mark.parametrize(
    "argv",
    [
        ["--stall-after", "nan"],
        ["--stall-after", "inf"],
        ["--warmup-timeout", "nan"],
        ["--stall-factor", "nan"],
        ["--min-stall", "nan"],
        ["--check-interval", "nan"],
        ["--check-interval", "inf"],
        ["--kill-grace", "nan"],
        ["--kill-grace", "inf"],
        ["--metrics-port", "70000"],
    ],
)
def test_bad_numbers_are_refused_before_the_command_starts(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = tmp_path / "started"
    assert main(["watch", *argv, "--out", str(tmp_path / "hangs"), "--", "touch", str(started)]) == 2
    err = capsys.readouterr().err
    assert "hangdoc: error: " in err and argv[1] in err and "Traceback" not in err
    assert not started.exists()


# ----------------------------------------------------------------- small parts


def test_a_log_that_fails_to_read_is_opened_again(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("")
    queue = EventQueue()
    tail = LogTail(str(log), None, queue)

    class Failing:
        def read(self, _n: int) -> bytes:
            raise OSError(5, "Input/output error")

        def tell(self) -> int:
            return 0

        def close(self) -> None:
            pass

    tail.close()  # the file it opened, before a failing one takes its place
    tail._handle = Failing()  # type: ignore[assignment]
    tail.poll()  # no exception: the watch goes on
    with log.open("a") as f:
        f.write("step\n")
    tail.poll()
    assert [e.signal for e in queue.drain()] == [Signal.OUTPUT]  # opened again, read from the start
    tail.close()


def test_a_closed_stderr_does_not_stop_the_watch() -> None:
    from hangdoc.watch.watchdog import WatchConfig, Watchdog

    def closed(_level: Level, _message: str) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    dog = Watchdog(WatchConfig(job="pid:1"), closed)
    dog.say(Level.HANG, "anything")  # swallowed
