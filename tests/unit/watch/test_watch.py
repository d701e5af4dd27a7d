"""The watchdog's parts: stall clocks, the hang judgement, signals, metrics, job control,
the hang directory and the command line. The runs on real training jobs, wrapped and
attached, are in ``tests/live/test_watch_live.py``."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.harness import is_running
from support.paths import TESTS
from support.said import Said, silent

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot
from hangdoc.capture.read.heartbeat_files import read_dir
from hangdoc.cli import main
from hangdoc.errors import JobNotFound, UsageError
from hangdoc.fleet.client import AgentError
from hangdoc.watch import jobcontrol
from hangdoc.watch.activity import EventQueue, HeartbeatSource, LogTail, StepPattern, _Scanner
from hangdoc.watch.config import Level
from hangdoc.watch.incident import new_dir
from hangdoc.watch.stall import Action, Signal, StallClock, StallPolicy, Trigger, judge
from hangdoc.watch.watchdog import OnHang

SNAPSHOTS = TESTS / "snapshots"

# ------------------------------------------------------------------ stall clock


def test_fixed_timeout_after_warmup() -> None:
    clock = StallClock(StallPolicy(stall_after=5.0, warmup_steps=2), started=100.0)
    assert clock.timeout().seconds == 5.0 and clock.warming_up  # warm-up defaults to stall_after
    clock.activity(101.0)
    clock.activity(102.0)
    assert not clock.warming_up
    assert clock.timeout().basis == "--stall-after"
    assert not clock.stalled(107.0)
    assert clock.stalled(107.1)
    assert clock.silence(107.1) == pytest.approx(5.1)


def test_learned_timeout_ignores_warmup_gaps_and_has_a_floor() -> None:
    clock = StallClock(StallPolicy(warmup_steps=3, factor=3.0, min_timeout=2.0), started=0.0)
    assert clock.timeout().seconds == 600.0  # learned: warm-up default
    for t in (50.0, 51.0, 52.0):  # a 50 s first step (compilation) is not learned
        clock.activity(t)
    assert clock.timeout().seconds == 2.0  # nothing learned yet: the floor
    clock.activity(52.5)
    clock.activity(53.0)
    assert clock.longest_gap == pytest.approx(0.5)  # 51 -> 52 was in warm-up
    clock.activity(57.0)  # an evaluation of 4 s that ended: learned
    assert clock.timeout().seconds == pytest.approx(12.0)
    assert clock.timeout().basis.startswith("learned: 3 x longest step gap 4.00 s")
    assert not clock.stalled(68.9) and clock.stalled(69.1)


def test_events_standing_for_several_steps_and_late_events() -> None:
    clock = StallClock(StallPolicy(warmup_steps=10, min_timeout=1.0), started=0.0)
    clock.activity(1.0, count=12)  # heartbeats read once per check: 12 steps since the last look
    assert not clock.warming_up and clock.events == 12
    clock.activity(0.5)  # older than the last: ignored
    assert clock.events == 12 and clock.last == 1.0
    clock.activity(2.0, count=10)
    assert clock.rate(2.0) == pytest.approx(10.0)


def test_trigger_sentence() -> None:
    trigger = Trigger(Signal.HEARTBEAT, 31.2, 30.0, "--stall-after", 1.0, 40, 39, "2026-11-22T00:00:00+00:00")
    assert trigger.sentence() == "no heartbeat for 31.2 s (last step 39); stall timeout 30.0 s (--stall-after)"


# ---------------------------------------------------------------------- judge


def _recorded(name: str):
    snapshot = load_snapshot(SNAPSHOTS / f"{name}.json.gz")
    return snapshot, analyse(snapshot)


def test_judge_dismisses_progress_and_fires_on_hangs() -> None:
    for name in ("not_hung_checkpoint_barrier", "not_hung_fast_steps"):
        assert judge(_recorded(name)[1], 0, 3).action is Action.DISMISS, name
    for name in ("mismatch_ddp_uneven_epoch_end", "cleanup_trainer_exit_barrier", "rank_missing_never_started"):
        decision = judge(_recorded(name)[1], 0, 3)
        assert decision.action is Action.FIRE, name
        assert decision.reason.startswith("confirmed by diagnosis: ")


def test_judge_postpones_a_working_straggler_then_fires() -> None:
    _, diagnosis = _recorded("straggler_crop_retry_spin")  # rank 2 spins on CPU
    assert diagnosis.culprit_ranks == (2,)
    first = judge(diagnosis, 0, 2)
    assert first.action is Action.POSTPONE and "rank 2 still working" in first.reason
    assert judge(diagnosis, 1, 2).action is Action.POSTPONE
    last = judge(diagnosis, 2, 2)
    assert last.action is Action.FIRE and "after 3 looks" in last.reason


def test_judge_fires_at_once_on_a_blocked_straggler() -> None:
    _, diagnosis = _recorded("straggler_stale_cache_lock")  # rank 3 polls a lock in a sleep loop
    assert judge(diagnosis, 0, 3).action is Action.FIRE


# -------------------------------------------------------------------- signals


def test_step_pattern_numbers() -> None:
    assert StepPattern(r"step (?P<step>\d+)").match("it 3 step 41 loss") == (True, 41)
    assert StepPattern(r"iter (\d+)").match("iter 7") == (True, 7)
    assert StepPattern(r"iter (\w+)").match("iter x") == (True, None)
    assert StepPattern(r"loss=").match("loss=0.3") == (True, None)
    assert StepPattern(r"loss=").match("eval") == (False, None)


def test_scanner_splits_lines_across_chunks_and_carriage_returns() -> None:
    queue = EventQueue()
    scanner = _Scanner(StepPattern(r"step (\d+)"), queue.put)
    scanner.feed(b"step 1\nst", 1.0)
    scanner.feed(b"ep 2\r50%|###  \rstep 3", 2.0)  # a progress bar rewriting its line
    scanner.feed(b"\n", 3.0)
    events = queue.drain()
    assert [(e.at, e.count) for e in events if e.signal is Signal.OUTPUT] == [(1.0, 1), (2.0, 1), (3.0, 1)]
    assert [(e.at, e.step) for e in events if e.signal is Signal.STEP_LINE] == [(1.0, 1), (2.0, 2), (3.0, 3)]
    assert queue.drain() == []


def test_output_bursts_count_as_one_step() -> None:
    queue = EventQueue()
    scanner = _Scanner(None, queue.put)
    for at in (10.0, 10.005, 10.01, 10.015, 10.1):  # a launcher banner in four chunks, then a step line
        scanner.feed(b"x\n", at)
    assert [(e.at, e.count) for e in queue.drain()] == [(10.0, 1), (10.005, 0), (10.01, 0), (10.015, 0), (10.1, 1)]
    clock = StallClock(StallPolicy(warmup_steps=2), started=0.0)
    for at, count in ((10.0, 1), (10.005, 0), (10.015, 0)):
        clock.activity(at, count)
    assert clock.warming_up and clock.last == 10.015  # activity, but one step


def test_continuous_output_still_counts_steps() -> None:
    queue = EventQueue()
    scanner = _Scanner(None, queue.put)
    for i in range(10):  # a chunk every 11 ms: a new step every 20+ ms, not one endless burst
        scanner.feed(b"x", 5.0 + i * 0.011)
    assert sum(e.count for e in queue.drain()) == 5


class _Node:
    """A stand-in node for the watch loop's fan-out logic (no process behind it)."""

    def __init__(self, name: str, error: Exception | None = None, beats: dict | None = None) -> None:
        self.name, self.error, self.beats = name, error, beats or {}

    def find_ranks(self, spec):
        raise self.error or JobNotFound(f"nothing on {self.name}")

    def heartbeats(self, pids):
        if self.error:
            raise self.error
        return self.beats


