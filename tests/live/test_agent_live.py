"""Real `hangdoc agent` processes on loopback, a real hung gloo job, diagnosed through gRPC."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.agents import REPO, Agent, start_agent
from support.harness import JOBS_DIR, launch, load_meta

TOKEN = "0123456789abcdef0123456789abcdef"
JOB = JOBS_DIR / "mismatch_uneven_shards_eval_gather.py"

pytestmark = [pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def token_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


SECRET = "s3cret-value-that-must-not-leave-the-node"


@pytest.fixture(scope="module")
def hung_job(tmp_path_factory) -> Iterator:
    meta = load_meta(JOB)
    os.environ["NCCL_IB_PASSWORD"] = SECRET  # inherited by the ranks; NCCL_* is captured
    try:
        with launch(meta, tmp_path_factory.mktemp("job")) as job:
            job.wait_ready()
            yield meta, job
    finally:
        del os.environ["NCCL_IB_PASSWORD"]


@pytest.fixture(scope="module")
def agent(tmp_path_factory, token_file) -> Iterator[Agent]:
    with start_agent(
        tmp_path_factory.mktemp("agent"),
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        str(token_file),
        "--node-name",
        "node-a",
        "--open-health",
    ) as a:
        yield a


def diagnose(spec: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hangdoc", "diagnose", spec, "--json", "-q", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=False,
    )


def test_diagnosis_through_an_agent_matches_local(hung_job, agent, token_file) -> None:
    meta, job = hung_job
    out = diagnose(job.job_spec(), "--agents", agent.address, "--token-file", str(token_file))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["verdict"] == meta.verdict
    assert report["culprit_ranks"] == sorted(meta.culprits)
    assert {r["host"] for r in report["ranks"]} == {"node-a"}
    assert report["unreachable"] == []


def test_wrong_token_is_refused(hung_job, agent, tmp_path) -> None:
    _, job = hung_job
    wrong = tmp_path / "wrong"
    wrong.write_text("f" * 32)
    wrong.chmod(0o600)
    out = diagnose(job.job_spec(), "--agents", agent.address, "--token-file", str(wrong))
    assert out.returncode == 7
    assert "refused" in out.stderr and "Traceback" not in out.stderr


def test_no_token_is_refused(hung_job, agent) -> None:
    _, job = hung_job
    out = diagnose(job.job_spec(), "--agents", agent.address)
    assert out.returncode == 7 and "token" in out.stderr


def test_down_agent_is_named_and_the_rest_diagnosed(hung_job, agent, token_file) -> None:
    meta, job = hung_job
    dead = "127.0.0.1:9"  # discard port: nothing listens there
    out = diagnose(job.job_spec(), "--agents", f"{agent.address},{dead}", "--token-file", str(token_file))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["verdict"] == meta.verdict
    assert report["culprit_ranks"] == sorted(meta.culprits)
    assert [u["target"] for u in report["unreachable"]] == [dead]


def test_non_loopback_without_auth_is_refused(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hangdoc", "agent", "--listen", "0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert out.returncode == 2
    assert "refusing to listen" in out.stderr and "Traceback" not in out.stderr


def test_agent_exits_cleanly_on_sigterm_and_health_needs_token_by_default(tmp_path, token_file) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with start_agent(tmp_path, "--listen", "127.0.0.1:0", "--token-file", str(token_file)) as a:
        with grpc.insecure_channel(a.address) as channel, pytest.raises(grpc.RpcError) as err:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        a.proc.send_signal(signal.SIGTERM)
        assert a.proc.wait(timeout=20) == 0


def test_agent_never_returns_secrets(hung_job, agent, token_file, tmp_path) -> None:
    _, job = hung_job
    saved = tmp_path / "snap.json"
    out = diagnose(job.job_spec(), "--agents", agent.address, "--token-file", str(token_file), "--save", str(saved))
    assert out.returncode == 0, out.stderr
    text = saved.read_text()
    assert '"NCCL_IB_PASSWORD"' in text  # the variable was captured ...
    assert SECRET not in text and SECRET not in out.stdout  # ... and redacted on the agent
    assert TOKEN not in text and TOKEN not in out.stdout


def test_health_answers_without_token_and_sources_only_for_captured_files(agent, tmp_path) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from hangdoc.fleet.v1 import agent_pb2 as pb
    from hangdoc.fleet.v1 import agent_pb2_grpc as pb_grpc

    with grpc.insecure_channel(agent.address) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        private = tmp_path / "private.txt"
        private.write_text("not for callers\n")
        stub = pb_grpc.AgentStub(channel)
        reply = stub.SampleSources(
            pb.SampleSourcesRequest(frames=[pb.Frame(function="f", filename=str(private), line=1)]),
            timeout=10,
            metadata=(("authorization", f"Bearer {TOKEN}"),),
        )
        assert list(reply.files) == []


def test_agent_survives_many_concurrent_and_abandoned_calls(hung_job, agent, token_file) -> None:
    import concurrent.futures as cf

    from hangdoc.capture.find.jobspec import parse_job_spec
    from hangdoc.fleet.client import AgentAuth, AgentError, RemoteNode

    _, job = hung_job
    node = RemoteNode(agent.address, AgentAuth(TOKEN))
    procs = list(node.find_ranks(parse_job_spec(job.job_spec())).ranks)

    def sample(i: int) -> int:
        # every third caller gives up almost at once: the agent sees it disconnect mid-call
        timeout = 0.001 if i % 3 == 0 else 10.0
        try:
            return len(node.sample(procs, float(i), native=False, timeout=timeout))
        except AgentError:
            return -1

    with cf.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(sample, range(48)))
    assert results.count(len(procs)) >= 32  # every patient caller got every rank
    assert node.info().host == "node-a"  # and the agent is still up
    node.close()


def test_schema_mismatch_is_a_clear_error() -> None:
    from concurrent import futures

    import grpc

    from hangdoc.fleet.client import AgentError, RemoteNode
    from hangdoc.fleet.v1 import agent_pb2 as pb
    from hangdoc.fleet.v1 import agent_pb2_grpc as pb_grpc

    class FutureAgent(pb_grpc.AgentServicer):
        def GetInfo(self, request, context):
            return pb.AgentInfo(hangdoc_version="9.0.0", schema_version=99, host="future")

    server = grpc.server(futures.ThreadPoolExecutor(2))
    pb_grpc.add_AgentServicer_to_server(FutureAgent(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with pytest.raises(AgentError, match="schema 99.*same hangdoc version"):
            RemoteNode(f"127.0.0.1:{port}").info()
    finally:
        server.stop(0)


def test_heartbeats_only_of_ranks_the_agent_found(agent, token_file, tmp_path) -> None:
    from support.harness import free_port

    from hangdoc.capture.find.jobspec import parse_job_spec
    from hangdoc.fleet.client import AgentAuth, RemoteNode

    port = free_port()
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK="0",
        WORLD_SIZE="1",
        HANGDOC_HEARTBEAT_DIR=str(tmp_path / "hb"),
    )
    code = "import hangdoc, time\nfor s in range(3):\n    with hangdoc.step(s): pass\ntime.sleep(60)"
    rank = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO)
    node = RemoteNode(agent.address, AgentAuth(TOKEN))
    try:
        time.sleep(1.0)
        assert node.heartbeats([rank.pid]) == {}  # not found yet: the agent will not look
        found = node.find_ranks(parse_job_spec(f"127.0.0.1:{port}"))
        assert [p.pid for p in found.ranks] == [rank.pid]
        beats = node.heartbeats([rank.pid, os.getpid()])
        assert set(beats) == {rank.pid}
        assert beats[rank.pid].step == 2 and not beats[rank.pid].in_step and beats[rank.pid].beats == 6
        assert 0 < beats[rank.pid].age_seconds < 30
        assert "heartbeats" in node.info().features
    finally:
        node.close()
        rank.kill()
        rank.wait()


def test_an_agents_error_keeps_its_kind_and_help(agent, tmp_path) -> None:
    """A spec that takes in two jobs on the agent's node: the user gets MultipleJobs with
    its per-job help (exit 2), as on one node, not a bare agent failure (exit 7)."""
    from support.harness import free_port

    sleeper = "import time; time.sleep(120)"
    script = (
        " ".join(
            f"MASTER_ADDR=127.0.0.1 MASTER_PORT={port} RANK={rank} WORLD_SIZE=2 {sys.executable} -c '{sleeper}' &"
            for port in (free_port(), free_port())
            for rank in (0, 1)
        )
        + " wait"
    )
    shell = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(__import__("psutil").Process(shell.pid).children()) < 4:
            assert time.monotonic() < deadline, "the four sleepers did not start"
            time.sleep(0.1)
        time.sleep(0.5)
        out = diagnose(f"pid:{shell.pid}", "--agents", agent.address, "--token-file", str(_token(tmp_path)))
        assert out.returncode == 2, out.stderr
        error = json.loads(out.stdout)["error"]
        assert error["kind"] == "MultipleJobs"
        assert "holds the ranks of 2 jobs" in error["message"]
        assert "hangdoc diagnose 127.0.0.1:" in error["help"]  # the per-job example made it through
    finally:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()


def _token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN)
    path.chmod(0o600)
    return path
