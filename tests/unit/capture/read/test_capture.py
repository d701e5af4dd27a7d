"""Capture: py-spy JSON parsing (recorded fixtures), failure kinds, process state, and
sampling real processes: a gloo job blocked in a collective, ``sleep``, a process that
exits mid-capture, a stopped process, py-spy without ptrace rights.

Fixtures in ``tests/data/`` were recorded with ``py-spy dump --json`` from
``tests/data/gloo_hang.py`` (rank 0 in all_reduce with a DataLoader feeder thread; rank 1
in barrier, ``--native``) and from a rank blocked in ``dist.recv(src=1, tag=7)``
(``--locals``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from support.paths import REPO, TESTS
from support.stacks import C10D, main_thread
from support.waiting import until

from hangdoc.capture.read import pyspy
from hangdoc.capture.read.procstate import parse_ss, read_state, socket_bytes, socket_bytes_many
from hangdoc.capture.read.pyspy import (
    DEFAULT_GROUP,
    clean_message,
    dump,
    find_pyspy,
    parse_dump,
    source_line,
)
from hangdoc.capture.read.sample import sample_round
from hangdoc.errors import PySpyMissing
from hangdoc.model import CaptureErrorKind, Frame, FrameLocals, ProcessState, RankProcess
from hangdoc.pipeline import CaptureOptions, diagnose

DATA = TESTS / "data"


def fixture(name: str) -> str:
    return (DATA / name).read_text()


# ------------------------------------------------------------------ parsing recorded dumps


def test_parse_dump_orders_frames_outermost_first() -> None:
    threads = parse_dump(fixture("pyspy_rank0_allreduce.json"))
    assert [t.name for t in threads] == ["QueueFeederThread", "MainThread"]
    main = main_thread(threads)
    assert (main.thread_id, main.native_id, main.active, main.owns_gil) == (140138407709568, 10805, False, False)
    assert [f.function for f in main.frames] == [
        "<module>",
        "main",
        "run",
        "_exception_logger.<locals>.wrapper",
        "all_reduce",
    ]
    assert main.innermost == main.frames[-1]
    assert main.innermost.short_filename == C10D
    assert main.innermost.line == 3252
    assert not any(f.native for f in main.frames)
    feeder = threads[0]
    assert (feeder.frames[0].function, feeder.innermost.function) == ("Thread._bootstrap", "Condition.wait")
    assert all(t.locals == () for t in threads)  # dumped without --locals


def test_parse_dump_marks_native_frames() -> None:
    (main,) = parse_dump(fixture("pyspy_rank1_barrier_native.json"))
    functions = [f.function for f in main.frames]
    assert functions[0] == "0x7fbf65a4524a"  # libc's start, outermost
    assert functions[-2:] == ["pthread_cond_wait", "0x7fbf65aa3f16"]
    assert "c10d::Work::wait" in functions
    native = [f for f in main.frames if f.native]
    assert len(native) == 7
    assert all(f.line is None and f.code is None for f in native)
    assert {f.short_filename for f in native} >= {"libc.so.6", "torch/lib/libtorch_cpu.so"}
    python = [f for f in main.frames if not f.native]
    assert [f.function for f in python][-1] == "barrier"
    assert all(f.line for f in python)
    # the Python frames sit between libc's entry and the native wait, in call order
    assert functions.index("barrier") < functions.index("c10d::Work::wait")


def test_parse_dump_keeps_selected_locals_by_frame_index() -> None:
    main = main_thread(parse_dump(fixture("pyspy_recv_locals.json")))
    assert main.innermost.function == "recv"
    recv_index = len(main.frames) - 1
    # the tensor and the Work handle are dropped; the wrapper says no group was given
    assert main.locals == (
        FrameLocals(recv_index - 1, (("group", DEFAULT_GROUP),)),
        FrameLocals(recv_index, (("src", "1"), ("group", "None"), ("tag", "7"), ("group_src", "None"))),
    )
    assert main.locals_at(recv_index).get("src") == "1"
    assert main.locals_at(0) is None


@pytest.mark.parametrize(
    ("name", "call_group", "kept"),
    [
        # real dumps of one hung 4-rank gloo job (py-spy 0.4.3 --locals, torch 2.13)
        (
            "pyspy_locals_subgroup_allreduce.json",
            "<ProcessGroup>",
            (("group", "<ProcessGroup>"), ("async_op", "False")),
        ),
        ("pyspy_locals_world_allreduce.json", DEFAULT_GROUP, (("group", "<ProcessGroup>"), ("async_op", "False"))),
        (
            "pyspy_locals_send_world.json",
            DEFAULT_GROUP,
            (("dst", "2"), ("group", "<ProcessGroup>"), ("tag", "0"), ("group_dst", "2")),
        ),
    ],
)
def test_parse_dump_tells_a_given_group_from_the_default_one(name: str, call_group: str, kept: tuple) -> None:
    # c10d replaces group=None with the default group before it blocks: only the call
    # wrapper's args/kwargs still say whether the caller passed a group
    main = main_thread(parse_dump(fixture(name)))
    inner = len(main.frames) - 1
    assert main.locals_at(inner - 1).values == (("group", call_group),)
    assert main.locals_at(inner).values == kept


def _one_frame_dump(filename: str, variables: list[dict]) -> str:
    return json.dumps(
        [
            {
                "pid": 9,
                "thread_id": 1,
                "thread_name": "MainThread",
                "os_thread_id": 9,
                "active": False,
                "owns_gil": False,
                "frames": [{"name": "f", "filename": filename, "module": None, "line": 3, "locals": variables}],
            }
        ]
    )


_C10D_PATH = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


@pytest.mark.parametrize(
    ("filename", "variables", "kept"),
    [
        # a user's frame: nothing is kept, whatever its names
        (
            "/home/u/train.py",
            [{"name": "src", "repr": '"s3://bucket/key?token=abc"'}, {"name": "rank", "repr": "3"}],
            (),
        ),
        # a c10d frame: strings, floats and containers are dropped, numbers and types kept
        (
            _C10D_PATH,
            [
                {"name": "src", "repr": '"/secret/path"'},
                {"name": "tag", "repr": "[1, 2]"},
                {"name": "world_size", "repr": "4"},
                {"name": "rank", "repr": "-1"},
                {"name": "group", "repr": "<torch._C._distributed_c10d.ProcessGroup at 0x7f00>"},
                {"name": "group_name", "repr": '"tp:1"'},
                {"name": "store", "repr": "<TCPStore at 0x1>"},
            ],
            (("world_size", "4"), ("rank", "-1"), ("group", "<ProcessGroup>"), ("group_name", "tp:1")),
        ),
        (_C10D_PATH, [{"name": "group_name", "repr": '"has space"'}], ()),
    ],
)
def test_parse_dump_keeps_only_clean_values_of_torch_distributed_frames(
    filename: str, variables: list[dict], kept: tuple
) -> None:
    (thread,) = parse_dump(_one_frame_dump(filename, variables))
    assert (thread.locals[0].values if thread.locals else ()) == kept


def test_parse_dump_names_the_main_thread_when_threading_was_never_imported() -> None:
    raw = [
        {
            "pid": 77,
            "thread_id": 1,
            "thread_name": None,
            "os_thread_id": 77,
            "active": True,
            "owns_gil": True,
            "frames": [{"name": "f", "filename": "/nonexistent/x.py", "module": None, "line": 3, "locals": None}],
        },
        {
            "pid": 77,
            "thread_id": 2,
            "thread_name": None,
            "os_thread_id": 78,
            "active": False,
            "owns_gil": False,
            "frames": [],
        },
    ]
    threads = parse_dump(json.dumps(raw))
    assert [t.name for t in threads] == ["MainThread", None]
    assert threads[0].frames == (Frame("f", "/nonexistent/x.py", 3, False, None),)
    assert (threads[0].active, threads[0].owns_gil) == (True, True)


@pytest.mark.parametrize("text", ["", "not json", "{}", '{"threads": []}'])
def test_parse_dump_rejects_other_text(text: str) -> None:
    with pytest.raises(ValueError):
        parse_dump(text)


def test_source_lines_follow_file_changes(tmp_path: Path) -> None:
    src = tmp_path / "train.py"
    src.write_text("import os\n    loss = step()  \n")
    raw = json.dumps(
        [
            {
                "thread_id": 1,
                "thread_name": "MainThread",
                "os_thread_id": 1,
                "frames": [{"name": "f", "filename": str(src), "module": None, "line": 2, "locals": None}],
            }
        ]
    )
    assert parse_dump(raw)[0].frames[0].code == "loss = step()"
    src.write_text("import os\n    dist.barrier()  # changed, longer\n")
    assert parse_dump(raw)[0].frames[0].code == "dist.barrier()  # changed, longer"
    assert source_line(str(src), 99) is None
    assert source_line("relative.py", 1) is None
    assert source_line(str(src), None) is None


def test_clean_message_drops_the_backtrace() -> None:
    stderr = (
        "Error: Failed to get process executable name. Check that the process is "
        "running.\n\nCaused by:\n    0: No such file or directory (os error 2)\n"
        "    1: No such file or directory (os error 2)\n\nStack backtrace:\n"
        "   0: anyhow::error\n   1: py_spy::main\n"
    )
    assert clean_message(stderr) == (
        "Failed to get process executable name. Check that the "
        "process is running.; 0: No such file or directory "
        "(os error 2); 1: No such file or directory (os error 2)"
    )


@pytest.mark.timeout(60)
def test_classify_failure_by_process_and_message() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    sleeper = subprocess.Popen(["sleep", "100"])
    me = os.getpid()  # a Python process
    no_version = "Error: Failed to find python version from target process\n"
    try:
        cases = [
            (gone.pid, "Error: Permission denied (os error 13)", CaptureErrorKind.PROCESS_GONE),
            (me, "Permission Denied: Try running again with elevated permissions", CaptureErrorKind.PTRACE_DENIED),
            (
                me,
                ("Error: Failed to get stack traces\n\nCaused by:\n    0: Operation not permitted (os error 1)"),
                CaptureErrorKind.PTRACE_DENIED,
            ),
            (sleeper.pid, no_version, CaptureErrorKind.NOT_PYTHON),
            (sleeper.pid, "Error: Bad address (os error 14)", CaptureErrorKind.NOT_PYTHON),
            (me, no_version, CaptureErrorKind.PYSPY_FAILED),  # Python, interpreter not found
            (me, "Error: something new", CaptureErrorKind.PYSPY_FAILED),
        ]
        kinds = [pyspy.classify_failure(pid, 1, stderr).kind for pid, stderr, _ in cases]
        hint = pyspy.classify_failure(me, 1, no_version).message
    finally:
        sleeper.kill()
        sleeper.wait()
    assert kinds == [kind for _, _, kind in cases]
    assert "still starting" in hint
    assert pyspy.classify_failure(me, 3, "Error: something new").message == "exit code 3: something new"


# ------------------------------------------------------------------ finding py-spy


def test_find_pyspy_prefers_the_one_next_to_the_interpreter() -> None:
    assert find_pyspy() == str(Path(sys.executable).parent / "py-spy")


@pytest.mark.timeout(60)
def test_find_pyspy_from_a_venv_that_is_not_activated(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", "from hangdoc.capture.read.pyspy import find_pyspy; print(find_pyspy())"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == str(Path(sys.executable).parent / "py-spy")


def test_find_pyspy_missing_raises_with_the_places_searched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))
    monkeypatch.setattr(pyspy.sysconfig, "get_path", lambda *a: str(tmp_path / "scripts"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(PySpyMissing) as info:
        find_pyspy()
    assert str(info.value) == (
        f"py-spy not found in {tmp_path}/bin, {tmp_path}/prefix/bin, {tmp_path}/scripts or on PATH"
    )
    procs = [RankProcess(pid=os.getpid(), host="h", rank=0)]
    (sample,) = sample_round(procs, 0.0)
    assert sample.error is not None and sample.error.kind is CaptureErrorKind.PYSPY_MISSING
    assert sample.state is not None  # the counters are still read


# ------------------------------------------------------------------ real processes


@contextmanager
def python_sleeper(seconds: float = 60) -> Iterator[subprocess.Popen[str]]:
    """A Python process that has finished starting (it said so) and then sleeps."""
    code = f"import time; print('ready', flush=True); time.sleep({seconds})"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def as_rank(pid: int, rank: int | None = None) -> RankProcess:
    return RankProcess(pid=pid, host="localhost", rank=rank)


@pytest.mark.timeout(60)
def test_non_python_process_is_not_python() -> None:
    sleeper = subprocess.Popen(["sleep", "100"])
    try:
        # asleep before it is looked at: on busy cores a new process may still be running
        # its start-up when sampled (seen in CI: status "running", 3 context switches)
        assert until(lambda: psutil.Process(sleeper.pid).status() == psutil.STATUS_SLEEPING)
        result = dump(sleeper.pid)
        (sample,) = sample_round([as_rank(sleeper.pid)], 1.5)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert result.threads == ()
    assert result.error is not None and result.error.kind is CaptureErrorKind.NOT_PYTHON
    assert "python" in result.error.message.lower()
    assert sample.t == 1.5
    assert sample.error is not None and sample.error.kind is CaptureErrorKind.NOT_PYTHON
    assert isinstance(sample.state, ProcessState) and sample.state.status == "sleeping"


@pytest.mark.timeout(60)
def test_pid_that_exited_is_process_gone() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    result = dump(child.pid)
    assert result.error is not None and result.error.kind is CaptureErrorKind.PROCESS_GONE
    state = read_state(child.pid)
    assert not isinstance(state, ProcessState) and state.kind is CaptureErrorKind.PROCESS_GONE


@pytest.mark.timeout(60)
def test_process_exiting_mid_capture_is_sampled_until_gone() -> None:
    code = "import time; print('ready', flush=True); time.sleep(1.5)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    options = CaptureOptions(window=10.0, interval=0.5, max_window=10.0)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        snapshot, _ = diagnose(f"pid:{proc.pid}", options)  # the whole capture, as the CLI runs it
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    (snap,) = snapshot.ranks
    assert snap.process.pid == proc.pid
    first, *rest = snap.samples
    assert first.error is None and main_thread(first.threads).innermost is not None
    assert main_thread(first.threads).innermost.function == "<module>"
    assert rest, "the process should have been sampled until it was gone"
    last = rest[-1]
    assert last.error is not None and last.error.kind is CaptureErrorKind.PROCESS_GONE
    assert all(s.error is None for s in snap.samples[:-1])
    # not sampled again once gone: the capture ends there, long before its window
    assert snapshot.window_seconds < options.window
    assert any(n.words().startswith("every rank process exited during the window") for n in snapshot.notes)
    # rounds start `interval` apart from the first
    assert all(s.t >= i * options.interval - 0.01 for i, s in enumerate(snap.samples))


@pytest.mark.timeout(60)
def test_stopped_process_is_read_without_pausing_it() -> None:
    with python_sleeper() as proc:
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 10
            while psutil.Process(proc.pid).status() != "stopped" and time.monotonic() < deadline:
                time.sleep(0.01)
            (sample,) = sample_round([as_rank(proc.pid)], 0.0)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
    assert sample.state is not None and sample.state.status == "stopped"
    assert sample.error is None
    assert main_thread(sample.threads).innermost is not None


def tracer_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("TracerPid:"):
            return int(line.split()[1])
    return 0


@pytest.mark.timeout(60)
def test_process_held_by_another_tracer_is_read_without_pausing_it() -> None:
    if shutil.which("strace") is None:
        pytest.skip("needs strace to hold the process")
    with python_sleeper() as proc:
        tracer = subprocess.Popen(["strace", "-p", str(proc.pid), "-o", "/dev/null"], stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while tracer_of(proc.pid) != tracer.pid and time.monotonic() < deadline:
                time.sleep(0.01)
            assert tracer_of(proc.pid) == tracer.pid
            result = dump(proc.pid)  # blocking mode cannot attach; retried non-blocking
        finally:
            tracer.kill()
            tracer.wait()
    assert result.error is None
    assert main_thread(result.threads).innermost is not None


@pytest.mark.timeout(60)
def test_pyspy_without_ptrace_rights_is_ptrace_denied(tmp_path: Path) -> None:
    if os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists():
        pytest.skip("needs root and setpriv to run py-spy as another user")
    wrapper = tmp_path / "py-spy-as-nobody"
    wrapper.write_text(
        f'#!/bin/sh\nexec /usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups {find_pyspy()} "$@"\n'
    )
    wrapper.chmod(0o755)
    with python_sleeper() as proc:
        result = dump(proc.pid, pyspy=str(wrapper))
    assert result.error is not None and result.error.kind is CaptureErrorKind.PTRACE_DENIED
    assert "Permission Denied" in result.error.message


def test_parse_ss_sums_received_and_acked_bytes_per_owner() -> None:
    text = (
        'ESTAB 0 0 127.0.0.1:40830 127.0.0.1:42517 users:(("python",pid=41,fd=20),'
        '("python",pid=42,fd=20))\n'
        "\t bbr wscale:10,10 bytes_sent:1000 bytes_retrans:4 bytes_acked:900 "
        "bytes_received:300 segs_out:2\n"
        "ESTAB 0 0 [::ffff:127.0.0.1]:39028 [::ffff:127.0.0.1]:29612 "
        'users:(("python",pid=41,fd=13))\n'
        "\t cubic bytes_acked:5 bytes_received:7\n"
        'LISTEN 0 0 0.0.0.0:29612 0.0.0.0:* users:(("python",pid=43,fd=3))\n'
        "\t cubic rto:200\n"
    )
    assert parse_ss(text) == {41: 1212, 42: 1200, 43: 0}


@pytest.mark.timeout(60)
def test_socket_bytes_of_a_process_without_sockets_is_zero() -> None:
    with python_sleeper() as proc:
        assert socket_bytes(proc.pid) == 0
    assert socket_bytes_many([proc.pid]) == {proc.pid: None}  # gone: namespace unreadable


def test_a_round_never_runs_more_py_spy_processes_than_its_slots(monkeypatch) -> None:
    import threading

    from hangdoc.capture.read import sample as capture_module

    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(5)]
    running, peak = 0, 0
    real_start = capture_module._start

    def counting_start(*args, **kwargs):
        nonlocal running, peak
        handle = real_start(*args, **kwargs)
        running += 1
        peak = max(peak, running)
        real_result = handle.result

        def result():
            nonlocal running
            out = real_result()
            running -= 1
            return out

        handle.result = result
        return handle

    monkeypatch.setattr(capture_module, "_slots", threading.BoundedSemaphore(2))
    monkeypatch.setattr(capture_module, "_start", counting_start)
    try:
        time.sleep(0.5)
        procs = [RankProcess(pid=p.pid, host="h", rank=i) for i, p in enumerate(sleepers)]
        samples = sample_round(procs, 0.0, timeout=10)
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
    assert peak == 2
    assert all(s.error is None and s.threads for s in samples)


# ------------------------------------------------------------------ per-thread counters


def test_thread_counters_tell_a_busy_side_thread_from_the_waiting_main_thread() -> None:
    import threading

    stop = threading.Event()
    native: list[int] = []

    def spin() -> None:
        native.append(threading.get_native_id())
        while not stop.is_set():
            sum(range(1000))

    side = threading.Thread(target=spin, daemon=True)
    side.start()
    try:
        while not native:
            time.sleep(0.01)
        before = read_state(os.getpid())
        assert isinstance(before, ProcessState)
        side_before = before.thread(native[0])
        deadline = time.monotonic() + 5.0  # a loaded machine gives the spinning thread less
        while True:
            time.sleep(0.3)  # the main thread sleeps; the side thread spins
            after = read_state(os.getpid())
            assert isinstance(after, ProcessState)
            side_after = after.thread(native[0])
            assert side_before is not None and side_after is not None
            if side_after.cpu_seconds - side_before.cpu_seconds >= 0.2 or time.monotonic() > deadline:
                break
    finally:
        stop.set()
        side.join()
    main_before, main_after = before.thread(os.getpid()), after.thread(os.getpid())
    assert main_before is not None and main_after is not None
    side_cpu = side_after.cpu_seconds - side_before.cpu_seconds
    assert side_cpu >= 0.2
    assert main_after.cpu_seconds - main_before.cpu_seconds < side_cpu / 2
    assert main_after.ctx_switches is not None and main_after.read_chars is not None


def test_stat_cpu_counts_fields_after_the_last_parenthesis() -> None:
    from hangdoc.capture.read.procstate import _CLOCK_TICKS, _stat_cpu

    fields = " ".join(str(n) for n in range(3, 20))  # fields 3.. of /proc/PID/task/TID/stat
    assert _stat_cpu(f"42 (a) (b c) {fields}") == (14 + 15) / _CLOCK_TICKS
    assert _stat_cpu("42 (truncated") is None


@pytest.mark.parametrize(
    ("variables", "kept"),
    [
        # real py-spy 0.4.3 reprs of __exit__(self, exc_type, exc, tb) during `raise ValueError`
        (
            [
                {"name": "self", "arg": True, "repr": "<T at 0x7f4900ccc9d0>"},
                {"name": "exc_type", "arg": True, "repr": "<type at 0x7f490164e900>"},
                {"name": "exc", "arg": True, "repr": "<ValueError at 0x7f4900c6b940>"},
                {"name": "tb", "arg": True, "repr": "<traceback at 0x7f4900cccf40>"},
                {"name": "token", "arg": False, "repr": '"secret"'},
            ],
            (("exception", "<ValueError>"),),
        ),
        (
            [
                {"name": "self", "arg": True, "repr": "<T at 0x1>"},
                {"name": "t", "arg": True, "repr": "None"},
                {"name": "v", "arg": True, "repr": "None"},
                {"name": "b", "arg": True, "repr": "None"},
            ],
            (("exception", "None"),),
        ),
        ([{"name": "self", "arg": True, "repr": "<T at 0x1>"}], ()),  # __exit__(self, *args)
    ],
)
def test_an_exit_keeps_only_the_type_of_its_exception(variables: list[dict], kept: tuple) -> None:
    raw = json.dumps(
        [
            {
                "pid": 9,
                "thread_id": 1,
                "thread_name": "MainThread",
                "os_thread_id": 9,
                "active": False,
                "owns_gil": False,
                "frames": [
                    {
                        "name": "Trainer.__exit__",
                        "filename": "/job/trainer.py",
                        "module": None,
                        "line": 55,
                        "locals": variables,
                    }
                ],
            }
        ]
    )
    (thread,) = parse_dump(raw)
    assert (thread.locals[0].values if thread.locals else ()) == kept
