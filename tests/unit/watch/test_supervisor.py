"""The watchdog's parts one at a time, with real processes where they act on processes: the
wrapped command (start, signals passed on, grace then SIGKILL), the ``--on-hang exec``
commands (started, reaped, waited for), ending the job (``Job``), the stall timing
(``Alarm``), the loop's collection and the response to a stall. The end-to-end runs are in
``test_watch.py`` and ``test_watch_robust.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.harness import is_running
from support.said import Said, silent
from support.waiting import until

from hangdoc.errors import HangdocError, JobNotFound, UsageError
from hangdoc.watch.activity import Event
from hangdoc.watch.config import Level
from hangdoc.watch.hooks import Hooks
from hangdoc.watch.job import EXIT_HANG_KILLED, Job
from hangdoc.watch.stall import Alarm, Signal, StallClock, StallPolicy, resumed_at
from hangdoc.watch.supervisor import FORWARDED, Supervisor
from hangdoc.watch.tracked import TrackedRanks
from hangdoc.watch.watchdog import OnHang, WatchConfig, Watchdog

# a command that says when it is ready; IGNORE_TERM: it and its background sleep ignore SIGTERM
WAITS = "echo ready; exec sleep 60"
IGNORE_TERM = "trap '' TERM; sleep 60 & echo $!; wait"


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Callable[[str], tuple[Supervisor, str]]]:
    """Start ``sh -c SCRIPT`` under a ``Supervisor``; its first line of output comes back.
    Whatever is left is SIGKILLed at the end."""
    sups: list[Supervisor] = []

    def start(script: str) -> tuple[Supervisor, str]:
        sup = Supervisor(["sh", "-c", script])
        sups.append(sup)
        child = sup.start(dict(os.environ), str(tmp_path))
        assert child.stdout is not None
        return sup, child.stdout.readline().decode().strip()

    yield start
    for sup in sups:
        if sup.child is not None and sup.child.poll() is None:
            os.killpg(sup.child.pid, signal.SIGKILL)
            sup.child.wait()
        if sup.child is not None:  # its output pipes (a watch's tee closes them)
            for pipe in (sup.child.stdout, sup.child.stderr):
                if pipe is not None:
                    pipe.close()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A child of ours that is not the job's (as a hook command is)."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


# ----------------------------------------------------------------- supervisor


def test_the_command_runs_in_a_session_of_its_own_with_its_heartbeat_directory(started, tmp_path: Path) -> None:
    sup, line = started('echo "$PYTHONUNBUFFERED $HANGDOC_HEARTBEAT_DIR"; exit 3')
    assert line == f"1 {tmp_path}"
    assert sup.child is not None and os.getsid(sup.child.pid) == sup.child.pid
    assert until(sup.exited)
    assert sup.status() == 3


def test_a_command_that_cannot_start_is_command_not_found(tmp_path: Path) -> None:
    sup = Supervisor([str(tmp_path / "no-such-command")])
    with pytest.raises(HangdocError, match="cannot run") as caught:
        sup.start({}, str(tmp_path))
    assert caught.value.exit_code == 127
    assert sup.child is None and not sup.exited() and sup.status() is None


def test_end_gives_sigterm_its_grace_then_sigkills_every_session(started, sleeper) -> None:
    sup, line = started(IGNORE_TERM)
    worker = int(line)
    t0 = time.monotonic()
    left = sup.end(grace=0.5, spare=[sleeper.pid])
    took = time.monotonic() - t0
    assert left == []
    assert 0.5 <= took < 10, took  # the whole grace, then SIGKILL
    assert sup.status() == 128 + signal.SIGKILL
    assert not is_running(worker)
    assert sleeper.poll() is None, "a spared process (a hook command) was signalled"


def test_end_is_quick_when_the_command_obeys_sigterm(started) -> None:
    sup, line = started(WAITS)
    assert line == "ready"
    t0 = time.monotonic()
    assert sup.end(grace=5.0) == []
    assert time.monotonic() - t0 < 4
    assert sup.status() == 128 + signal.SIGTERM


def test_kill_is_the_way_out_that_cannot_fail(started) -> None:
    sup, _ = started(IGNORE_TERM)
    sup.kill()
    assert sup.status() == 128 + signal.SIGKILL
    sup.kill()  # collected already: nothing to do


def test_the_first_signal_goes_to_the_command_a_second_asks_to_end_the_job(started) -> None:
    sup, _ = started(WAITS)
    sup.signals.forward(signal.SIGTERM, None)
    assert not sup.signals.stop_requested
    assert until(sup.exited)
    assert sup.status() == 128 + signal.SIGTERM
    sup.signals.forward(signal.SIGTERM, None)
    assert sup.signals.stop_requested and sup.signals.seen == 2


def test_a_signal_before_the_command_started_asks_to_end_the_job() -> None:
    sup = Supervisor(["true"])
    sup.signals.forward(signal.SIGINT, None)
    assert sup.signals.stop_requested


def test_signals_are_forwarded_only_while_installed(started) -> None:
    before = {s: signal.getsignal(s) for s in FORWARDED}
    sup, _ = started(WAITS)
    with sup.signals.installed():
        assert all(signal.getsignal(s) == sup.signals.forward for s in FORWARDED)
        os.kill(os.getpid(), signal.SIGHUP)  # to us: passed on to the command
        assert until(sup.exited)
    assert {s: signal.getsignal(s) for s in FORWARDED} == before
    assert sup.signals.seen == 1 and sup.status() == 128 + signal.SIGHUP


# ---------------------------------------------------------------------- hooks


def test_a_hook_gets_the_report_and_a_failure_is_said_when_it_is_reaped(tmp_path: Path) -> None:
    out, hang = tmp_path / "out.txt", tmp_path / "hang-1"
    said = Said()
    script = 'echo "$1|$HANGDOC_HANG_DIR|$HANGDOC_REPORT" > "$0"; exit 3'
    hooks = Hooks(["sh", "-c", script, str(out), "{report}"], dict(os.environ), said)
    hooks.start(hang, "pid:1")
    assert said == [(Level.INFO, f"ran --on-hang exec: sh -c '{script}' {out} {hang}")]
    assert len(hooks.pids()) == 1
    assert until(lambda: (hooks.reap(), not hooks.running)[1])
    assert said[1:] == [(Level.WARNING, "--on-hang exec command exited with status 3")]
    assert out.read_text() == f"{hang}|{hang}|{hang}/report.json\n"


def test_without_report_in_its_arguments_the_directory_is_appended(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    hooks = Hooks(["sh", "-c", 'echo "$1" > "$0"', str(out)], dict(os.environ), silent)
    hooks.start(tmp_path / "hang-1", "pid:1")
    hooks.end()
    assert out.read_text() == f"{tmp_path / 'hang-1'}\n"
    hooks.reap()
    assert hooks.running == []  # exit status 0: nothing said


def test_job_in_a_hook_is_the_scheduler_job_id(tmp_path: Path) -> None:
    """``ray job stop {job}``: the Ray job id, not the ``ray:`` spec; also in HANGDOC_JOB."""
    out = tmp_path / "out.txt"
    hooks = Hooks(["sh", "-c", 'echo "$# $1 $HANGDOC_JOB" > "$0"', str(out), "stop={job}"], dict(os.environ), silent)
    hooks.start(tmp_path / "hang-1", "raysubmit_Ab12")
    hooks.end()
    # no directory appended: `ray job stop {job}` takes one argument
    assert out.read_text() == "1 stop=raysubmit_Ab12 raysubmit_Ab12\n"


def test_end_waits_for_hooks_then_leaves_them_alone(tmp_path: Path) -> None:
    said = Said()
    hooks = Hooks(["sh", "-c", "sleep 60"], dict(os.environ), said)  # the directory: $0
    hooks.start(tmp_path, "pid:1")
    try:
        t0 = time.monotonic()
        hooks.end(timeout=0.3)
        assert 0.1 <= time.monotonic() - t0 < 5
        (pid,) = hooks.pids()
        assert said[-1] == (Level.INFO, f"--on-hang exec command (pid {pid}) still running; left alone")
        assert is_running(pid)
    finally:
        for hook in hooks.running:
            hook.kill()
            hook.wait()


def test_a_hook_that_cannot_run_is_one_line(tmp_path: Path) -> None:
    said = Said()
    missing = str(tmp_path / "no-such-pager")
    hooks = Hooks([missing], dict(os.environ), said)
    hooks.start(tmp_path, "pid:1")
    assert said == [
        (Level.ERROR, f"could not run the --on-hang exec command {missing!r}: No such file or directory; keeping watch")
    ]
    assert hooks.running == []


# ------------------------------------------------------------------------ job


def _job(sup: Supervisor | None, said: Said, spec: str | None = None) -> Job:
    return Job(spec, sup, None, Hooks((), {}, said), 0.5, said)


def test_the_job_is_named_by_its_spec_or_the_command_s_pid(started) -> None:
    sup, _ = started(WAITS)
    assert _job(sup, Said()).spec == f"pid:{sup.pid}"
    assert _job(sup, Said(), "10.0.0.1:29500").spec == "10.0.0.1:29500"


def test_on_hang_kill_ends_the_wrapped_command(started) -> None:
    said = Said()
    sup, _ = started(IGNORE_TERM)
    assert _job(sup, said).on_hang(OnHang("kill"), None) == EXIT_HANG_KILLED
    assert said == [(Level.INFO, "--on-hang kill: ending the job (1 process tree), grace 0.5 s")]
    assert sup.status() == 128 + signal.SIGKILL


def test_on_hang_report_and_exec_without_a_directory_keep_watching() -> None:
    said = Said()
    job = _job(None, said, "pid:1")
    assert job.on_hang(OnHang("report"), None) is None
    assert job.on_hang(OnHang("exec", ("true",)), None) is None
    assert said == [
        (Level.INFO, "keeping watch (--on-hang report); the job is left as it is"),
        (Level.ERROR, "could not run the --on-hang exec command: no directory could take the report"),
    ]


def test_a_second_signal_kills_the_job_at_once(started) -> None:
    said = Said()
    sup, line = started(IGNORE_TERM)
    job = _job(sup, said)
    t0 = time.monotonic()
    assert job.stop() == 128 + signal.SIGKILL
    assert time.monotonic() - t0 < 3.0  # no SIGTERM grace: SIGKILL at once
    assert not is_running(int(line))
    assert said == [(Level.STOP, f"killing the wrapped command (pid {sup.pid}) and all its processes now (SIGKILL)")]
    assert job.stop() == 128 + signal.SIGKILL and len(said) == 1  # done already: nothing said again


@pytest.mark.parametrize(
    ("err", "cause"),
    [
        (RuntimeError("a bug"), "internal error"),
        (KeyboardInterrupt(), "interrupted"),
        (UsageError("bad"), "stopping on an error"),
    ],
)
def test_abandon_ends_the_wrapped_job(err: BaseException, cause: str, started) -> None:
    said = Said()
    sup, line = started(IGNORE_TERM)
    _job(sup, said).abandon(err)
    assert said == [(Level.STOP, f"{cause}: ending the wrapped command (pid {sup.pid}) and all its processes")]
    assert sup.status() == 128 + signal.SIGKILL and not is_running(int(line))


def test_abandon_still_kills_the_command_s_group_when_ending_it_fails(started, monkeypatch) -> None:
    sup, _ = started(WAITS)

    def broken(*_args: object, **_kwargs: object) -> list[int]:
        raise RuntimeError("psutil broke")

    monkeypatch.setattr(sup, "end", broken)
    _job(sup, Said()).abandon(RuntimeError("a bug"))  # no exception: the way out must not fail
    assert sup.status() == 128 + signal.SIGKILL


def test_abandon_before_the_command_started_does_nothing() -> None:
    said = Said()
    _job(Supervisor(["true"]), said).abandon(RuntimeError("a bug"))
    _job(None, said, "pid:1").abandon(RuntimeError("a bug"))
    assert said == []


# ---------------------------------------------------------------- stall timing


def test_the_alarm_is_due_after_a_full_timeout_of_silence() -> None:
    clock = StallClock(StallPolicy(stall_after=3.0), started=0.0)
    alarm = Alarm()
    clock.activity(10.0)
    assert not alarm.due(clock, 12.9) and alarm.due(clock, 13.1)
    assert alarm.next_check(clock, 11.0, wake=12.0) == 12.0  # the regular check comes first
    assert alarm.next_check(clock, 12.5, wake=13.5) == pytest.approx(13.02)  # right at the timeout
    alarm.fire()
    assert not alarm.due(clock, 100.0)  # not while a reported hang lasts
    assert alarm.next_check(clock, 12.5, wake=13.5) == 13.5


def test_after_steps_resumed_during_a_diagnosis_the_next_stall_is_timed_from_them() -> None:
    clock = StallClock(StallPolicy(stall_after=3.0), started=0.0)
    alarm = Alarm()
    clock.activity(10.0)
    suspected = 13.1
    assert resumed_at(clock, suspected) is None
    clock.activity(14.0)  # steps came back while the diagnosis ran (until 17.5, say)
    alarm.dismiss(resumed_at(clock, suspected))
    assert alarm.moving_at == 14.0
    assert alarm.due(clock, 17.1)  # 3 s after the resumed steps, not 3 s after the diagnosis
    alarm.postponed = 2
    alarm.dismiss()
    assert alarm.postponed == 0 and alarm.moving_at == pytest.approx(time.monotonic(), abs=1.0)


def test_a_postponement_waits_one_more_timeout_and_is_counted() -> None:
    clock = StallClock(StallPolicy(stall_after=3.0), started=0.0)
    alarm = Alarm()
    alarm.postpone()
    now = time.monotonic()
    assert alarm.postponed == 1 and not alarm.due(clock, now)
    assert alarm.due(clock, now + 3.5)
    alarm.fire()
    assert alarm.postponed == 0 and alarm.raised is not None


# --------------------------------------------------------- loop and response


def _dog(tmp_path: Path, said: Said) -> Watchdog:
    config = WatchConfig(command=("true",), job="pid:1", out=tmp_path / "hangs", policy=StallPolicy(stall_after=3.0))
    return Watchdog(config, said)


def test_activity_after_a_report_ends_the_hang_and_restarts_postponements(tmp_path: Path) -> None:
    said = Said()
    dog = _dog(tmp_path, said)
    dog.loop.alarm.raised, dog.loop.alarm.postponed = 5.0, 2
    dog.board.update(stalled=True)
    dog.pace.queue.put(Event(7.5, Signal.OUTPUT))
    dog.loop.collect()
    assert said == [(Level.INFO, "activity again (output) 2.5 s after the report: watching for the next stall")]
    assert dog.loop.alarm.raised is None and dog.loop.alarm.postponed == 0
    assert not dog.board.value.stalled


def test_steps_during_a_failed_diagnosis_dismiss_the_stall(tmp_path: Path, monkeypatch) -> None:
    said = Said()
    dog = _dog(tmp_path, said)
    clock = dog.pace.clocks[Signal.OUTPUT]
    now = time.monotonic()
    clock.activity(now - 4.0)

    def diagnose(*_args: object) -> None:
        dog.pace.queue.put(Event(now + 0.5, Signal.OUTPUT))  # the job printed meanwhile
        raise JobNotFound("no rank process")

    monkeypatch.setattr("hangdoc.watch.respond.diagnose", diagnose)
    assert dog.loop.responder.on_stall(Signal.OUTPUT, clock, now) is None
    level, line = said[0]
    assert level is Level.INFO
    assert line.startswith("stall suspected: no output for 4.0 s; stall timeout 3.0 s (warm-up")
    assert line.endswith("; diagnosing pid:1")
    assert said[1:] == [(Level.INFO, "not a hang: steps resumed during the diagnosis")]
    assert dog.loop.alarm.moving_at == now + 0.5
    assert dog.board.value.dismissed_total == 1 and dog.board.value.diagnoses == {"failed": 1}
    assert not (tmp_path / "hangs").exists()


def test_a_silence_that_cannot_be_diagnosed_fires_unknown(tmp_path: Path, monkeypatch) -> None:
    said = Said()
    dog = _dog(tmp_path, said)
    clock = dog.pace.clocks[Signal.OUTPUT]
    now = time.monotonic()
    clock.activity(now - 4.0)

    def diagnose(*_args: object) -> None:
        raise JobNotFound("no rank process")

    monkeypatch.setattr("hangdoc.watch.respond.diagnose", diagnose)
    assert dog.loop.responder.on_stall(Signal.OUTPUT, clock, now) is None
    (hang,) = (tmp_path / "hangs").iterdir()
    assert said[1:] == [
        (Level.ERROR, "could not diagnose: no rank process"),
        (Level.HANG, "HANG unknown: could not diagnose: no rank process"),
        (Level.HANG, f"report: {hang}/report.txt (json: {hang}/report.json)"),
        (Level.INFO, "keeping watch (--on-hang report); the job is left as it is"),
    ]
    assert dog.loop.alarm.raised is not None and dog.board.value.stalled
    assert dog.board.value.reports_total == 1


# ---------------------------------------------------------------------- ranks


class _Nowhere:
    name = "a"

    def find_ranks(self, spec: object) -> None:
        raise JobNotFound("nothing on a")


def test_ranks_are_looked_for_again_when_due_or_all_gone() -> None:
    ranks = TrackedRanks([_Nowhere()], "10.0.0.1:29500", 5.0, silent)  # type: ignore[list-item]
    ranks.checked = time.monotonic()
    assert not ranks.gone()  # not due: no search
    ranks.sampler = SimpleNamespace(all_gone=True)  # type: ignore[assignment]
    assert ranks.gone()  # every rank's stack gone: searched at once, none found
    ranks.sampler = None
    ranks.checked = time.monotonic() - 10.5
    assert ranks.gone() and time.monotonic() - ranks.checked < 1


def test_ranks_gone_while_the_launcher_exits_is_the_job_ending(tmp_path: Path, monkeypatch) -> None:
    # the workers have exited and torchrun is on its way out when the stall is diagnosed:
    # "no rank" is the job ending, not a hang, once the launcher exits within the grace
    import subprocess
    import sys

    said = Said()
    dog = _dog(tmp_path, said)
    clock = dog.pace.clocks[Signal.OUTPUT]
    now = time.monotonic()
    clock.activity(now - 4.0)
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    monkeypatch.setattr(dog.job.supervisor, "child", launcher)
    dog.loop.responder.ranks_seen = True  # an earlier stall's diagnosis found the ranks

    def diagnose(*_args: object) -> None:
        raise JobNotFound("pid 7 and its 0 descendants matched 1 processes but none is a rank")

    monkeypatch.setattr("hangdoc.watch.respond.diagnose", diagnose)
    try:
        assert dog.loop.responder.on_stall(Signal.OUTPUT, clock, now) is None
    finally:
        launcher.kill()
        launcher.wait()
    assert said[1:] == [(Level.INFO, "not a hang: the job ended during the diagnosis")]
    assert not (tmp_path / "hangs").exists()
