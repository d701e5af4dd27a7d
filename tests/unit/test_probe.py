"""``hangdoc.probe`` served by a real process and read by ``capture.probe_client``: it
answers, it says what it cannot do, a process that holds the GIL costs only the timeout,
and a socket or directory that is not the process owner's private one is never read."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hangdoc.capture.probe_client import NO_PROBE, _ask, probe_flight
from hangdoc.probe import socket_dir, socket_path

pytestmark = pytest.mark.timeout(60)

SERVE = """
import re, sys, time
import hangdoc.probe
print(hangdoc.probe.start(), flush=True)
if sys.argv[1] == "gil":
    re.match(r"(a+)+$", "a" * 34 + "b")  # catastrophic backtracking: holds the GIL for minutes
time.sleep(120)
"""


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


@pytest.mark.parametrize("serving", ["idle"], indirect=True)
def test_the_probe_listens_privately_and_answers(serving: tuple[int, str]) -> None:
    pid, path = serving
    assert path == str(socket_path(os.geteuid(), pid))
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(socket_dir(os.geteuid())).st_mode & 0o777 == 0o700
    assert _ask(path, b"ping\n", 5.0) == {"ok": True, "pid": pid}
    assert _ask(path, b"reboot\n", 5.0)["ok"] is False
    record, why = probe_flight(pid)
    assert record is None and why == "its probe says: torch.distributed is not initialised in this process"


@pytest.mark.parametrize("serving", ["gil"], indirect=True)
def test_a_process_holding_the_gil_costs_the_timeout_and_is_said(serving: tuple[int, str]) -> None:
    pid, _path = serving
    time.sleep(0.5)  # into the regular expression
    started = time.monotonic()
    record, why = probe_flight(pid, timeout=1.5)
    assert record is None and "did not answer within 1.5 s" in why
    assert time.monotonic() - started < 5


def test_no_probe_is_the_common_case_not_an_error() -> None:
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as proc:
        try:
            record, why = probe_flight(proc.pid)
            assert record is None and why.startswith(NO_PROBE)
        finally:
            proc.kill()


@pytest.mark.parametrize("serving", ["idle"], indirect=True)
def test_a_directory_others_may_write_is_never_read(serving: tuple[int, str]) -> None:
    pid, _path = serving
    directory = socket_dir(os.geteuid())
    mode = os.stat(directory).st_mode & 0o777
    os.chmod(directory, 0o777)
    try:
        record, why = probe_flight(pid)
        assert record is None and "is not a private directory" in why
        assert subprocess.run([sys.executable, "-c", "import hangdoc.probe as p; print(p.start())"],
                              check=False, capture_output=True, text=True, timeout=30).stdout.strip() == "None"
    finally:
        os.chmod(directory, mode)


def test_a_file_in_place_of_the_socket_is_never_read(tmp_path: Path) -> None:
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as proc:
        planted = socket_path(os.geteuid(), proc.pid)
        planted.parent.mkdir(mode=0o700, exist_ok=True)
        planted.write_text('{"ok": true}')
        try:
            record, why = probe_flight(proc.pid)
            assert record is None and "is not a socket of the process's user" in why
        finally:
            planted.unlink()
            proc.kill()
