"""What the watch says and does so a user can trust it (issue 29): the line that starts a
watch and the lines when the stall timeout changes; the first-step rule that notices a job
hung before its warm-up is over (``still``); Ctrl-C on a wrapped job (the first passed on
and explained, the second a SIGKILL of the job's whole tree, sessions of their own included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.said import Said
from support.waiting import alive, until

from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.fleet.coordinator import find_ranks
from hangdoc.fleet.node import LocalNode
from hangdoc.watch.config import Level, WatchConfig
from hangdoc.watch.stall import Alarm, Signal, StallClock, StallPolicy, TimeoutNews, early_stall
from hangdoc.watch.still import STILL_CPU, STILL_IO, EarlyLook, Look, Stillness, moved
from hangdoc.watch.watchdog import Watchdog, WrappedRun

# ------------------------------------------------------------------ the words


def test_the_start_line_states_the_stall_rule() -> None:
    assert StallPolicy().words(Signal.OUTPUT) == (
        "no output for more than 3 x the longest gap between steps (at least 30 s); "
        "until 5 steps are seen: 600 s, or 120 s when every rank is also still"
    )
    assert StallPolicy(stall_after=5).words(Signal.STEP_LINE) == "no step line for more than 5 s (--stall-after)"
    assert StallPolicy(first_step_timeout=0, warmup_steps=1).words(Signal.HEARTBEAT) == (
        "no heartbeat for more than 3 x the longest gap between steps (at least 30 s); until 1 step is seen: 600 s"
    )


def test_a_wrapped_watch_starts_with_what_it_watches_the_rule_and_where_reports_go(tmp_path: Path) -> None:
    said = Said()
    config = WatchConfig(command=("true",), out=tmp_path / "hangs", policy=StallPolicy(stall_after=5))
    assert Watchdog(config, said).run() == 0
    assert said[0] == (
        Level.INFO,
        f"watching true (pid {said[0][1].split('pid ')[1].split(')')[0]}): a hang is no output for more than "
        f"5 s (--stall-after); reports go to {tmp_path / 'hangs'}/",
    )
    assert said[-1] == (Level.INFO, "command exited with status 0")


def test_the_timeout_is_said_when_warm_up_ends_and_when_it_grows_by_half() -> None:
    clock = StallClock(StallPolicy(warmup_steps=2, min_timeout=1.0), started=0.0)
    news = TimeoutNews()
    assert news.check(Signal.OUTPUT, clock) is None  # the start line said the rule
    clock.activity(1.0)
    assert news.check(Signal.OUTPUT, clock) is None  # still warming up: nothing new
    clock.activity(2.0)
    ended = news.check(Signal.OUTPUT, clock)  # warm-up over: the minimum, until a gap is learned
    assert ended is not None and ended.seconds == 1.0
    clock.activity(3.0)  # a gap of 1 s after warm-up: 3 s learned
    said = news.check(Signal.OUTPUT, clock)
    assert said is not None and said.seconds == 3.0 and "learned" in said.basis
    clock.activity(4.4)  # 1.4 s: 4.2 s, less than 1.5 x 3 s
    assert news.check(Signal.OUTPUT, clock) is None
    clock.activity(6.0)  # 1.6 s: 4.8 s, more than 1.5 x what was said (not the 4.2 s never said)
    assert (grown := news.check(Signal.OUTPUT, clock)) is not None and grown.seconds == pytest.approx(4.8)
    assert news.check(Signal.HEARTBEAT, StallClock(clock.policy, 6.0)) is not None  # another signal


# ------------------------------------------------------------ first-step rule


def test_a_rank_is_still_below_the_cpu_and_io_thresholds_and_moves_above() -> None:
    here = Look(position=(1, (("train.py", 10),)), cpu_seconds=5.0, io_bytes=1000)
    cpu = STILL_CPU * 10.0
    assert not moved(here, Look(here.position, 5.0 + cpu * 0.9, 1000), 10.0)
    assert moved(here, Look(here.position, 5.0 + cpu * 1.1, 1000), 10.0)
    assert not moved(here, Look(here.position, 5.0, 1000 + STILL_IO - 1), 10.0)
    assert moved(here, Look(here.position, 5.0, 1000 + STILL_IO), 10.0)
    assert moved(here, Look((1, (("train.py", 11),)), 5.0, 1000), 10.0)
    assert not moved(here, Look(None, None, None), 10.0)  # nothing read says nothing


def test_stillness_counts_from_the_last_move_of_any_rank() -> None:
    still = Stillness()
    a = Look((1, (("t.py", 1),)), 1.0, 0)
    still.observe(0.0, {("n", 1): a, ("n", 2): a})
    still.observe(10.0, {("n", 1): a, ("n", 2): a})
    assert still.still_for(25.0) == 25.0
    still.observe(30.0, {("n", 1): a, ("n", 2): Look(a.position, 2.0, 0)})  # rank 2 worked
    assert still.still_for(40.0) == 10.0
    still.observe(50.0, {("n", 1): a})  # a rank went away: start over
    assert still.still_for(60.0) == 10.0
    still.observe(70.0, {})  # no rank: nothing is known still
    assert still.still_for(80.0) == 0.0


def test_the_first_step_rule_fires_only_past_its_timeout_on_both_counts() -> None:
    assert not early_stall(silence=119.0, still_for=500.0, first_step_timeout=120.0)
    assert not early_stall(silence=500.0, still_for=119.0, first_step_timeout=120.0)
    assert early_stall(silence=121.0, still_for=121.0, first_step_timeout=120.0)
    assert not early_stall(silence=1e9, still_for=1e9, first_step_timeout=0.0)  # off


def test_the_alarm_uses_the_first_step_rule_only_during_warm_up() -> None:
    clock = StallClock(StallPolicy(warmup_steps=2), started=0.0)
    alarm = Alarm()
    assert not alarm.due_early(clock, 119.0, still_for=119.0)
    assert alarm.due_early(clock, 121.0, still_for=121.0)
    assert not alarm.due(clock, 121.0)  # the warm-up timeout (600 s) is far off
    clock.activity(1.0)
    clock.activity(2.0)  # warm-up over: the learned timeout rules
    assert not alarm.due_early(clock, 200.0, still_for=200.0)
    long_rule = StallClock(StallPolicy(first_step_timeout=700.0), started=0.0)
    assert not alarm.due_early(long_rule, 701.0, still_for=701.0)  # not shorter than the warm-up: off


RANK_ENV = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29991"}


@pytest.fixture
def rank() -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """A process with a rank's environment running ``code``, once it said it is ready."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(code: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-c", f"print('ready', flush=True)\n{code}"],
            stdout=subprocess.PIPE,
            env={**os.environ, **RANK_ENV},
        )
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.parametrize(("code", "still"), [("import time; time.sleep(60)", True), ("while True: pass", False)])
def test_early_look_finds_a_sleeping_rank_still_and_a_busy_one_moving(rank, code: str, still: bool) -> None:
    proc = rank(code)
    look = EarlyLook(lambda: find_ranks([LocalNode()], parse_job_spec(f"pid:{proc.pid}")), 5.0, 8.0)
    look.poll(time.monotonic())
    first = look.stillness.since
    assert look.ranks_seen == 1 and first is not None
    time.sleep(2.0)
    look.poll(time.monotonic())
    assert (look.stillness.since == first) is still


