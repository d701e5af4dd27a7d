"""What a blocked thread waits on, read from /proc of real processes: pipes, children,
TCP sockets, file locks, epoll sets, futexes; peers the caller may not read are left out."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.waiting import until

from hangdoc.capture.read.waits import SYSCALLS, Wait, WaitKind, _address, process_waits, read_syscall, thread_waits

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not SYSCALLS, reason="system call numbers known for x86_64 and aarch64 only"),
]


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()
        if p.stdin is not None:
            p.stdin.close()


def _start(procs: list[subprocess.Popen[bytes]], code: str, **kw: object) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-c", code], **kw)  # type: ignore[call-overload]
    procs.append(p)
    return p


def _blocked(pid: int, syscall: str) -> Wait:
    """The main thread's wait once it sits in ``syscall`` (starting Python takes a while)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        waits = [w for w in thread_waits(pid) if w.native_id == pid]
        if waits and waits[0].syscall == syscall:
            return waits[0]
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} never blocked in {syscall}: {thread_waits(pid)}")


def test_a_read_of_a_pipe_waits_on_the_process_holding_its_write_end(started: list[subprocess.Popen[bytes]]) -> None:
    reader = _start(started, "import sys; sys.stdin.read()", stdin=subprocess.PIPE)
    wait = _blocked(reader.pid, "read")
    assert wait.kind is WaitKind.PIPE and wait.fd == 0 and wait.target.startswith("pipe:[")
    assert wait.peers == (os.getpid(),)  # this test holds the write end; the reader's own end is not a peer


def test_a_pipe_end_held_for_the_same_direction_is_not_a_peer(started: list[subprocess.Popen[bytes]]) -> None:
    r, w = os.pipe()
    try:
        first = _start(started, f"import os; os.read({r}, 1)", pass_fds=(r,))
        second = _start(started, f"import os; os.read({r}, 1)", pass_fds=(r,))
        os.close(r)
        assert _blocked(first.pid, "read").peers == (os.getpid(),)  # the writer, not the other reader
        assert second.pid not in _blocked(first.pid, "read").peers
    finally:
        os.close(w)


def test_a_wait_for_a_child_names_the_child(started: list[subprocess.Popen[bytes]]) -> None:
    parent = _start(started, "import subprocess; subprocess.run(['sleep', '30'])")
    wait = _blocked(parent.pid, "wait4")
    kids = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
    assert wait.kind is WaitKind.CHILD and wait.peers == tuple(map(int, kids)) and len(kids) == 1
    assert wait.target == f"pid {kids[0]}"


def test_a_tcp_recv_names_the_local_process_at_the_other_end(started: list[subprocess.Popen[bytes]]) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = _start(started, f"import socket; socket.create_connection(('127.0.0.1', {port})).recv(1)")
        conn, _ = server.accept()
        with conn:
            wait = _blocked(client.pid, "recvfrom")
            assert wait.kind is WaitKind.SOCKET and wait.target.startswith("socket:[")
            assert wait.peers == (os.getpid(),) and wait.remote == ""


def test_a_listening_socket_waits_for_work_and_has_no_peer(started: list[subprocess.Popen[bytes]]) -> None:
    server = _start(started, "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); s.accept()")
    wait = _blocked(server.pid, "accept4" if "accept4" in SYSCALLS.values() else "accept")
    assert wait.kind is WaitKind.LISTEN and wait.peers == () and wait.remote == ""