def test_an_unreachable_agent_is_not_a_job_that_ended() -> None:
    from hangdoc.pipeline import CaptureOptions
    from hangdoc.watch.tracked import TrackedRanks

    def refresh(nodes: list[_Node]) -> bool:
        return TrackedRanks(nodes, "10.0.0.1:29500", CaptureOptions().timeout, silent).refresh()

    assert refresh([_Node("a")]) is True  # every node answered: no rank anywhere
    assert refresh([_Node("a"), _Node("b", AgentError("agent b unavailable"))]) is False
    assert refresh([_Node("b", AgentError("agent b unavailable"))]) is False


def test_heartbeats_of_a_failing_node_are_none_not_an_error() -> None:
    from hangdoc.fleet.coordinator import Fleet
    from hangdoc.model import Heartbeat, RankProcess
    from hangdoc.watch.activity import fleet_heartbeats

    beat = Heartbeat(7, 3, 6, False, 0.5)
    good, bad = _Node("good", beats={7: beat}), _Node("bad", AgentError("too old for the RPC"))
    assert fleet_heartbeats(Fleet([(bad, RankProcess(7, "bad", 1))], 2), 5.0) == {}
    both = Fleet([(good, RankProcess(7, "good", 0)), (bad, RankProcess(7, "bad", 1))], 2)
    assert fleet_heartbeats(both, 5.0) == {("good", 7): beat}  # same pid on another node: keyed apart


