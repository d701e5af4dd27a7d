"""``hangdoc watch --on-hang report`` on a real hung job whose names look like rich markup
(issue 23, item 5): the function the summary quotes is ``[/]x`` and a thread is
``reader[/dev/sda]``. The report is written, the names are in it as they are, and the job is
left running (the watch used to end with "internal error" and kill it)."""

from __future__ import annotations

import time

import pytest
from support.harness import tagged_pids
from test_watch_live import WatchRun, watch_run  # noqa: F401 - the fixture

pytestmark = [pytest.mark.timeout(120)]

FUNCTION = "[/]x"
THREAD = "reader[/dev/sda]"


def test_markup_names_are_reported_as_they_are_and_the_job_left_running(watch_run) -> None:  # noqa: F811
    run: WatchRun = watch_run(
        ["--stall-after", "3", "--max-window", "3", "--on-hang", "report"],
        3,
        ["--hang", "leave", "--at", "6", "--steps", "100", "--markup-names"],
    )
    deadline = time.monotonic() + 90
    while (
        "keeping watch (--on-hang report)" not in run.err() and time.monotonic() < deadline and run.proc.poll() is None
    ):
        time.sleep(0.2)
    err = run.err()
    assert "keeping watch (--on-hang report)" in err, err[-4000:]
    assert "internal error" not in err and "Traceback" not in err
    report = run.report()
    assert report["verdict"] == "collective_mismatch"
    assert f"{FUNCTION} (ddp_train.py:" in report["summary"], report["summary"]
    assert f"{FUNCTION} (ddp_train.py:" in report["watch"]["fired_because"]
    (hang,) = run.reports()
    text = (hang / "report.txt").read_text()
    words = " ".join(text.split())  # the report wraps at 120 columns
    assert f"watch fired at {report['watch']['detected_at']}: {report['watch']['fired_because']}" in words, text
    assert f"culprit ranks [0] confidence: {report['confidence']} {report['summary']}" in words, text
    assert f"HANG collective_mismatch (culprit ranks 0): {report['summary']}" in err
    assert THREAD in (hang / "report.html").read_text()  # every thread of each rank's stacks
    # --on-hang report: the job is still there, hung; the fixture ends it and all it started
    time.sleep(1.0)
    assert run.proc.poll() is None
    assert len(tagged_pids(run.tag)) >= 5, "watch, torchrun, 3 ranks"
