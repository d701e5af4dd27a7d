"""Discovery that does not mix jobs, nor trusts what it cannot read.

- a ``pid:``/``slurm:`` scope holding the ranks of several jobs is refused (``MultipleJobs``),
  each job named by the spec that names it alone;
- hangdoc's own processes (agent, diagnose, watch, py-spy) are never ranks nor launchers;
- kernel threads are told by their PF_KTHREAD flag, not by "parent is pid 2";
- ranks that cannot be read (the kernel refused, or the caller's ``readable`` policy) give
  ``PermissionDenied`` first, not "no process has MASTER_ADDR";
- rank and size variables are parsed strictly and bounded, so nothing downstream crashes.

Rules are checked on hand-built tables and, where the kernel is involved, on real processes
(python sleepers, no torch: these tests are quick).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from support.factories import make_rank, make_snapshot
from support.harness import free_port
from support.paths import REPO
from support.tables import PY, TORCHRUN, proc, table

from hangdoc.analysis.analyse import analyse
from hangdoc.capture.find.discover import MultipleJobs, discover
from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.capture.find.jobsplit import (
    Member,
    RendezvousKey,
    job_names,
    rendezvous_key,
    split_jobs,
)
from hangdoc.capture.find.processes import (
    PF_KTHREAD,
    ProcInfo,
    _is_kernel_thread,
    read_process_table,
    stat_flags,
)
from hangdoc.capture.find.rankenv import parse_env_int
from hangdoc.capture.find.rankselect import UNREADABLE_WITHHELD, WITHHELD_HELP, select_ranks
from hangdoc.errors import HangdocError, JobNotFound, PermissionDenied, UsageError
from hangdoc.model import MAX_WORLD_SIZE, NoteKind, RankSnapshot

ROOT = REPO
SLEEP = "import time; time.sleep(120)"


def endpoint(port: int, **more: str) -> dict[str, str]:
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **more}


def two_torchrun_jobs(shell: ProcInfo) -> list[ProcInfo]:
    """A shell (or tmux server) that started two torchrun jobs of two ranks each."""
    procs = [shell]
    for launcher, port in ((11, 29500), (21, 29501)):
        procs.append(proc(launcher, shell.pid, TORCHRUN, endpoint(port)))
        for rank in (0, 1):
            procs.append(
                proc(launcher + 1 + rank, launcher, (PY, "train.py"), endpoint(port, RANK=str(rank), WORLD_SIZE="2"))
            )
    return procs


# ------------------------------------------------------------------ several jobs in one scope


def test_pid_of_a_shell_with_two_torchrun_jobs_is_refused_naming_each_job() -> None:
    tab = table(*two_torchrun_jobs(proc(10, 1, ("/bin/bash",))))
    with pytest.raises(MultipleJobs) as info:
        discover(parse_job_spec("pid:10"), table=tab)
    err = info.value
    assert str(err) == (
        "pid:10 holds the ranks of 2 jobs: 127.0.0.1:29500 (2 ranks, launcher "
        "pid 11), 127.0.0.1:29501 (2 ranks, launcher pid 21)"
    )
    assert err.jobs == ("127.0.0.1:29500", "127.0.0.1:29501")
    assert "`hangdoc diagnose 127.0.0.1:29500`" in err.help
    assert isinstance(err, HangdocError) and err.exit_code == 2
    # each listed spec names its job alone
    for spec, launcher in zip(err.jobs, (11, 21), strict=False):
        found = discover(parse_job_spec(spec), table=tab)
        assert [(r.rank, r.launcher_pid) for r in found.ranks] == [(0, launcher), (1, launcher)]
        assert found.world_size == 2


def test_pid_1_of_a_container_with_two_jobs_is_refused() -> None:
    # PID 1 is an init; ancestry stops below it, the scope still takes in everything
    tab = table(proc(1, 0, ("/sbin/tini", "--", "bash")), *two_torchrun_jobs(proc(10, 1, ("/bin/bash",))))
    with pytest.raises(MultipleJobs, match=r"^pid:1 holds the ranks of 2 jobs"):
        discover(parse_job_spec("pid:1"), table=tab)


def test_slurm_job_with_two_steps_is_refused_and_each_step_found() -> None:
    def step(launcher: int, step_id: str) -> list[ProcInfo]:
        env = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": step_id, "SLURM_NTASKS": "2"}
        return [proc(launcher, 1, ("/usr/sbin/slurmstepd", f"[77.{step_id}]"), env)] + [
            proc(launcher + 1 + r, launcher, (PY, "train.py"), {**env, "SLURM_PROCID": str(r)}) for r in (0, 1)
        ]

    tab = table(*step(30, "0"), *step(40, "1"))
    with pytest.raises(MultipleJobs) as info:
        discover(parse_job_spec("slurm:77"), table=tab)
    assert info.value.jobs == ("slurm:77.0", "slurm:77.1")
    assert "slurm:77.0 (2 ranks, launcher pid 30)" in str(info.value)
    only = discover(parse_job_spec("slurm:77.1"), table=tab)
    assert [r.pid for r in only.ranks] == [41, 42]


def test_duplicate_ranks_of_one_rendezvous_stay_a_note() -> None:
    env = endpoint(29500, WORLD_SIZE="2")
    tab = table(
        proc(50, 1, TORCHRUN, env),
        proc(51, 50, (PY, "a.py"), {**env, "RANK": "0"}),
        proc(52, 50, (PY, "a.py"), {**env, "RANK": "0"}),
    )
    found = discover(parse_job_spec("pid:50"), table=tab)
    assert [r.pid for r in found.ranks] == [51, 52]
    assert any("rank 0 is claimed by 2 processes" in n.words() for n in found.notes)
    assert [n.pids for n in found.notes if n.kind is NoteKind.RANK_CLAIMED] == [(51, 52)]


def test_ranks_without_a_rendezvous_do_not_make_a_second_job() -> None:
    env = endpoint(29500, WORLD_SIZE="1")
    tab = table(
        proc(60, 1, ("/bin/bash",)),
        proc(61, 60, (PY, "train.py"), {**env, "RANK": "0"}),
        proc(62, 60, (PY, "monitor.py"), {"HOME": "/root"}),  # no rendezvous: as before
    )
    found = discover(parse_job_spec("pid:60"), table=tab)
    assert [(r.pid, r.rank) for r in found.ranks] == [(61, 0), (62, None)]


def test_ranks_without_a_rendezvous_are_counted_when_jobs_are_refused() -> None:
    tab = table(*two_torchrun_jobs(proc(10, 1, ("/bin/bash",))), proc(99, 10, (PY, "monitor.py"), {}))
    with pytest.raises(
        MultipleJobs,
        match=r"launcher pid 21\); and 1 rank process with no "
        r"rendezvous variables \(pid 99\)$",
    ):
        discover(parse_job_spec("pid:10"), table=tab)


def test_multiple_jobs_can_be_raised_again_from_its_message() -> None:
    # the coordinator re-raises one node's error class with a new message alone
    err = MultipleJobs("no agent answered for pid:1: n1: pid:1 holds the ranks of 2 jobs")
    assert err.jobs == () and err.help == MultipleJobs.help


def test_endpoint_spec_is_never_split() -> None:
    # localhost and 127.0.0.1 are one endpoint to a HOST:PORT spec, though two keys
    tab = table(
        proc(70, 1, (PY, "x.py"), {"RANK": "0", "MASTER_ADDR": "localhost", "MASTER_PORT": "9"}),
        proc(71, 1, (PY, "x.py"), {"RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "9"}),
    )
    assert [r.pid for r in discover(parse_job_spec("127.0.0.1:9"), table=tab).ranks] == [70, 71]


def test_rendezvous_key_preference() -> None:
    both = {
        "MASTER_ADDR": "Node1.",
        "MASTER_PORT": " 29500",
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_ID": "0",
        "TORCHELASTIC_RUN_ID": "r",
    }
    key = rendezvous_key(both)
    assert key == RendezvousKey(("MASTER_ADDR", "MASTER_PORT"), ("node1", "29500"))
    assert key is not None and key.spec() == "node1:29500"
    no_port = {**both, "MASTER_PORT": ""}
    assert str(rendezvous_key(no_port)) == "SLURM_JOB_ID=7 SLURM_STEP_ID=0"
    assert str(rendezvous_key({"TORCHELASTIC_RUN_ID": "r"})) == "TORCHELASTIC_RUN_ID=r"
    assert rendezvous_key({"RANK": "0"}) is None and rendezvous_key(None) is None
    assert RendezvousKey(("MASTER_ADDR", "MASTER_PORT"), ("::1", "9")).spec() == "[::1]:9"
    assert RendezvousKey(("MASTER_ADDR", "MASTER_PORT"), ("h", "x")).spec() is None


def test_keys_from_the_environment_are_shown_on_one_safe_line() -> None:
    key = rendezvous_key({"TORCHELASTIC_RUN_ID": "x\x1b[2J\u202e\n" * 30})
    text = str(key)
    assert text.startswith("TORCHELASTIC_RUN_ID='x\\x1b[2J\\u202e\\nx")
    assert text.isprintable() and len(text) < 200  # 40 characters, escaped


def test_jobs_no_spec_names_alone_are_named_by_their_launcher_or_key() -> None:
    members = [
        Member(1, {"MASTER_ADDR": "localhost", "MASTER_PORT": "9"}, 100),
        Member(2, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "9"}, 200),  # same port
        Member(3, {"TORCHELASTIC_RUN_ID": "abc"}, 300),  # no spec form names a run id
        Member(4, {"TORCHELASTIC_RUN_ID": "xyz"}, None),  # ... nor has it a launcher
        Member(5, {"RANK": "0"}, None),
    ]
    jobs, keyless = split_jobs(members)
    assert job_names(jobs) == ["pid:100", "pid:200", "pid:300", "TORCHELASTIC_RUN_ID=xyz"]
    assert [m.pid for m in keyless] == [5]


@contextmanager
def started(argv: list[str], env: dict[str, str] | None = None, **kw: object) -> Iterator[int]:
    """Run ``argv`` in its own session; kill its whole process group on exit."""
    child = subprocess.Popen(argv, env=env, start_new_session=True, **kw)  # type: ignore[call-overload]
    try:
        yield child.pid
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def wait_for(check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


LAUNCHER = (
    "import os, subprocess, sys\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],\n"
    "        env={**os.environ, 'RANK': str(r), 'WORLD_SIZE': '2'}) for r in (0, 1)]\n"
    "[k.wait() for k in kids]\n"
)


@pytest.mark.timeout(60)
def test_real_shell_with_two_jobs_is_refused() -> None:
    ports = free_port(), free_port()
    script = " & ".join(f'MASTER_ADDR=127.0.0.1 MASTER_PORT={p} {sys.executable} -c "{LAUNCHER}"' for p in ports)
    with started(["bash", "-c", f"{script} & wait"]) as shell:

        def grandchildren() -> int:
            return sum(len(c.children()) for c in psutil.Process(shell).children())

        wait_for(lambda: grandchildren() == 4)
        launchers = sorted(c.pid for c in psutil.Process(shell).children())
        with pytest.raises(MultipleJobs) as info:
            discover(parse_job_spec(f"pid:{shell}"))
        by_port = {psutil.Process(p).environ()["MASTER_PORT"]: p for p in launchers}
        expected = [f"127.0.0.1:{p} (2 ranks, launcher pid {by_port[str(p)]})" for p in ports]
        assert all(e in str(info.value) for e in expected), str(info.value)
        for launcher in launchers:  # each launcher's pid names one job
            found = discover(parse_job_spec(f"pid:{launcher}"))
            assert [r.rank for r in found.ranks] == [0, 1]
            assert {r.launcher_pid for r in found.ranks} == {launcher}
        # the command line: exit code 2, the jobs on one line, how to go on
        run = subprocess.run(
            [sys.executable, "-m", "hangdoc", "diagnose", f"pid:{shell}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert run.returncode == 2, run.stderr
        error, advice = run.stderr.splitlines()[:2]
        assert error == f"hangdoc: error: {info.value}"
        assert (
            advice.startswith("  help: Diagnose each job on its own")
            and f"`hangdoc diagnose {info.value.jobs[0]}`" in advice
        )


# ------------------------------------------------------------------ hangdoc's own processes


@pytest.mark.parametrize(
    "cmdline",
    [
        (PY, "/venv/bin/hangdoc", "agent", "--port", "7420"),
        ("/venv/bin/hangdoc", "diagnose", "127.0.0.1:29500"),
        (PY, "-m", "hangdoc", "watch", "--", "torchrun", "train.py"),
        (PY, "-u", "-m", "hangdoc.cli", "diagnose", "pid:1"),
        ("/venv/bin/py-spy", "dump", "--pid", "12"),
    ],
)
def test_hangdoc_and_py_spy_are_never_candidates(cmdline: tuple[str, ...]) -> None:
    tab = table(proc(80, 1, cmdline, endpoint(29500, RANK="0")))
    selection = select_ranks(tab, [80])
    assert selection.ranks == []
    assert selection.rejected[80].endswith(" itself")


def test_hangdoc_watch_above_a_rank_is_not_its_launcher() -> None:
    tab = table(
        proc(90, 1, (PY, "/venv/bin/hangdoc", "watch", "--", PY, "train.py")),
        proc(91, 90, (PY, "train.py"), endpoint(29500, RANK="0", WORLD_SIZE="1")),
    )
    found = discover(parse_job_spec("pid:90"), table=tab)
    assert [(r.pid, r.launcher_pid) for r in found.ranks] == [(91, None)]


@pytest.mark.timeout(60)
def test_real_python_m_hangdoc_process_is_not_a_rank(tmp_path: Path) -> None:
    (tmp_path / "hangdoc").mkdir()
    (tmp_path / "hangdoc" / "__main__.py").write_text(SLEEP)
    port = free_port()
    env = {**os.environ, **endpoint(port, RANK="0", WORLD_SIZE="1")}
    with started([sys.executable, "-m", "hangdoc", "agent"], env=env, cwd=tmp_path) as pid:
        wait_for(lambda: "hangdoc" in psutil.Process(pid).cmdline())
        with pytest.raises(JobNotFound, match=rf"pid {pid} \(python[\d.]*\): hangdoc itself"):
            discover(parse_job_spec(f"127.0.0.1:{port}"))


# ------------------------------------------------------------------ kernel threads


def test_kernel_threads_are_told_by_their_flag() -> None:
    kernel = [p for p in psutil.pids() if (stat_flags(p) or 0) & PF_KTHREAD]
    tab = read_process_table()
    assert kernel and not set(kernel) & set(tab.procs)
    assert _is_kernel_thread(kernel[0], [])
    # an ordinary process is not one, even with its command line unknown
    assert not _is_kernel_thread(os.getpid(), [])
    assert stat_flags(os.getpid()) is not None


@pytest.mark.timeout(60)
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare for a pid namespace"
)
def test_children_of_pid_2_in_a_container_are_processes() -> None:
    # In a new pid namespace the first child of PID 1 is PID 2: an ordinary process, as in
    # a container; its own child has parent 2. Neither is a kernel thread.
    inner = (
        "import json, subprocess, sys, time, psutil\n"
        "from hangdoc.capture.find.processes import read_process_table\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import subprocess, sys; "
        f'subprocess.run([sys.executable, "-c", "{SLEEP}"])\'])\n'
        "deadline = time.monotonic() + 20\n"
        "while not psutil.Process(child.pid).children() and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "tab = read_process_table()\n"
        "print(json.dumps({'child': child.pid, 'ppids': {p.pid: p.ppid "
        "for p in tab.procs.values()}}))\n"
        "child.kill()\n"
    )
    out = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", inner],
        capture_output=True,
        text=True,
        timeout=50,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    seen = json.loads(out.stdout)
    assert seen["child"] == 2
    ppids = {int(pid): ppid for pid, ppid in seen["ppids"].items()}
    assert ppids[2] == 1  # pid 2 itself is there
    assert 2 in ppids.values()  # and so is its child


# ------------------------------------------------------------------ unreadable ranks


@contextmanager
def sleeper(**env: str) -> Iterator[int]:
    """A python process (``sleep``-like) with ``env`` added, up and running."""
    with started([sys.executable, "-c", SLEEP], env={**os.environ, **env}) as pid:
        wait_for(lambda: psutil.Process(pid).cmdline()[-1:] == [SLEEP])
        yield pid


def test_pid_withheld_by_the_callers_policy_is_permission_denied() -> None:
    port = free_port()
    with sleeper(**endpoint(port, RANK="0", WORLD_SIZE="1")) as pid:

        def readable(p: int) -> bool:
            return p != pid

        tab = read_process_table(readable=readable)
        assert tab.procs[pid].env is None and tab.withheld == {pid}
        assert tab.procs[pid].ppid == os.getpid() or tab.procs[pid].ppid in tab.procs
        for spec in (f"pid:{pid}", f"127.0.0.1:{port}"):
            with pytest.raises(PermissionDenied) as info:
                discover(parse_job_spec(spec), readable=readable)
            assert str(info.value).startswith("this caller may not read 1 Python process: ")
            assert str(pid) not in str(info.value).split(";")[0]  # counted, not named
            assert info.value.help == WITHHELD_HELP and info.value.exit_code == 5
        # the same on a table read before
        with pytest.raises(PermissionDenied):
            discover(parse_job_spec(f"pid:{pid}"), table=read_process_table(), readable=readable)
        # and readable to all: found as before
        assert [r.pid for r in discover(parse_job_spec(f"pid:{pid}"), readable=lambda p: True).ranks] == [pid]


@pytest.mark.timeout(60)
def test_withheld_rank_stays_in_the_tree_but_is_no_rank() -> None:
    port = free_port()
    env = {**os.environ, **endpoint(port)}
    with started([sys.executable, "-c", LAUNCHER], env=env) as launcher:
        wait_for(lambda: len(psutil.Process(launcher).children()) == 2)
        kids = sorted(c.pid for c in psutil.Process(launcher).children())
        rank1 = next(k for k in kids if psutil.Process(k).environ()["RANK"] == "1")

        def readable(p: int) -> bool:
            return p != rank1

        tab = read_process_table(readable=readable)
        assert sorted(c.pid for c in tab.children(launcher)) == kids
        assert next(a.pid for a in tab.ancestors(rank1)) == launcher
        found = discover(parse_job_spec(f"pid:{launcher}"), readable=readable)
        assert [(r.rank, r.launcher_pid) for r in found.ranks] == [(0, launcher)]
        assert any("1 Python process this caller may not read" in n.words() for n in found.notes)
        assert any(n.kind is NoteKind.UNREADABLE for n in found.notes)
        selection = select_ranks(tab, [launcher, *kids])
        assert selection.rejected[rank1] == UNREADABLE_WITHHELD


def test_hand_built_table_with_readable_predicate() -> None:
    tab = table(
        proc(100, 1, TORCHRUN, endpoint(9)),
        proc(101, 100, (PY, "t.py"), endpoint(9, RANK="0")),
        proc(102, 100, (PY, "t.py"), endpoint(9, RANK="1")),
    )
    with pytest.raises(PermissionDenied, match="this caller may not read 2 Python processes"):
        discover(parse_job_spec("pid:100"), table=tab, readable=lambda p: p == 100)
    assert tab.procs[101].env is not None  # the caller's table is left as it was


def _as_nobody() -> list[str]:
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@contextmanager
def importable_by_nobody() -> Iterator[str]:
    """A PYTHONPATH from which the unprivileged user can import hangdoc: the checkout, or a
    0755 copy of the package in a temporary directory (removed after)."""
    trial = [*_as_nobody(), sys.executable, "-c", "import hangdoc.cli"]
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    if subprocess.run(trial, env=env, capture_output=True, timeout=60, check=False).returncode == 0:
        yield str(ROOT)
        return
    copy = tempfile.mkdtemp(prefix="hangdoc-nobody-")
    try:
        shutil.copytree(ROOT / "hangdoc", Path(copy) / "hangdoc", ignore=shutil.ignore_patterns("__pycache__"))
        for folder, _, files in os.walk(copy):
            os.chmod(folder, 0o755)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o644)
        yield copy
    finally:
        shutil.rmtree(copy, ignore_errors=True)


@pytest.mark.timeout(120)
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root (to start a process nobody may read) and setpriv",
)
def test_unprivileged_user_is_told_permission_denied_first() -> None:
    port = free_port()
    with sleeper(**endpoint(port, RANK="0", WORLD_SIZE="1")) as pid, importable_by_nobody() as path:
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": path}
        searched = {
            f"pid:{pid}": f"searched pid {pid} and its 0 descendants on ",
            f"127.0.0.1:{port}": (f"no process has MASTER_ADDR=127.0.0.1 MASTER_PORT={port} among the others"),
        }
        for spec, rest in searched.items():
            argv = [*_as_nobody(), sys.executable, "-m", "hangdoc", "diagnose", spec]
            run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, cwd="/", check=False)
            assert run.returncode == 5, run.stderr
            first = run.stderr.splitlines()[0]
            assert first.startswith("hangdoc: error: permission denied reading the environment of "), (
                first
            )  # first: not "no process has ..."
            assert rest in first, first
            if spec.startswith("pid:"):  # other Python processes may be listed for the other
                assert f"1 Python process (pid {pid})" in first, first
            assert "help: Run as root or as the job's user with ptrace allowed" in run.stderr


# ------------------------------------------------------------------ strict rank and size values


@pytest.mark.parametrize(
    ("name", "value", "number"),
    [
        ("RANK", "3", 3),
        ("RANK", " 07 ", 7),
        ("RANK", "0", 0),
        ("WORLD_SIZE", "8", 8),
        ("RANK", "²", None),
        ("RANK", "٣", None),
        ("RANK", "-1", None),
        ("RANK", "+1", None),
        ("RANK", "1e3", None),
        ("RANK", "2000000000", None),
        ("RANK", str(MAX_WORLD_SIZE), None),
        ("LOCAL_WORLD_SIZE", "0", None),
        ("LOCAL_WORLD_SIZE", "²", None),
        ("WORLD_SIZE", "2000000000", None),
        ("WORLD_SIZE", str(MAX_WORLD_SIZE), MAX_WORLD_SIZE),
        ("WORLD_SIZE", "9" * 5000, None),
        ("WORLD_SIZE", "0" * 5000 + "4", 4),
    ],
)
def test_parse_env_int_is_strict(name: str, value: str, number: int | None) -> None:
    assert "²".isdigit()  # why str.isdigit() will not do
    parsed, why = parse_env_int(name, value)
    assert parsed == number
    assert bool(why) == (number is None)


def test_bad_values_are_ignored_noted_and_left_out_downstream() -> None:
    bad = {
        "WORLD_SIZE": "2000000000",
        "LOCAL_WORLD_SIZE": "0",
        "GROUP_RANK": "²",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "9",
    }
    tab = table(
        proc(110, 1, (PY, "t.py"), {**bad, "RANK": "²", "SLURM_PROCID": "0"}),
        proc(111, 1, (PY, "t.py"), {**bad, "RANK": "1", "LOCAL_WORLD_SIZE": "²"}),
        proc(112, 1, (PY, "t.py"), {**bad, "RANK": "-1"}),
    )
    found = discover(parse_job_spec("h:9"), table=tab)
    assert [(r.pid, r.rank, r.rank_evidence) for r in found.ranks] == [
        (110, 0, "SLURM_PROCID=0"),
        (111, 1, "RANK=1"),
        (112, None, "no rank in its start-up environment"),
    ]
    assert found.world_size is None and {r.world_size for r in found.ranks} == {None}
    notes = "\n".join(n.words() for n in found.notes)
    assert (
        "WORLD_SIZE='2000000000' ignored and left out of the rank's environment (not a "
        f"size from 1 to {MAX_WORLD_SIZE:,}): pid 110, 111, 112" in notes
    )
    (world,) = [n for n in found.notes if n.text.startswith("WORLD_SIZE=")]
    assert (world.kind, world.pids, world.listed) == (NoteKind.BAD_ENV, (110, 111, 112), "pid 110, 111, 112")
    assert "LOCAL_WORLD_SIZE='0' ignored" in notes and "LOCAL_WORLD_SIZE='²' ignored" in notes
    assert "RANK='²' ignored" in notes and "RANK='-1' ignored" in notes
    for r in found.ranks:
        kept = dict(r.env)
        assert not {"WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"} & set(kept)
        assert "RANK" not in kept or kept["RANK"] == "1"
    # what analysis makes of these ranks: no crash (int("²"), // 0, range(2e9))
    snaps = [RankSnapshot(r, make_rank(r.rank, ["t.py:main:1"]).samples) for r in found.ranks]
    diagnosis = analyse(make_snapshot(snaps, world_size=found.world_size))
    assert diagnosis.verdict is not None


def test_absurd_world_size_from_several_variables_keeps_the_valid_one() -> None:
    tab = table(
        proc(
            120,
            1,
            (PY, "t.py"),
            {"RANK": "0", "WORLD_SIZE": "0", "SLURM_NTASKS": "4", "MASTER_ADDR": "h", "MASTER_PORT": "9"},
        )
    )
    (rank,) = discover(parse_job_spec("h:9"), table=tab).ranks
    assert rank.world_size == 4
    assert dict(rank.env)["SLURM_NTASKS"] == "4"


def test_usage_error_is_the_base_of_multiple_jobs() -> None:
    assert issubclass(MultipleJobs, UsageError)
    assert MultipleJobs.__doc__ and MultipleJobs.help
