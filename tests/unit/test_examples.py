"""The demos (``examples/``) without a job: the fix they show, read from the report of a real
recording of the demo job (``tests/data/demo_mismatch.json.gz``, saved by ``make demo``),
the demo job's lines they quote, and what ``make watch-demo`` keeps out of the terminal.
The runs on the real job are in ``tests/live/test_demo_live.py``."""

from __future__ import annotations

import copy
import os
import sys
import tempfile
from pathlib import Path

import pytest
from support.paths import REPO, TESTS

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot
from hangdoc.report.json_report import to_json_dict

sys.path.insert(0, str(REPO / "examples"))
import run_demo
import watch_demo

RECORDING = TESTS / "data" / "demo_mismatch.json.gz"
TRAIN_LINES = (REPO / "examples" / "demo_train.py").read_text().splitlines()


@pytest.fixture(scope="module")
def report() -> dict:
    snapshot = load_snapshot(RECORDING)
    return to_json_dict(analyse(snapshot), snapshot)


@pytest.mark.timeout(30)
def test_the_fix_quotes_the_lines_that_decide_and_the_change(report: dict) -> None:
    assert (report["verdict"], report["culprit_ranks"]) == ("collective_mismatch", [3])
    lines = run_demo.the_fix(report)
    assert lines is not None
    text = "\n".join(lines)
    # what hangdoc found, in its own words (from the report)
    assert "rank 3: it waits in all_gather (demo_train.py:24, in gather_metrics)" in " ".join(lines)
    assert "ranks 0-2 wait in all_reduce (demo_train.py:30)" in " ".join(lines)
    # the quoted lines are the demo job's, under their real numbers
    quoted = [line for line in lines if " | " in line]
    assert len(quoted) == 3
    for line in quoted[:2]:
        number, code = line.split(" | ", 1)
        assert TRAIN_LINES[int(number) - 1].startswith(code)
    gate, bug, fix = quoted
    assert "step % LOG_EVERY == 0" in gate
    assert "start_step = 1 if rank == 3 else 0" in bug and "#" not in bug
    assert fix.split(" | ", 1)[0] == bug.split(" | ", 1)[0]  # the same line, changed
    assert fix.endswith("    start_step = 0")
    assert "The fix: start every rank from the same step." in text
    assert max(len(line) for line in lines) <= run_demo.WIDTH


@pytest.mark.timeout(30)
@pytest.mark.parametrize("change", ["verdict", "culprit", "no_op"])
def test_no_fix_is_claimed_for_another_answer(report: dict, change: str) -> None:
    other = copy.deepcopy(report)
    if change == "verdict":
        other["verdict"] = "straggler"
    elif change == "culprit":
        other["culprit_ranks"] = [0]
    else:
        for rank in other["ranks"]:
            rank["op"] = None
    assert run_demo.the_fix(other) is None


def test_show_fix_says_when_the_answer_is_not_the_planted_bug(capsys) -> None:
    run_demo.show_fix({"verdict": "not_hung", "culprit_ranks": [], "ranks": []})
    err = capsys.readouterr().err
    assert "hangdoc's answer (not_hung) is not the bug planted in this demo" in err
    assert "start_step = 0" not in err


def test_intro_says_the_job_is_broken_on_purpose(capsys) -> None:
    run_demo.intro()
    err = capsys.readouterr().err
    assert "broken on purpose: rank 3 is one step off" in " ".join(err.split())
    number, line = run_demo.source_line(run_demo.BUG_MARK)
    assert f"{number:>3} | {line.split('#')[0].rstrip()}" in err
    assert max(len(line) for line in err.splitlines()) <= run_demo.WIDTH


def test_the_demo_removes_its_scratch_directory_and_keeps_the_snapshot_elsewhere(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen = []

    def demo(argv: list[str], tag: str, ready: Path) -> int:
        (ready / "job.log").write_text("the job's output")
        (ready / "ready.0").touch()
        seen.append(ready)
        if argv:
            raise KeyboardInterrupt  # Ctrl-C while the job runs
        return 0

    monkeypatch.setattr(run_demo, "_demo", demo)
    assert run_demo.main([]) == 0
    with pytest.raises(KeyboardInterrupt):
        run_demo.main(["--json"])
    assert len(seen) == 2 and all(p.parent == tmp_path and p.name.startswith("hangdoc-demo-") for p in seen)
    assert list(tmp_path.iterdir()) == []  # nothing left behind, either way
    kept = run_demo.kept_snapshot()
    assert kept.parent == tmp_path and kept.name.endswith(".json.gz") and str(os.getuid()) in kept.name


def test_user_save_is_used_for_the_fix() -> None:
    assert run_demo._saves(["--save", "a.json"]) == "a.json"
    assert run_demo._saves(["--json", "--save=b.json.gz"]) == "b.json.gz"
    assert run_demo._saves(["--json"]) is None


# ------------------------------------------------------------------------ watch-demo

# `make watch-demo`'s output, from a real run (paths and pids shortened), the launcher's
# traceback on SIGTERM cut to its first and last lines; then one of the watch's own lines
# after the kill, as when a process outlives the grace
WATCH_OUTPUT = [
    "hangdoc watch: watching torchrun ... examples/demo_train.py (pid 22136): a hang is no output for more "
    "than 5 s (--stall-after); reports go to hangs/\n",
    "hangdoc watch: stall suspected: no output for 5.0 s; stall timeout 5.0 s (warm-up: 0 of 5 steps seen); "
    "diagnosing pid:22136\n",
    "hangdoc watch: not a hang: the job is progressing: not hung: rank 0 completed distributed operations "
    "during the window\n",
    "hangdoc watch: HANG collective_mismatch (culprit ranks 3): collective mismatch: rank 3 is in all_gather "
    "(demo_train.py:24) while ranks 0-2 are in all_reduce (demo_train.py:30)\n",
    "hangdoc watch: report: hangs/hang-20261128T160619Z/report.txt (json: hangs/hang-20261128T160619Z/report.json)\n",
    "hangdoc watch: --on-hang kill: ending the job (1 process tree), grace 5 s\n",
    "W1128 16:06:19.211000 22136 torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal, "
    "shutting down workers\n",
    "Traceback (most recent call last):\n",
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 22136 got signal: 15\n",
    "hangdoc watch: could not end pid 22150\n",
]


def test_watch_demo_holds_back_only_the_launcher_lines_after_the_kill() -> None:
    split = list(watch_demo.split(WATCH_OUTPUT))
    assert [line for shown, line in split if not shown] == WATCH_OUTPUT[6:9]
    assert [line for shown, line in split if shown] == WATCH_OUTPUT[:6] + WATCH_OUTPUT[9:]


def test_watch_demo_finds_the_hang_directory() -> None:
    assert watch_demo.report_dir(WATCH_OUTPUT[4]) == Path("hangs/hang-20261128T160619Z")
    assert watch_demo.report_dir(WATCH_OUTPUT[3]) is None
    assert watch_demo.report_dir("report: hangs/x/report.txt (json: y)") is None  # the job's, not the watch's


def test_watch_demo_command_is_the_documented_one() -> None:
    cmd = watch_demo.shown_command(watch_demo.command(Path("hangs"), 29655))
    assert cmd.startswith("hangdoc watch --stall-after 5 --on-hang kill --kill-grace 5 --out hangs -- torchrun ")
    assert cmd.endswith(" examples/demo_train.py")
