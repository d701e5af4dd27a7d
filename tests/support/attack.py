"""Attacks on a real agent, for the limit tests and ``bench/bench_agent_limits.py``.

- ``DripRanks``: "rank" processes of an unprivileged user that serve a real
  ``hangdoc.probe`` (started in the process, at the path the probe client looks for)
  whose answers drip one byte a second, each connection in a thread of its own;
- ``idle_connections``: TCP connections to 127.0.0.1 that never send a byte;
- ``FLIGHT_CLIENT``: a script that, run as that user, finds its own ranks through the
  agent and holds several ``Flight`` calls on them at once.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .paths import REPO

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]

# A rank whose probe answers one byte a second: hangdoc.probe loaded by its path (as
# `hangdoc run` loads it), its accept loop replaced by one that drips to every connection.
DRIP_RANK = """\
import importlib.util, signal, sys, threading, time
path, ready = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("hangdoc.probe", path)
probe = importlib.util.module_from_spec(spec)
sys.modules["hangdoc.probe"] = probe
spec.loader.exec_module(probe)

def drip(conn):
    with conn:
        try:
            conn.recv(64)
            conn.sendall(probe.LENGTH.pack(1 << 20))  # a 1 MiB answer, at one byte a second
            while True:
                conn.sendall(b" ")
                time.sleep(1)
        except OSError:
            pass

def serve(server):
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        threading.Thread(target=drip, args=(conn,), daemon=True).start()

probe._serve = serve
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the probe removes its socket at exit
assert probe.start() is not None, "the probe did not start"
open(ready, "w").close()
time.sleep(3600)
"""

FLIGHT_CLIENT = """\
import json, sys, threading, time
import grpc
from hangdoc.fleet.v1 import agent_pb2 as pb, agent_pb2_grpc as pb_grpc
address, job, calls, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
channel = grpc.insecure_channel(address)
stub = pb_grpc.AgentStub(channel)
pids = [r.pid for r in stub.FindRanks(pb.FindRanksRequest(job=job), timeout=30).ranks]
print(json.dumps({"pids": pids}), flush=True)
def one(i):
    t0 = time.monotonic()
    try:
        stub.Flight(pb.FlightRequest(pids=pids, timeout_seconds=timeout), timeout=timeout + 10)
        code, detail = "OK", ""
    except grpc.RpcError as err:
        code, detail = err.code().name, err.details() or ""
    print(json.dumps({"call": i, "code": code, "detail": detail, "s": round(time.monotonic() - t0, 2)}),
          flush=True)
threads = [threading.Thread(target=one, args=(i,)) for i in range(calls)]
for t in threads:
    t.start()
    time.sleep(0.05)
for t in threads:
    t.join()
"""


class DripRanks:
    """``count`` dripping ranks of one job (``127.0.0.1:PORT``), run as nobody."""

    def __init__(self, work: Path, count: int, port: int) -> None:
        work.mkdir(parents=True, exist_ok=True)
        os.chown(work, NOBODY, NOBODY)
        self.work, self.job = work, f"127.0.0.1:{port}"
        self.procs: list[subprocess.Popen] = []
        script = work / "drip_rank.py"
        script.write_text(DRIP_RANK)
        script.chmod(0o644)
        for rank in range(count):
            ready = work / f"rank{rank}.ready"
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(count),
                "LOCAL_RANK": str(rank),
            }
            self.procs.append(
                subprocess.Popen(
                    AS_NOBODY + [sys.executable, "-I", str(script), str(REPO / "hangdoc" / "probe.py"), str(ready)],
                    env=env,
                    cwd="/",
                    start_new_session=True,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        deadline = time.monotonic() + 30
        for rank, proc in enumerate(self.procs):
            while not (work / f"rank{rank}.ready").exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise AssertionError(f"drip rank {rank} never got ready (exit {proc.poll()})")
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGTERM (each rank's probe removes its socket), then SIGKILL of what is left."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


@contextmanager
def drip_ranks(work: Path, count: int, port: int) -> Iterator[DripRanks]:
    ranks = DripRanks(work, count, port)
    try:
        yield ranks
    finally:
        ranks.kill()


def flight_attack(work: Path, address: str, job: str, calls: int, timeout: float) -> subprocess.Popen:
    """``calls`` Flight calls at once by nobody on its own ranks; one JSON line per call."""
    script = work / "flight_client.py"
    script.write_text(FLIGHT_CLIENT)
    script.chmod(0o644)
    return subprocess.Popen(
        AS_NOBODY + [sys.executable, str(script), address, job, str(calls), str(timeout)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@contextmanager
def idle_connections(port: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` TCP connections to 127.0.0.1:``port`` that never send a byte (those the
    agent refuses at once are not kept)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 1024), hard))
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.settimeout(2)
            try:
                s.connect(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


def open_count(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the other end has not closed."""
    alive = 0
    for s in socks:
        s.setblocking(False)
        try:
            while s.recv(65536):  # what the agent sent (its HTTP/2 settings), then its end
                pass
        except BlockingIOError:
            alive += 1  # nothing more to read, and not closed
        except OSError:
            pass
    return alive
