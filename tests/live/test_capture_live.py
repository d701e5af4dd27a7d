"""Capture of real gloo jobs hung in collectives, and of processes in other network namespaces."""

from __future__ import annotations

import itertools
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.harness import RunningJob
from support.jobs import job_meta, ready_pids, running
from support.stacks import C10D, innermost_python, main_thread

from hangdoc.capture.find.discover import discover
from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.capture.read.procstate import read_state, socket_bytes, socket_bytes_many
from hangdoc.capture.read.pyspy import dump, find_pyspy
from hangdoc.capture.read.sample import sample_round
from hangdoc.model import CaptureErrorKind, ProcessState, RankProcess
from hangdoc.pipeline import CaptureOptions, diagnose

SERVER = """
import socket, sys, time
srv = socket.create_server(("0.0.0.0", 29999))
print("listening", flush=True)
conn, _ = srv.accept()
got = 0
while got < 300000:
    got += len(conn.recv(65536))
print("received", got, flush=True)
time.sleep(120)
"""
CLIENT = """
import socket, sys, time
sock = socket.create_connection((sys.argv[1], 29999))
sock.sendall(b"x" * 300000)
print("sent", flush=True)
time.sleep(120)
"""


@pytest.mark.netns
@pytest.mark.timeout(120)
def test_socket_bytes_of_processes_in_other_network_namespaces() -> None:
    from support.netns import NetnsNodes

    with NetnsNodes(2, "hdcs") as nodes:
        server = nodes.popen(0, [sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
        client = None
        try:
            assert server.stdout is not None and server.stdout.readline() == "listening\n"
            client = nodes.popen(1, [sys.executable, "-c", CLIENT, nodes.ip(0)], stdout=subprocess.PIPE, text=True)
            assert client.stdout is not None and client.stdout.readline() == "sent\n"
            assert server.stdout.readline() == "received 300000\n"
            moved = socket_bytes_many([server.pid, client.pid, os.getpid()])
        finally:
            for proc in (server, client):
                if proc is not None:
                    proc.kill()
                    proc.wait()
                    if proc.stdout is not None:
                        proc.stdout.close()
    # `ip netns exec` execs the command, so the Popen pid is the Python process itself
    assert moved[server.pid] is not None and moved[server.pid] >= 300000  # received
    assert moved[client.pid] is not None and moved[client.pid] >= 300000  # acked
    assert moved[os.getpid()] is not None  # this namespace: plain ss


# ------------------------------------------------------------------ a real hung gloo job


@pytest.fixture(scope="module")
def hung_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningJob]:
    with running("direct", tmp_path_factory.mktemp("direct")) as job:
        yield job


@pytest.fixture(scope="module")
def hung_ranks(hung_job: RunningJob) -> tuple[RankProcess, ...]:
    ranks = discover(parse_job_spec(f"127.0.0.1:{hung_job.port}")).ranks
    assert [r.pid for r in ranks] == [ready_pids(hung_job)[0], ready_pids(hung_job)[1]]
    return ranks


@pytest.mark.timeout(120)
def test_capture_of_a_job_hung_in_collectives(hung_job: RunningJob, hung_ranks: tuple[RankProcess, ...]) -> None:
    said: list[str] = []
    options = CaptureOptions(window=0.9, interval=0.3, max_window=0.9)
    snapshot, _ = diagnose(f"127.0.0.1:{hung_job.port}", options, said.append)
    assert said[0].startswith("found 2 rank processes")
    assert [s.process for s in snapshot.ranks] == list(hung_ranks)
    expected = {0: "all_reduce", 1: "barrier"}
    for snap in snapshot.ranks:
        assert len(snap.good_samples) == len(snap.samples) >= 3  # rounds until the window is over
        times = [s.t for s in snap.samples]
        assert times[0] < 0.2 and all(0 < b - a < 1.5 for a, b in itertools.pairwise(times))
        assert all(t >= i * options.interval - 0.01 for i, t in enumerate(times))  # paced from the first
        for sample in snap.samples:
            main = main_thread(sample.threads)
            assert main.frames[0].function == "<module>"
            assert main.frames[0].filename.endswith("gloo_hang.py")
            inner = innermost_python(main)
            assert (inner.function, inner.short_filename) == (expected[snap.rank], C10D)
            assert inner.code == "work.wait()"
            assert sample.state is not None
            assert sample.state.status == "sleeping"
            assert sample.state.num_threads > 1
            assert sample.state.read_chars is not None and sample.state.write_chars is not None
        # rank 0's DataLoader keeps a feeder thread; its stack is captured too
        if snap.rank == 0:
            assert "QueueFeederThread" in {t.name for t in snap.samples[0].threads}


@pytest.mark.timeout(120)
def test_native_frames_of_a_hung_rank(hung_ranks: tuple[RankProcess, ...]) -> None:
    samples = sample_round(hung_ranks, 0.0, native=True, timeout=60)
    for sample in samples:
        assert sample.error is None
        main = main_thread(sample.threads)
        natives = [f.function for f in main.frames if f.native]
        assert "c10d::Work::wait" in natives
        assert innermost_python(main).short_filename == C10D


@pytest.mark.timeout(120)
def test_slow_dump_times_out_and_leaves_the_rank_running(hung_ranks: tuple[RankProcess, ...]) -> None:
    rank = hung_ranks[0]
    before = {p.pid for p in psutil.Process().children()}
    started = time.monotonic()
    result = dump(rank.pid, native=True, timeout=0.05)  # symbolising libtorch takes ~1 s
    elapsed = time.monotonic() - started
    assert result.error is not None and result.error.kind is CaptureErrorKind.TIMEOUT
    assert "0.05s" in result.error.message
    assert elapsed < 1.0
    assert {p.pid for p in psutil.Process().children()} <= before  # py-spy was killed
    assert psutil.Process(rank.pid).status() == "sleeping"  # not left stopped
    assert dump(rank.pid).error is None


@pytest.mark.timeout(120)
def test_process_state_and_sockets_of_a_rank(hung_ranks: tuple[RankProcess, ...]) -> None:
    pid = hung_ranks[1].pid
    state = read_state(pid)
    assert isinstance(state, ProcessState)
    assert state.status == "sleeping" and state.cpu_seconds > 0 and state.num_threads > 1
    assert state.rss_bytes is not None and state.rss_bytes > 10_000_000
    assert state.ctx_switches is not None and state.ctx_switches > 0
    moved = socket_bytes(pid)
    assert moved is not None and moved > 0  # the store and the peer connections
    assert socket_bytes_many([r.pid for r in hung_ranks])[pid] == moved  # nothing moves


# ------------------------------------------------------------------ benchmark (opt-in)


def _raw_parallel_dumps(exe: str, pids: list[int]) -> float:
    started = time.perf_counter()
    procs = [subprocess.Popen([exe, "dump", "--pid", str(p), "--json"], stdout=subprocess.PIPE) for p in pids]
    for proc in procs:
        proc.communicate()
    return time.perf_counter() - started


@pytest.mark.timeout(600)
@pytest.mark.skipif(not os.environ.get("HANGDOC_BENCH"), reason="set HANGDOC_BENCH=1")
@pytest.mark.parametrize("nproc", [4, 8])
def test_sample_round_costs_at_most_1_3x_raw_parallel_pyspy(
    nproc: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.harness import launch

    monkeypatch.setenv("GLOO_HANG_CHILDREN", "0")
    with launch(job_meta("direct", nproc), tmp_path) as job:
        job.wait_ready(300)
        ranks = discover(parse_job_spec(f"127.0.0.1:{job.port}")).ranks
        pids = [r.pid for r in ranks]
        exe = find_pyspy()
        sample_round(ranks, 0.0)  # warm the source-line cache
        raw, ours = [], []
        for _ in range(15):
            raw.append(_raw_parallel_dumps(exe, pids))
            started = time.perf_counter()
            samples = sample_round(ranks, 0.0)
            ours.append(time.perf_counter() - started)
            assert all(s.error is None for s in samples)
    ratio = statistics.median(ours) / statistics.median(raw)
    print(
        f"\n{nproc} ranks: sample_round {statistics.median(ours) * 1000:.1f} ms, raw "
        f"{statistics.median(raw) * 1000:.1f} ms, ratio {ratio:.2f}"
    )
    assert ratio <= 1.3
