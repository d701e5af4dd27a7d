"""``hangdoc.probe`` served by real processes and read by ``capture.read.probe_client``.

It starts without touching the script (the ``.pth`` hook with ``HANGDOC_PROBE=1``, ``hangdoc
run``), answers with the heartbeat and the threads' live exceptions (never a message), says
what it cannot do, never answers for a forked child's parent, stays silent where hangdoc
cannot be imported; a process that holds the GIL costs only the timeout, and a socket or
directory that is not the process owner's private one, or a socket another process listens
on, is never read.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.factories import make_snapshot
from support.paths import TESTS
from support.probes import probe_socket, remove_probe_files

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import snapshot_from_dict, snapshot_to_dict
from hangdoc.capture.read import probe_client
from hangdoc.capture.read.heartbeat_files import read_processes
from hangdoc.capture.read.probe_client import _ask, probe_heartbeat, probe_state
from hangdoc.fleet.node import LocalNode
from hangdoc.model import Frame, Heartbeat, ProbeStatus, ThreadException
from hangdoc.probe_hook import BOOT_DIR, PTH_NAME

pytestmark = pytest.mark.timeout(60)
UID = os.geteuid()
NOT_INITIALISED = "its probe says: torch.distributed is not initialised in this process"
FAKE_PROBE = TESTS / "support" / "fake_probe.py"

SERVE = """
import re, sys, time
import hangdoc.probe
print(hangdoc.probe.start(), flush=True)
if sys.argv[1] == "gil":
    re.match(r"(a+)+$", "a" * 34 + "b")  # catastrophic backtracking: holds the GIL for minutes
time.sleep(120)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGDOC_") and k != "PYTHONPATH"}
    env.update(extra)
    return env