def test_log_tail_follows_appends_truncation_and_rotation(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("step 1\nstep 2\n")  # already there: not activity now
    queue = EventQueue()
    tail = LogTail(str(log), StepPattern(r"step (\d+)"), queue)
    tail.poll()
    assert queue.drain() == []
    with log.open("a") as f:
        f.write("step 3\n")
    tail.poll()
    assert [e.step for e in queue.drain() if e.signal is Signal.STEP_LINE] == [3]
    log.write_text("step 4\n")  # truncated and rewritten
    tail.poll()
    assert [e.step for e in queue.drain() if e.signal is Signal.STEP_LINE] == [4]
    log.rename(tmp_path / "train.log.1")  # rotated
    log.write_text("step 5\n")
    tail.poll()
    assert [e.step for e in queue.drain() if e.signal is Signal.STEP_LINE] == [5]
    tail.close()


def test_log_tail_waits_for_a_file_that_does_not_exist_yet(tmp_path: Path) -> None:
    queue = EventQueue()
    tail = LogTail(str(tmp_path / "later.log"), None, queue)
    tail.poll()
    assert queue.drain() == []
    (tmp_path / "later.log").write_text("hello\n")
    tail.poll()
    assert [e.signal for e in queue.drain()] == [Signal.OUTPUT]
    tail.close()


def _beat(directory: Path, code: str) -> int:
    proc = subprocess.run(
        [sys.executable, "-c", f"import hangdoc, os\n{code}\nprint(os.getpid())"],
        env=dict(os.environ, HANGDOC_HEARTBEAT_DIR=str(directory)),
        capture_output=True,
        text=True,
        check=True,
    )
    return int(proc.stdout.split()[-1])


def test_heartbeat_reader_counts_steps_between_looks(tmp_path: Path) -> None:
    reader = HeartbeatSource(lambda: read_dir(tmp_path))
    assert reader.poll() == []
    a = _beat(tmp_path, "for s in range(8):\n    with hangdoc.step(s): pass")
    first = reader.poll()
    assert len(first) == 1 and first[0].signal is Signal.HEARTBEAT
    assert first[0].step == 7 and first[0].count == 1  # a first look: one step, whatever the number
    assert reader.poll() == []  # nothing new
    _beat(tmp_path, "hangdoc.heartbeat(20)")
    second = reader.poll()
    assert second[0].step == 20 and second[0].count == 13  # the steps since the last look
    assert read_dir(tmp_path)[a].step == 7


# metrics: tests/unit/watch/test_metrics.py


# ---------------------------------------------------------------- job control


def test_end_job_reaches_other_sessions_and_escalates(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = (
        "trap '' TERM\n"  # the root ignores SIGTERM: needs SIGKILL
        f"setsid sleep 300 & echo $! >> {pids}\n"  # a worker in a session of its own, like torchrun's
        f"sleep 300 & echo $! >> {pids}\n"
        f"echo $$ >> {pids}\n"
        "wait\n"
    )
    root = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while (not pids.exists() or len(pids.read_text().split()) < 3) and time.monotonic() < deadline:
            time.sleep(0.05)
        members = [int(p) for p in pids.read_text().split()]
        t0 = time.monotonic()
        left = jobcontrol.end_job([root.pid], grace=0.5, owned=[root.pid])
        assert left == []
        assert time.monotonic() - t0 < 8
        root.wait(timeout=5)
        assert root.returncode == -signal.SIGKILL
        for pid in members:
            assert not is_running(pid), pid
    finally:
        if root.poll() is None:
            root.kill()
        for pid in [int(p) for p in pids.read_text().split()] if pids.exists() else []:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_exit_status_like_a_shell() -> None:
    assert jobcontrol.exit_status(3) == 3
    assert jobcontrol.exit_status(-9) == 137


# ------------------------------------------------------------- hang directory


def test_hang_directories_never_collide(tmp_path: Path) -> None:
    import datetime

    when = datetime.datetime(2026, 11, 22, 3, 4, 5, tzinfo=datetime.UTC)
    first = new_dir(tmp_path, when, {"report.json": b"{}"})
    assert first.name == "hang-20261122T030405Z"
    assert new_dir(tmp_path, when, {}).name == "hang-20261122T030405Z-2"
    assert stat.S_IMODE(first.stat().st_mode) == 0o700  # private whatever the umask: source lines
    assert stat.S_IMODE((first / "report.json").stat().st_mode) == 0o600
    assert [p.name for p in first.iterdir()] == ["report.json"]


# ----------------------------------------------------------------------- CLI


def test_on_hang_forms() -> None:
    assert OnHang.parse("report") == OnHang("report")
    assert OnHang.parse("kill") == OnHang("kill")
    assert OnHang.parse("exec ./page.sh --team ml '{report}'") == OnHang(
        "exec", ("./page.sh", "--team", "ml", "{report}")
    )
    for bad in ("exec", "restart", "", "exec 'x"):
        with pytest.raises(UsageError):
            OnHang.parse(bad)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["watch"], "needs a JOB"),
        (["watch", "pid:1", "--", "true"], "either a JOB"),
        (["watch", "--stall-after", "0", "--", "true"], "--stall-after"),
        (["watch", "--step-regex", "(", "--", "true"], "--step-regex"),
        (["watch", "--on-hang", "reboot", "--", "true"], "--on-hang"),
        (["watch", "10.0.0.1:29500", "--agents", "127.0.0.1:1", "--on-hang", "kill"], "through agents"),
        (["watch", "--agents", "127.0.0.1:1", "--", "true"], "--job"),
    ],
)
def test_watch_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def _watch_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """A separate process: wrapping makes the watchdog a child subreaper, not for pytest."""
    return subprocess.run(
        [sys.executable, "-m", "hangdoc", "watch", *args], check=False, capture_output=True, text=True, timeout=60
    )