def test_a_blocked_flock_names_the_holder(started: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    path = tmp_path / "lock"
    path.touch()
    with open(path) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        waiter = _start(started, f"import fcntl; fcntl.flock(open({str(path)!r}), fcntl.LOCK_EX)")
        wait = _blocked(waiter.pid, "flock")
        assert wait.kind is WaitKind.FILE_LOCK and wait.target == str(path) and wait.peers == (os.getpid(),)


def test_an_epoll_set_of_one_pipe_is_a_wait_on_that_pipe(started: list[subprocess.Popen[bytes]]) -> None:
    code = "import select; e = select.epoll(); e.register(0, select.EPOLLIN); e.poll()"
    poller = _start(started, code, stdin=subprocess.PIPE)
    wait = _blocked(poller.pid, "epoll_wait" if "epoll_wait" in SYSCALLS.values() else "epoll_pwait")
    assert wait.kind is WaitKind.PIPE and wait.fd == 0 and wait.peers == (os.getpid(),)


def test_a_lock_of_the_process_itself_is_a_wait_on_a_thread(started: list[subprocess.Popen[bytes]]) -> None:
    stuck = _start(started, "import threading; lock = threading.Lock(); lock.acquire(); lock.acquire()")
    wait = _blocked(stuck.pid, "futex")
    assert wait.kind is WaitKind.THREAD and wait.peers == ()


def test_peers_the_caller_may_not_read_are_left_out(started: list[subprocess.Popen[bytes]]) -> None:
    reader = _start(started, "import sys; sys.stdin.read()", stdin=subprocess.PIPE)
    _blocked(reader.pid, "read")
    (wait,) = [w for w in thread_waits(reader.pid, readable=lambda pid: pid != os.getpid()) if w.syscall == "read"]
    assert wait.kind is WaitKind.PIPE and wait.peers == ()


def test_a_process_that_is_gone_or_running_has_no_wait(started: list[subprocess.Popen[bytes]]) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    assert thread_waits(int(done.stdout)) == ()
    spinner = _start(started, "while True: pass")
    deadline = time.monotonic() + 20
    while read_syscall(spinner.pid, spinner.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)  # start-up reads files; then it only runs ("running" in its syscall file)
    assert read_syscall(spinner.pid, spinner.pid) is None


@pytest.mark.parametrize(
    ("hex_pair", "shown"),
    [
        ("0100007F:1F90", "127.0.0.1:8080"),
        ("0A00020F:0016", "15.2.0.10:22"),
        ("00000000000000000000000001000000:0050", "[0000:0000:0000:0000:0000:0000:0000:0001]:80"),
        ("nonsense", "nonsense"),
    ],
)
def test_kernel_addresses_are_shown_as_host_and_port(hex_pair: str, shown: str) -> None:
    assert _address(hex_pair) == shown


def test_a_multiprocessing_queue_get_polls_its_pipe_and_names_the_writer(
    started: list[subprocess.Popen[bytes]],
) -> None:
    """``Queue.get(timeout=...)`` polls one pipe: the descriptors are read from the
    process's memory, and the wait is on the process holding the write end."""
    r, w = os.pipe()
    try:
        reader = _start(
            started,
            f"import multiprocessing.connection as c; c.Connection({r}, writable=False).poll(60)",
            pass_fds=(r,),
        )
        os.close(r)
        wait = _blocked(reader.pid, "poll")
        assert wait.kind is WaitKind.PIPE and wait.fd == r and wait.peers == (os.getpid(),)
    finally:
        os.close(w)


def test_a_poll_of_several_descriptors_stays_a_poll(started: list[subprocess.Popen[bytes]]) -> None:
    code = "import os, select; p = select.poll(); [p.register(os.pipe()[0]) for _ in range(3)]; p.poll(60000)"
    waiter = _start(started, code)
    wait = _blocked(waiter.pid, "poll")
    assert wait.kind is WaitKind.POLL and wait.peers == () and wait.target == "3 pipes and sockets"


def test_a_poll_restarted_by_a_ptrace_pause_is_still_read_as_its_poll(started: list[subprocess.Popen[bytes]]) -> None:
    """py-spy pauses a process with ptrace; a timed poll it interrupts goes on as
    restart_syscall with the poll's registers: still a wait on the pipe's writer."""
    r, w = os.pipe()
    try:
        reader = _start(started, f"import select; p = select.poll(); p.register({r}); p.poll(60000)", pass_fds=(r,))
        os.close(r)
        _blocked(reader.pid, "poll")
        pyspy = Path(sys.executable).with_name("py-spy")
        subprocess.run([str(pyspy), "dump", "--pid", str(reader.pid)], capture_output=True, timeout=30, check=True)
        call = read_syscall(reader.pid, reader.pid)
        if call is None or call[0] != "restart_syscall":
            pytest.skip(f"the poll went on as {call}, not restart_syscall")
        wait = next(w for w in thread_waits(reader.pid) if w.native_id == reader.pid)
        assert wait.syscall == "poll" and wait.kind is WaitKind.PIPE and wait.peers == (os.getpid(),)
    finally:
        os.close(w)


def test_a_restarted_call_whose_registers_are_no_poll_is_other(started: list[subprocess.Popen[bytes]]) -> None:
    sleeper = _start(started, "import time; time.sleep(60)")
    _blocked(sleeper.pid, "clock_nanosleep")
    pyspy = Path(sys.executable).with_name("py-spy")
    subprocess.run([str(pyspy), "dump", "--pid", str(sleeper.pid)], capture_output=True, timeout=30, check=True)
    # released by py-spy, the sleeper runs for a moment (longer on a loaded machine) before it
    # is back in a call
    assert until(lambda: read_syscall(sleeper.pid, sleeper.pid) is not None)
    call = read_syscall(sleeper.pid, sleeper.pid)
    assert call is not None
    waits = thread_waits(sleeper.pid)
    if call[0] == "restart_syscall":
        assert waits[0].kind is WaitKind.OTHER and waits[0].syscall == "restart_syscall"
    else:
        assert waits[0].kind is WaitKind.SLEEP


def test_a_server_waiting_on_its_listening_socket_waits_for_work(started: list[subprocess.Popen[bytes]]) -> None:
    code = (
        "import select, socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
        "p = select.poll(); p.register(s.fileno()); p.poll(60000)"
    )
    server = _start(started, code)
    wait = _blocked(server.pid, "poll")
    assert wait.kind is WaitKind.LISTEN and wait.peers == () and wait.target.startswith("socket:[")


def test_waits_of_several_processes_at_once(started: list[subprocess.Popen[bytes]]) -> None:
    a = _start(started, "import sys; sys.stdin.read()", stdin=subprocess.PIPE)
    b = _start(started, "import time; time.sleep(60)")
    _blocked(a.pid, "read")
    _blocked(b.pid, "clock_nanosleep")
    found = process_waits([a.pid, b.pid, 2**22 + 1])
    assert found[a.pid][0].kind is WaitKind.PIPE and found[b.pid][0].kind is WaitKind.SLEEP
    assert found[2**22 + 1] == ()  # no such process: nothing, no error


def test_a_poll_of_a_childs_stdout_and_stderr_waits_on_the_child(started: list[subprocess.Popen[bytes]]) -> None:
    parent = _start(
        started,
        "import subprocess, sys; "
        "subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)'], capture_output=True)",
    )
    wait = _blocked(parent.pid, "poll")
    kids = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
    assert wait.kind is WaitKind.PIPE and wait.peers == tuple(map(int, kids)) and len(kids) == 1


def test_a_unix_socket_read_names_the_process_at_the_other_end(started: list[subprocess.Popen[bytes]]) -> None:
    """A Unix socket's peer (ZMQ ipc://, a local gRPC or HTTP server) by the kernel's
    sock_diag table, as ``ss -x`` shows it."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        reader = _start(started, f"import os; os.read({theirs.fileno()}, 1)", pass_fds=(theirs.fileno(),))
        theirs.close()
        wait = _blocked(reader.pid, "read")
        assert wait.kind is WaitKind.SOCKET and wait.peers == (os.getpid(),) and wait.remote == ""
    finally:
        ours.close()
