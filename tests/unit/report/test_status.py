"""Status on stderr (``hangdoc.report.status``): a live line on a terminal, the plain
one-line messages elsewhere and with --json, nothing with --quiet; the report untouched.

``hangdoc diagnose`` runs here against a ``ReplayNode`` serving a hand-made 4-rank
snapshot (``_remote_nodes`` patched): the whole capture loop runs, no job is started. The
terminal runs use a real pty, with stdout and stderr both on it, as a user's terminal has.
"""

from __future__ import annotations

import errno
import fcntl
import io
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from support.factories import make_rank, make_snapshot
from support.paths import REPO

from hangdoc import cli
from hangdoc.bundle import save_snapshot
from hangdoc.fleet.node import ReplayNode
from hangdoc.pipeline import Sampling, Step
from hangdoc.report.status import StatusDisplay, describe

C10D = "torch/distributed/distributed_c10d.py"
FAST = ["--window", "0.6", "--interval", "0.15"]  # four rounds, a fraction of a second
FOUND = "hangdoc: found 4 rank processes for pid:4242 (world size 4)"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def mismatch_snapshot():
    def site(op: str, where: str) -> list[str]:
        return ["train.py:<module>:9", where, f"{C10D}:{op}:2800"]

    return make_snapshot(
        [make_rank(r, site("all_gather", "metrics.py:log:12")) for r in (0, 1, 2)]
        + [make_rank(3, site("all_reduce", "model.py:sync:88"))]
    )


@pytest.fixture
def replayed(monkeypatch):
    """``hangdoc diagnose`` reads the snapshot's 4 ranks through a replaying node."""
    node = ReplayNode(mismatch_snapshot(), "node0")
    monkeypatch.setattr(cli, "_remote_nodes", lambda _args: [node])


class _Terminal(io.StringIO):
    """A stream that says it is a terminal: rich draws its live line into it."""

    def isatty(self) -> bool:
        return True


# ------------------------------------------------------------------ the live line's words


def test_the_live_line_says_rounds_ranks_and_time_left() -> None:
    state = Sampling(Step.SAMPLING, ranks=8, captured=7, rounds=3, elapsed=0.6, window=2.0)
    assert describe(state, 0.6) == ("sampling stacks · 3 rounds · 7 of 8 ranks captured · 1.4 s left of the 2 s window")


def test_after_the_window_it_says_the_step_native_frames_and_probes() -> None:
    state = Sampling(Step.NATIVE, ranks=4, captured=4, rounds=5, elapsed=2.1, window=2.0, native=2, probes=3)
    assert describe(state, 2.5) == (
        "taking native frames · 5 rounds · 4 of 4 ranks captured · 2.5 s · native frames of 2 ranks · 3 probes answered"
    )


def test_no_probe_answering_is_not_news() -> None:
    state = Sampling(Step.ANALYSING, ranks=4, captured=4, rounds=1, elapsed=2.0, window=2.0, probes=0)
    assert "probe" not in describe(state, 2.0)


def test_before_any_round_it_says_what_it_is_doing() -> None:
    assert describe(Sampling(Step.FINDING), 0.25) == "finding the job's ranks · 0.2 s"


# ------------------------------------------------------------------ the display


def test_off_a_terminal_the_messages_are_plain_lines() -> None:
    out = io.StringIO()
    with StatusDisplay.on(out, quiet=False, json=False) as shown:
        assert not shown.live
        shown.say("found 4 rank processes for x")
        shown.update(Sampling(Step.SAMPLING, ranks=4, rounds=1))
        with shown.busy("analysing", after=0.0):
            time.sleep(0.05)
    assert out.getvalue() == "hangdoc: found 4 rank processes for x\n"


@pytest.mark.parametrize(("quiet", "json_flag"), [(True, False), (False, True), (True, True)])
def test_quiet_and_json_draw_no_live_line_on_a_terminal(quiet, json_flag) -> None:
    out = _Terminal()
    with StatusDisplay.on(out, quiet=quiet, json=json_flag) as shown:
        assert not shown.live
        shown.update(Sampling(Step.SAMPLING, ranks=4, rounds=1))
        shown.say("found")
    assert out.getvalue() == ("" if quiet else "hangdoc: found\n")


def test_on_a_terminal_the_live_line_is_drawn_then_erased() -> None:
    out = _Terminal()
    with StatusDisplay.on(out, quiet=False, json=False) as shown:
        assert shown.live
        shown.update(Sampling(Step.SAMPLING, ranks=4, captured=4, rounds=2, elapsed=0.5, window=2.0))
        shown.say("found 4 rank processes")
        time.sleep(0.3)
    text = out.getvalue()
    assert "sampling stacks · 2 rounds · 4 of 4 ranks captured" in text
    assert "hangdoc: found 4 rank processes" in ANSI.sub("", text)
    assert text.endswith("\x1b[2K") or text.rstrip("\r\n").endswith("\x1b[2K")  # erased last


def test_a_long_step_gets_a_live_line_only_once_it_is_long() -> None:
    quick, slow = _Terminal(), _Terminal()
    with StatusDisplay.on(quick, quiet=False, json=False) as shown, shown.busy("analysing", after=5.0):
        time.sleep(0.05)
    assert quick.getvalue() == ""
    with (
        StatusDisplay.on(slow, quiet=False, json=False) as shown,
        shown.busy("reading hang.json", after=0.05) as now_doing,
    ):
        time.sleep(0.3)
        now_doing("analysing 4 ranks")
        time.sleep(0.3)
    assert "reading hang.json" in slow.getvalue()
    assert "analysing 4 ranks" in slow.getvalue()