def test_wrapped_exit_status_passes_through(tmp_path: Path) -> None:
    out = tmp_path / "hangs"
    done = _watch_cli("--out", str(out), "--", "sh", "-c", "echo hi; exit 3")
    assert done.returncode == 3 and done.stdout == "hi\n"  # the command's output passes through
    assert _watch_cli("--out", str(out), "--", "sh", "-c", "kill -9 $$").returncode == 137
    missing = _watch_cli("--out", str(out), "--", str(tmp_path / "no-such-command"))
    assert missing.returncode == 127
    assert "cannot run" in missing.stderr and "Traceback" not in missing.stderr
    assert not out.exists() or not list(out.iterdir())


def test_attach_to_a_job_that_does_not_exist(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", "127.0.0.1:1"]) == 3
    assert "no" in capsys.readouterr().err


def test_silence_that_cannot_be_diagnosed_still_fires(tmp_path: Path) -> None:
    out = tmp_path / "hangs"
    # not a distributed job at all: silent for 4 s, no rank process to diagnose
    done = _watch_cli("--stall-after", "1", "--out", str(out), "--", "sh", "-c", "echo start; sleep 4")
    assert done.returncode == 0, done.stderr
    (hang,) = list(out.iterdir())
    report = json.loads((hang / "report.json").read_text())
    assert report["verdict"] == "unknown" and report["partial"] is True
    assert "could not be diagnosed" in report["summary"]
    assert report["watch"]["signal"] == "output"
    assert report["watch"]["fired_because"].startswith("no output for ")
    assert (hang / "report.txt").exists()
    assert "could not diagnose" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["watch", "--job", "ray:raysubmit_x", "--", "true"], "watched by attaching"),
        (["watch", "ray:raysubmit_x", "--on-hang", "kill"], "exec ray job stop {job}"),
        (["watch", "ray:raysubmit_x", "--agents", "127.0.0.1:1"], "places its own agents"),
        (["watch", "10.0.0.1:29500", "--workers", "Trainer*"], "are for ray:JOB"),
    ],
)
def test_ray_watch_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