def _spawn(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[subprocess.Popen[str], list[str]]:
    """Start ``argv`` and read its first line ("ready" and what it says about itself)."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd, stdin=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(f"{argv} said nothing: {proc.communicate()[1][-2000:]}")
    return proc, line.split()


def _end(*procs: subprocess.Popen[str]) -> list[str]:
    """Kill ``procs`` (and drop the sockets their probes leave: SIGKILL runs no atexit);
    what each wrote on stderr."""
    said = []
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        said.append(proc.communicate()[1] or "")
        remove_probe_files([proc.pid])
    return said


def _kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    remove_probe_files([pid])


@pytest.fixture
def serving(request: pytest.FixtureRequest) -> Iterator[tuple[int, str]]:
    proc = subprocess.Popen([sys.executable, "-c", SERVE, request.param], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        path = proc.stdout.readline().strip()
        yield proc.pid, path
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        remove_probe_files([proc.pid])


# ------------------------------------------------------------------ serving and reading


@pytest.mark.parametrize("serving", ["idle"], indirect=True)
def test_the_probe_listens_privately_and_answers(serving: tuple[int, str]) -> None:
    pid, path = serving
    assert path == probe_socket(pid) and Path(path).name == f"{pid}.sock"
    assert Path(path).parent.name.startswith(f"hangdoc-probe-{UID}-")  # made for it: no name known ahead
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(Path(path).parent).st_mode & 0o777 == 0o700
    assert _ask(path, b"ping\n", 5.0) == {"ok": True, "pid": pid}
    assert _ask(path, b"reboot\n", 5.0)["ok"] is False
    answer = probe_state(pid)
    assert answer.status is ProbeStatus.ANSWERED and answer.flight is None and answer.reason == NOT_INITIALISED
    assert answer.heartbeat is None and answer.exceptions == ()


@pytest.mark.parametrize("serving", ["gil"], indirect=True)
def test_a_process_holding_the_gil_costs_the_timeout_and_is_said(serving: tuple[int, str]) -> None:
    pid, _path = serving
    time.sleep(0.5)  # into the regular expression
    started = time.monotonic()
    answer = probe_state(pid, timeout=1.5)
    assert answer.status is ProbeStatus.FAILED and "did not answer within 1.5 s" in answer.reason
    assert time.monotonic() - started < 5


def test_no_probe_is_the_common_case_not_an_error() -> None:
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=_env()) as proc:
        try:
            answer = probe_state(proc.pid)
            assert answer.status is ProbeStatus.NO_PROBE and answer.flight is None
        finally:
            proc.kill()


@pytest.mark.parametrize("serving", ["idle"], indirect=True)
def test_a_directory_others_may_write_is_never_read(serving: tuple[int, str]) -> None:
    pid, path = serving
    directory = Path(path).parent
    os.chmod(directory, 0o777)
    try:
        answer = probe_state(pid)
        assert answer.status is ProbeStatus.FAILED
        assert (
            answer.reason == f"probe directory {directory} is not private to the process's user (uid {UID}): not read"
        )
    finally:
        os.chmod(directory, 0o700)
    assert probe_state(pid).status is ProbeStatus.ANSWERED


@pytest.mark.parametrize("serving", ["idle"], indirect=True)
def test_a_link_or_another_process_s_socket_in_place_of_the_socket_is_never_read(
    serving: tuple[int, str], tmp_path: Path
) -> None:
    pid, path = serving
    other = subprocess.Popen([sys.executable, "-c", SERVE, "idle"], stdout=subprocess.PIPE, text=True)
    moved = Path(path).with_suffix(".moved")
    try:
        assert other.stdout is not None
        other_path = other.stdout.readline().strip()
        os.rename(path, moved)  # the process still listens on it; the name now holds...
        os.symlink(other_path, path)  # ...a link to another probe
        answer = probe_state(pid)
        assert (
            answer.status is ProbeStatus.FAILED
            and answer.reason == f"{path} is not a socket of the process's user: not read"
        )
        os.unlink(path)
        os.link(other_path, path)  # the other process's socket itself, under the name
        answer = probe_state(pid)
        assert answer.status is ProbeStatus.FAILED
        assert answer.reason == (
            f"its probe socket is listened on by pid {other.pid} of uid {UID}, not by the process: not read"
        )
        os.replace(moved, path)
        assert probe_state(pid).status is ProbeStatus.ANSWERED
    finally:
        _end(other)


def test_a_socket_planted_under_the_old_name_is_never_looked_at(tmp_path: Path) -> None:
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=_env()) as proc:
        planted = Path(f"/tmp/hangdoc-probe-{UID}/{proc.pid}.sock")
        planted.parent.mkdir(mode=0o700, exist_ok=True)
        planted.write_text('{"ok": true}')
        try:
            answer = probe_state(proc.pid)
            assert answer.status is ProbeStatus.NO_PROBE
            assert answer.reason.startswith(f"no probe socket found for pid {proc.pid} (no hangdoc probe started")
        finally:
            planted.unlink()
            proc.kill()


def test_a_probe_of_an_older_hangdoc_under_the_old_name_is_still_read(monkeypatch: pytest.MonkeyPatch) -> None:
    legacy = Path(f"/tmp/hangdoc-probe-{UID}")  # where a job's older hangdoc listens
    if legacy.exists() and (legacy.lstat().st_uid != UID or legacy.lstat().st_mode & 0o077):
        pytest.skip(f"{legacy} is not this user's private directory here")
    fake = subprocess.Popen(
        [sys.executable, str(FAKE_PROBE), "--dir", str(legacy), "--answer", "quiet"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert fake.stdout is not None and fake.stdout.readline().startswith("ready")
        assert probe_state(fake.pid).reason == NOT_INITIALISED  # among its own sockets

        def unlisted(pid: int, inner: int) -> list[str]:
            raise PermissionError("its descriptors cannot be listed")

        monkeypatch.setattr(probe_client, "_listening", unlisted)
        assert probe_state(fake.pid).reason == NOT_INITIALISED  # by the old name, under the same checks
    finally:
        _end(fake)


def test_the_runtime_directory_is_used_when_it_is_private_and_else_a_fresh_one(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    # SIGINT's handler set anew: a test run in the background of a shell (CI's) starts its
    # children with SIGINT ignored, and Python then installs none
    code = (
        "import hangdoc.probe, signal, time; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "print(hangdoc.probe.start(), flush=True); time.sleep(60)"
    )
    private, (path,) = _spawn([sys.executable, "-c", code], _env(XDG_RUNTIME_DIR=str(runtime)), tmp_path)
    try:
        assert path == f"{runtime}/hangdoc-probe/{private.pid}.sock"
        assert probe_state(private.pid).status is ProbeStatus.ANSWERED
        private.send_signal(signal.SIGINT)  # a normal exit (atexit): the socket goes, the shared directory stays
        private.wait()
        assert not Path(path).exists() and os.stat(runtime / "hangdoc-probe").st_mode & 0o777 == 0o700
        os.chmod(runtime, 0o755)  # others may look in: not the job's own any more
        shared, (path,) = _spawn([sys.executable, "-c", code], _env(XDG_RUNTIME_DIR=str(runtime)), tmp_path)
        assert Path(path).parent.name.startswith(f"hangdoc-probe-{UID}-")
        assert probe_state(shared.pid).status is ProbeStatus.ANSWERED
    finally:
        _end(private)
        if "shared" in locals():
            _end(shared)


def test_a_probe_that_cannot_listen_says_why_once_even_when_quiet(tmp_path: Path) -> None:
    code = (
        "import os, hangdoc.probe as p; p._TMP = '/nonexistent-hangdoc'; os.environ['HANGDOC_PROBE'] = '1'; "
        "print(p.start_from_environment(), p.start_from_environment())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False, env=_env(), cwd=tmp_path
    )
    assert done.stdout == "None None\n"
    assert done.stderr == (
        f"hangdoc.probe: not started: no private directory to listen in for uid {UID} "
        "(/nonexistent-hangdoc: No such file or directory)\n"
    )


# ------------------------------------------------------------------ started without the script


def _installed_pth() -> Path:
    installed = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    assert installed.is_file(), f"{installed} is missing: reinstall hangdoc (make install) to place the hook"
    assert installed.read_bytes() == (BOOT_DIR / PTH_NAME).read_bytes(), "stale hook: reinstall hangdoc"
    return installed


SAYS_IF_LOADED = (
    "import os, sys, time\nprint(os.getpid(), 'hangdoc.probe' in sys.modules, flush=True)\ntime.sleep(60)\n"
)


def test_the_pth_hook_starts_the_probe_when_the_environment_asks_and_only_then(tmp_path: Path) -> None:
    _installed_pth()
    on, (pid, loaded) = _spawn([sys.executable, "-c", SAYS_IF_LOADED], _env(HANGDOC_PROBE="1"), tmp_path)
    off, (off_pid, off_loaded) = _spawn([sys.executable, "-c", SAYS_IF_LOADED], _env(HANGDOC_PROBE="0"), tmp_path)
    try:
        assert loaded == "True" and off_loaded == "False"  # unset or 0: not even imported
        assert _ask(probe_socket(int(pid)), b"ping\n", 5.0) == {"ok": True, "pid": int(pid)}
        answer = probe_state(int(pid))
        assert answer.status is ProbeStatus.ANSWERED and answer.reason == NOT_INITIALISED
        assert probe_state(int(off_pid)).status is ProbeStatus.NO_PROBE
    finally:
        _end(on, off)


def test_the_hook_is_silent_where_hangdoc_cannot_be_imported(tmp_path: Path) -> None:
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    shutil.copy(_installed_pth(), site_dir / PTH_NAME)
    script = "import site, sys; site.addsitedir(sys.argv[1]); print(sorted(m for m in sys.modules if 'hangdoc' in m))"
    for mode, said in (("1", ""), ("verbose", "hangdoc.probe: not started: ModuleNotFoundError")):
        # -S: no site-packages, so no hangdoc: only the hook's own line is processed
        done = subprocess.run(
            [sys.executable, "-S", "-c", script, str(site_dir)],
            capture_output=True,
            text=True,
            env=_env(HANGDOC_PROBE=mode),
            cwd=tmp_path,
            timeout=30,
            check=False,
        )
        assert (done.returncode, done.stdout) == (0, "[]\n")
        assert done.stderr.startswith(said) and done.stderr.count("\n") == (1 if said else 0), done.stderr


RAISING = textwrap.dedent("""\
    import os, sys, threading, time


    class Diverged(RuntimeError):
        pass


    def load(secret):
        raise KeyError(secret)


    def loader(ready):
        try:
            load("SECRET-in-thread")
        except KeyError:
            ready.set()
            time.sleep(60)


    ready = threading.Event()
    worker = threading.Thread(target=loader, args=(ready,), name="loader", daemon=True)
    worker.start()
    ready.wait()
    try:
        raise Diverged("SECRET-in-main token=abc123")
    finally:
        print(os.getpid(), threading.get_ident(), worker.ident, flush=True)
        time.sleep(60)
""")


def test_live_exceptions_are_served_by_type_and_place_never_by_message(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(RAISING)
    proc, (pid, main_id, loader_id) = _spawn([sys.executable, str(script)], _env(HANGDOC_PROBE="1"), tmp_path)
    try:
        answer = probe_state(int(pid))
        raw = _ask(probe_socket(int(pid)), b"state\n", 5.0)
    finally:
        _end(proc)
    assert answer.status is ProbeStatus.ANSWERED
    assert sorted(answer.exceptions, key=lambda e: e.thread_name or "") == [
        ThreadException(int(main_id), "MainThread", "__main__.Diverged", Frame("<module>", str(script), 25)),
        ThreadException(int(loader_id), "loader", "KeyError", Frame("load", str(script), 9)),
    ]
    assert "SECRET" not in json.dumps(raw) and "abc123" not in json.dumps(raw)
    assert raw["exceptions_left_out"] == 0


BEATING = textwrap.dedent("""\
    import os, time
    import hangdoc

    for n in range(1, 42):
        hangdoc.heartbeat(n)
    with hangdoc.step(42):
        print(os.getpid(), flush=True)
        time.sleep(60)
""")


def test_the_heartbeat_is_served_and_stands_in_for_a_record_out_of_sight(tmp_path: Path) -> None:
    script = tmp_path / "beat.py"
    script.write_text(BEATING)
    beats = tmp_path / "beats"
    proc, (pid,) = _spawn(
        [sys.executable, str(script)], _env(HANGDOC_PROBE="1", HANGDOC_HEARTBEAT_DIR=str(beats)), tmp_path
    )
    try:
        answer = probe_state(int(pid))
        assert answer.heartbeat is not None
        assert (answer.heartbeat.pid, answer.heartbeat.step, answer.heartbeat.beats, answer.heartbeat.in_step) == (
            int(pid),
            42,
            42,
            True,
        )
        assert 0 <= answer.heartbeat.age_seconds < 30
        polled = probe_heartbeat(int(pid)).heartbeat  # the cheap request a watch polls with
        assert polled is not None and (polled.step, polled.beats, polled.in_step) == (42, 42, True)
        for record in beats.glob("hb-*.bin"):  # the record's file out of hangdoc's sight (a container's)
            record.unlink()
        assert read_processes([int(pid)]) == {}
        found = LocalNode().heartbeats([int(pid)])
        assert found[int(pid)].step == 42 and found[int(pid)].beats == 42
    finally:
        _end(proc)


FORKING = textwrap.dedent("""\
    import os, time

    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # a DataLoader worker, as the fork start method makes it
        os.write(w, b"x")
        time.sleep(60)
        os._exit(0)
    os.read(r, 1)
    print(os.getpid(), child, flush=True)
    time.sleep(60)
""")


def test_a_forked_child_never_answers_as_its_parent(tmp_path: Path) -> None:
    script = tmp_path / "fork.py"
    script.write_text(FORKING)
    proc, (pid, child) = _spawn([sys.executable, str(script)], _env(HANGDOC_PROBE="1"), tmp_path)
    parent_socket = probe_socket(int(pid))
    try:
        assert probe_state(int(child)).status is ProbeStatus.NO_PROBE
        assert _ask(parent_socket, b"ping\n", 5.0) == {"ok": True, "pid": int(pid)}
        proc.kill()  # no atexit: the socket file stays; the child must not keep it listening
        proc.wait()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn, pytest.raises(ConnectionRefusedError):
            conn.settimeout(5)
            conn.connect(parent_socket)
    finally:
        _kill_pid(int(child))
        _end(proc)
        remove_probe_files([int(pid)])


# ------------------------------------------------------------------ hangdoc run


HANGDOC = [sys.executable, "-m", "hangdoc"]
PARENT_AND_CHILD = textwrap.dedent("""\
    import os, subprocess, sys
    code = "import os, sys, time; print(os.getpid(), flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    print(os.getpid(), child.stdout.readline().strip(), [p for p in sys.path if "probe_hook" in p], flush=True)
    child.wait()
""")


def test_hangdoc_run_becomes_the_command_and_passes_its_status_through(tmp_path: Path) -> None:
    done = subprocess.run(
        [*HANGDOC, "run", "--", "sh", "-c", "echo $$; exit 7"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=tmp_path,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stderr) == (7, "")  # nothing of its own on either stream
    proc = subprocess.Popen(
        [*HANGDOC, "run", "sh", "-c", "echo $$; kill -TERM $$"],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=tmp_path,
    )
    out, _ = proc.communicate(timeout=30)
    assert int(out) == proc.pid and proc.returncode == -signal.SIGTERM  # exec: same pid, same death
    done = subprocess.run(
        [*HANGDOC, "run", "--", "no-such-command-x"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=tmp_path,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2 and done.stderr.startswith("hangdoc: error: cannot run 'no-such-command-x'")


def test_hangdoc_run_starts_the_probe_in_every_python_process(tmp_path: Path) -> None:
    script = tmp_path / "launch.py"
    script.write_text(PARENT_AND_CHILD)
    user_site = tmp_path / "usersite"
    user_site.mkdir()  # a sitecustomize of the job's own: it must still run
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE'] = 'ran'\n")
    code = "import os, time; print(os.getpid(), os.environ.get('USER_SITECUSTOMIZE'), flush=True); time.sleep(60)"
    proc, (parent, child, *path_left) = _spawn(
        [*HANGDOC, "run", "--", sys.executable, str(script)], _env(PYTHONPATH=str(user_site)), tmp_path
    )
    own, (own_pid, sitecustomize) = _spawn(
        [*HANGDOC, "run", sys.executable, "-c", code], _env(PYTHONPATH=str(user_site)), tmp_path
    )
    try:
        assert path_left == ["[]"]  # the hook's directory left sys.path
        for pid in (parent, child, own_pid):
            assert _ask(probe_socket(int(pid)), b"ping\n", 5.0) == {"ok": True, "pid": int(pid)}
        assert sitecustomize == "ran"
    finally:
        _kill_pid(int(child))
        _end(proc, own)


def test_hangdoc_run_serves_a_python_that_cannot_import_hangdoc(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=60)
    bare = str(tmp_path / "bare" / "bin" / "python")
    code = (
        "import os, sys, time; print(os.getpid(), sorted(m for m in sys.modules if 'probe' in m), flush=True); "
        "time.sleep(60)"
    )
    assert (
        subprocess.run(
            [bare, "-c", "import hangdoc"], capture_output=True, env=_env(), cwd=tmp_path, timeout=30, check=False
        ).returncode
        == 1
    )
    proc, (pid, modules) = _spawn([*HANGDOC, "run", "--", bare, "-c", code], _env(), tmp_path)
    plain, (plain_pid, _) = _spawn([bare, "-c", code], _env(HANGDOC_PROBE="1"), tmp_path)
    try:
        assert modules == "['_hangdoc_probe']"  # hangdoc run's own probe module, by its path
        assert probe_state(int(pid)).status is ProbeStatus.ANSWERED
        assert probe_state(int(plain_pid)).status is ProbeStatus.NO_PROBE  # no hook in that Python
    finally:
        said = _end(proc, plain)
    assert said == ["", ""]


# ------------------------------------------------------------------ the model, the bundle, the report


def _with_probe_answers(stacks: dict[int, list[str]]):
    snap = make_snapshot(stacks)
    raised = Frame("step", "/job/train.py", 40)
    ranks = list(snap.ranks)
    ranks[1] = dataclasses.replace(
        ranks[1],
        exceptions=(ThreadException(1001, "MainThread", "RuntimeError", raised),),
        heartbeat=Heartbeat(ranks[1].process.pid, 3, 9, False, 12.04),
    )
    ranks[0] = dataclasses.replace(ranks[0], heartbeat=Heartbeat(ranks[0].process.pid, 3, 9, False, 12.0))
    return dataclasses.replace(snap, ranks=tuple(ranks))


def test_probe_answers_are_evidence_and_never_change_the_verdict() -> None:
    stacks = {
        0: ["train.py:main:10", "torch/distributed/distributed_c10d.py:all_reduce:2800"],
        1: ["train.py:main:50", "torch/distributed/distributed_c10d.py:destroy_process_group:2100"],
    }
    told = analyse(_with_probe_answers(stacks))
    plain = analyse(make_snapshot(stacks))
    assert (told.verdict, told.culprit_ranks, told.confidence) == (plain.verdict, plain.culprit_ranks, plain.confidence)
    added = tuple(e.words() for e in told.evidence[len(plain.evidence) :])
    assert added == (
        (
            "rank 1's main thread is handling RuntimeError raised at train.py:40 while in destroy_process_group "
            "(train.py:50) (its probe)"
        ),
        "ranks 0-1 last beat at step 3, 12.0 s before hangdoc asked (their probes)",
    )


def test_bundles_keep_probe_answers_and_old_bundles_still_load() -> None:
    snap = _with_probe_answers({0: ["train.py:main:10"], 1: ["train.py:main:10"]})
    saved = snapshot_to_dict(snap)
    assert snapshot_from_dict(json.loads(json.dumps(saved))) == snap
    for rank in saved["snapshot"]["ranks"]:  # a bundle written before the probe told these
        rank.pop("exceptions", None)
        rank.pop("heartbeat", None)
    old = snapshot_from_dict(saved)
    assert all(r.exceptions == () and r.heartbeat is None for r in old.ranks)


MANY = textwrap.dedent("""\
    import os, threading, time

    def hold(ready):
        try:
            raise ValueError("x" * 1000)
        except ValueError:
            ready.release()
            time.sleep(60)

    ready = threading.Semaphore(0)
    for n in range(70):
        threading.Thread(target=hold, args=(ready,), daemon=True).start()
    for n in range(70):
        ready.acquire()
    print(os.getpid(), flush=True)
    time.sleep(60)
""")


def test_an_answer_is_bounded_and_says_what_it_left_out(tmp_path: Path) -> None:
    script = tmp_path / "many.py"
    script.write_text(MANY)
    proc, (pid,) = _spawn([sys.executable, str(script)], _env(HANGDOC_PROBE="1"), tmp_path)
    try:
        answer = probe_state(int(pid))
        raw = _ask(probe_socket(int(pid)), b"state\n", 5.0)
    finally:
        _end(proc)
    assert len(answer.exceptions) == 64 and {e.type_name for e in answer.exceptions} == {"ValueError"}
    assert answer.reason == f"{NOT_INITIALISED}; the live exceptions of 6 more threads left out"
    assert len(json.dumps(raw)) < 64 * 1_500  # no message, whatever its length