# ------------------------------------------------------------------ the CLI, off a terminal


def test_quiet_prints_nothing_on_stderr(replayed, capsys) -> None:
    assert cli.main(["diagnose", "pid:4242", *FAST, "--quiet"]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    assert "collective_mismatch" in out.out


def test_off_a_terminal_stderr_has_the_plain_lines(replayed, capsys, tmp_path) -> None:
    saved = tmp_path / "hang.json"
    assert cli.main(["diagnose", "pid:4242", *FAST, "--save", str(saved)]) == 0
    out = capsys.readouterr()
    assert out.err.splitlines() == [
        FOUND,
        f"hangdoc: snapshot saved to {saved}; replay with `hangdoc analyze {saved}`",
    ]
    assert "collective_mismatch" in out.out


def test_json_keeps_the_plain_lines_on_stderr_and_stdout_clean(replayed, capsys) -> None:
    assert cli.main(["diagnose", "pid:4242", *FAST, "--json"]) == 0
    out = capsys.readouterr()
    assert out.err.splitlines() == [FOUND]
    assert json.loads(out.out)["verdict"] == "collective_mismatch"


def test_analyze_off_a_terminal_prints_nothing_on_stderr(tmp_path, capsys) -> None:
    path = tmp_path / "hang.json"
    save_snapshot(mismatch_snapshot(), path)
    assert cli.main(["analyze", str(path)]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    assert "collective_mismatch" in out.out


# ------------------------------------------------------------------ the CLI, on a terminal

# the CLI in a child whose stdout and stderr are a pty; argv[1]: a snapshot, argv[2]: how
# many seconds analysis takes at least, the rest: hangdoc's arguments
DRIVER = """
import sys, time
from hangdoc import cli
from hangdoc.analysis import analyse as module
from hangdoc.bundle import load_snapshot
from hangdoc.fleet.node import ReplayNode

node = ReplayNode(load_snapshot(sys.argv[1]), "node0")
cli._remote_nodes = lambda _args: [node]
slow, real = float(sys.argv[2]), module.analyse
def analyse(snapshot):
    time.sleep(slow)
    return real(snapshot)
module.analyse = analyse
sys.exit(cli.main(sys.argv[3:]))
"""


def _run(snapshot: Path, slow: float, argv: list[str], terminal: bool) -> tuple[int, str]:
    """Run the CLI; stdout and stderr on one pty (``terminal``) or on pipes (stdout only
    returned then). The pty's bytes come back as text with CRLF made LF."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES")}
    env.update(TERM="xterm-256color", PYTHONPATH=str(REPO))
    args = [sys.executable, "-c", DRIVER, str(snapshot), str(slow), *argv]
    if not terminal:
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60, check=False)
        return done.returncode, done.stdout
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, close_fds=True)
    os.close(follower)
    chunks = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(leader, 65536)
            except OSError as err:  # EIO: the child closed its end
                if err.errno != errno.EIO:
                    raise
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    return code, b"".join(chunks).decode().replace("\r\n", "\n")


def _after_the_live_line(raw: str) -> str:
    """What the terminal shows once the live line is erased: the text after the last
    erase, without colours."""
    return ANSI.sub("", raw[raw.rindex("\x1b[2K") + len("\x1b[2K") :]).lstrip("\r")


def _unstamped(report: str) -> str:
    return re.sub(r"captured \S+", "captured AT", report)


@pytest.fixture
def saved(tmp_path) -> Path:
    path = tmp_path / "hang.json"
    save_snapshot(mismatch_snapshot(), path)
    return path


@pytest.mark.timeout(120)
def test_on_a_terminal_diagnose_shows_the_live_line_and_leaves_the_report_intact(saved) -> None:
    argv = ["diagnose", "pid:4242", *FAST, "--width", "100"]
    code, report = _run(saved, 0.0, argv, terminal=False)
    assert code == 0
    code, raw = _run(saved, 0.0, argv, terminal=True)
    assert code == 0, raw
    assert "sampling stacks · 1 round · 4 of 4 ranks captured" in raw
    assert re.search(
        r"sampling stacks · [2-9] rounds · 4 of 4 ranks captured · \d\.\d s left of "
        r"the 0\.6 s window",
        raw,
    )
    assert "analysing" in raw
    assert FOUND in ANSI.sub("", raw)  # the message stays, above the live line
    # the report as it reads in a pipe, whole (but for the time it was captured at)
    assert _unstamped(_after_the_live_line(raw)) == _unstamped(report)


@pytest.mark.timeout(120)
def test_on_a_terminal_quiet_shows_only_the_report(saved) -> None:
    code, raw = _run(saved, 0.0, ["diagnose", "pid:4242", *FAST, "--width", "100", "--quiet"], terminal=True)
    assert code == 0, raw
    assert "sampling stacks" not in raw and "hangdoc:" not in raw
    assert ANSI.sub("", raw).startswith("verdict: collective_mismatch")


@pytest.mark.timeout(120)
def test_on_a_terminal_a_long_analysis_gets_a_live_line(saved) -> None:
    argv = ["analyze", str(saved), "--width", "100"]
    code, report = _run(saved, 0.0, argv, terminal=False)
    assert code == 0
    code, raw = _run(saved, 1.6, argv, terminal=True)
    assert code == 0, raw
    assert "analysing 4 ranks · 1." in raw  # shown after 1 s, with its clock
    assert _after_the_live_line(raw) == report
    code, raw = _run(saved, 0.0, argv, terminal=True)  # a quick one: no live line at all
    assert code == 0, raw
    assert "analysing" not in raw and ANSI.sub("", raw) == report