# ------------------------------------------------------------ a fleet source (ray:)


class _Source:
    """A fleet source as a ray: job's: entered once for the whole watch, its finder asked
    at every search; records what happened to it."""

    def __init__(self, answers: list[object]) -> None:
        self.answers = answers  # each search's Fleet, or the error it raises
        self.entered = self.exited = 0
        self.searches: list[str] = []

    def __call__(self, _say):
        import contextlib

        @contextlib.contextmanager
        def held():
            self.entered += 1
            try:
                yield self.find
            finally:
                self.exited += 1

        return held()

    def find(self, job, _say):
        self.searches.append(str(job))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def _one_rank_fleet():
    from hangdoc.fleet.coordinator import Fleet
    from hangdoc.fleet.node import LocalNode
    from hangdoc.model import RankProcess

    return Fleet(((LocalNode(), RankProcess(os.getpid(), "here", 0)),), 1)


def test_ranks_found_through_a_source_a_running_job_without_workers_is_not_gone() -> None:
    from hangdoc.watch.tracked import TrackedRanks

    said = Said()
    ranks = TrackedRanks([], "ray:raysubmit_x", 5.0, said)
    source = _Source(
        [
            _one_rank_fleet(),
            JobNotFound("Ray job 02 (status RUNNING) has no live actor", running=True),
            JobNotFound("Ray job 02 (status RUNNING) has no live actor", running=True),
            _one_rank_fleet(),
            JobNotFound("Ray job 02 (status SUCCEEDED) has no live actor"),
        ]
    )
    with source(lambda _text: None) as ranks.finder:
        assert len(ranks.find().placed) == 1
        assert ranks.refresh() is False and ranks.refresh() is False  # workers restarting
        assert [m for m in said if "still runs" in m[1]] == [
            (
                Level.INFO,
                (
                    "no rank process now, the job still runs: Ray job 02 (status RUNNING) has no live actor; "
                    "watching for its ranks"
                ),
            )
        ]  # said once, not at every search
        assert ranks.refresh() is False and ranks.absent is False  # back
        assert ranks.refresh() is True  # ended
    assert source.searches == ["ray:raysubmit_x"] * 5


def test_a_watch_holds_its_source_for_the_whole_watch_and_lets_it_go_on_error(tmp_path: Path) -> None:
    from hangdoc.watch.watchdog import WatchConfig, run_watch

    source = _Source([JobNotFound("Ray job raysubmit_x has no live actor")])
    config = WatchConfig(job="ray:raysubmit_x", out=tmp_path / "hangs", source=source)
    with pytest.raises(JobNotFound):
        run_watch(config, silent)
    assert (source.entered, source.exited) == (1, 1)


def test_a_stall_is_diagnosed_through_the_held_source(tmp_path: Path, monkeypatch) -> None:
    """The responder lends the watch's source to the diagnosis: no second set of agents."""
    from hangdoc.watch.stall import Signal
    from hangdoc.watch.watchdog import WatchConfig, Watchdog

    source = _Source([_one_rank_fleet()])
    dog = Watchdog(WatchConfig(job="ray:raysubmit_x", out=tmp_path / "hangs", source=source), silent)
    seen: list[object] = []

    def diagnose(spec, _options, _progress, nodes, lent):
        with lent(None) as find:
            seen.append((spec, nodes, find))
        raise JobNotFound("gone")

    monkeypatch.setattr("hangdoc.watch.respond.diagnose", diagnose)
    with source(None) as dog.ranks.finder:
        clock = dog.pace.clocks[Signal.STACKS]
        dog.loop.responder.on_stall(Signal.STACKS, clock, time.monotonic())
    assert seen == [("ray:raysubmit_x", None, source.find)]
    assert source.entered == 1  # the diagnosis borrowed it; it did not open another