# ------------------------------------------------------------------ Ctrl-C

# a launcher that ignores SIGINT, with a worker in a session of its own (as torchrun's)
LAUNCHER = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    print(worker.pid, flush=True)
    time.sleep(60)
    """
)


def test_a_first_ctrl_c_is_passed_on_and_said_a_second_kills_the_whole_tree(tmp_path: Path) -> None:
    said = Said()
    dog = Watchdog(WatchConfig(command=(sys.executable, "-c", LAUNCHER), out=tmp_path), said)
    sup = dog.supervisor
    assert sup is not None
    run = WrappedRun(dog, sup)
    sup.signals.notify = run._signalled
    pids: list[int] = []
    try:
        with sup.signals.installed():
            child = sup.start(dict(os.environ), str(tmp_path))
            assert child.stdout is not None
            worker = int(child.stdout.readline())
            pids = [child.pid, worker]
            os.kill(os.getpid(), signal.SIGINT)
            assert until(lambda: len(said) == 1)
            assert said[0][0] is Level.STOP and said[0][1].startswith(
                f"stopping: SIGINT passed to the command (pid {child.pid}), which ends its job its own way"
            )
            assert said[0][1].endswith("signal again (Ctrl-C) to kill the whole job now")
            time.sleep(0.3)
            assert child.poll() is None and alive(worker)  # it ignores SIGINT
            os.kill(os.getpid(), signal.SIGINT)
            assert until(lambda: not alive(worker) and child.poll() is not None)
            assert until(lambda: len(said) == 2)
        assert sup.signals.stop_requested and sup.status() == 128 + signal.SIGKILL
        assert said[1] == (
            Level.STOP,
            f"killing the wrapped command (pid {child.pid}) and all its processes now (SIGKILL)",
        )
        assert dog.job.stop() == 128 + signal.SIGKILL and len(said) == 2  # the loop's turn: done already
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if sup.child is not None:
            sup.child.wait()
        sup.close_pipes()


def test_a_job_still_from_its_first_step_is_diagnosed_after_the_first_step_timeout(tmp_path: Path) -> None:
    """End to end through the CLI: a rank that prints once and sleeps is reported after
    ``--first-step-timeout 2``, not after the 600 s warm-up."""
    rank_code = "print('step 0', flush=True); import time; time.sleep(60)"
    argv = ["watch", "--first-step-timeout", "2", "--on-hang", "kill", "--kill-grace", "1", "--out", str(tmp_path)]
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "hangdoc", *argv, "--", sys.executable, "-c", rank_code],
        env={**os.environ, **RANK_ENV},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 124, done.stderr
    assert time.monotonic() - t0 < 60
    lines = done.stderr.splitlines()
    assert "until 5 steps are seen: 600 s, or 2 s when every rank is also still" in lines[0]
    assert "hangdoc watch: found 1 rank process of the job" in lines
    suspected = next(line for line in lines if "stall suspected" in line)
    assert "stall timeout 2.0 s (first-step rule: 1 of 5 warm-up steps seen, its one rank still for" in suspected
    assert any(line.startswith("hangdoc watch: HANG ") for line in lines)
