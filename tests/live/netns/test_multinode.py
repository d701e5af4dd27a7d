"""Multi-node diagnosis for real: 3 nodes (network + PID namespaces), an agent per node.

Each class shares one cluster (one hung gloo job spread over the nodes, see
``multinode.py``) between its tests; the cluster is killed and its namespaces deleted when
the class is done, and the teardown checks that nothing of it is left.
"""

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
from support.harness import JOBS_DIR
from support.multinode import REPO, TLS_AGENT_PORT, Cluster, ClusterJob, assert_clean, cluster
from support.paths import TESTS

pytestmark = [pytest.mark.timeout(240)]

MISMATCH = ClusterJob(
    JOBS_DIR / "mismatch_uneven_shards_eval_gather.py",
    placement=((0,), (1, 2), (3,)),
    verdict="collective_mismatch",
    culprits=(2,),
)
# Its ranks mark ready before the first batch; under load, forking 10 DataLoader workers on
# 2 cores takes seconds more before every rank sits in the first all_reduce.
STRAGGLER = ClusterJob(
    JOBS_DIR / "straggler_forked_worker_lock.py",
    placement=((0, 1), (2, 3), (4,)),
    verdict="straggler",
    culprits=(1,),
    settle=6.0,
)
TRANSPORT = ClusterJob(
    JOBS_DIR / "nccl_timeout_teacher_broadcast.py",
    placement=((0, 1), (2,), (3,)),
    verdict="nccl_timeout",
    culprits=(),
    cut=True,
    settle=3.0,
)


@pytest.fixture(autouse=True)
def _root_only() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for network and PID namespaces")


def _running(job: ClusterJob, tmp_path_factory, tls: bool = False) -> Iterator[Cluster]:
    with cluster(job, tmp_path_factory.mktemp(job.script.stem), tls=tls) as running:
        running.wait_ready()
        yield running
        tag, prefix = running.tag, running.nodes.prefix
    assert_clean(tag, prefix)


def report_of(out: subprocess.CompletedProcess) -> dict:
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stderr[-3000:]}"
    return json.loads(out.stdout)


def assert_diagnosis(report: dict, job: ClusterJob) -> None:
    why = f"{report['summary']}\n" + "\n".join(report["evidence"])
    assert report["verdict"] == job.verdict, why
    assert report["culprit_ranks"] == sorted(job.culprits), why
    hosts = {r["rank"]: r["host"] for r in report["ranks"]}
    assert hosts == {rank: f"node{job.node_of(rank)}" for rank in range(job.world)}, why
    assert report["unreachable"] == []


def _assert_part_of_the_job(report: dict) -> None:
    """Ranks 1-2 seen of 4: the others are not seen, never missing, and no verdict about them
    is above low confidence."""
    why = f"{report['summary']}\n" + "\n".join(report["evidence"])
    assert report["scope"]["world_size"] == 4 and not report["scope"]["whole"], report["scope"]
    assert report["scope"]["absent"] == [] and report["scope"]["not_seen"] == [[0, 0], [3, 3]], report["scope"]
    assert report["verdict"] != "rank_missing" and not any(r["state"] == "missing" for r in report["ranks"]), why
    assert report["confidence"] == "low", why


def _wrong_token(tmp_path) -> Path:
    wrong = tmp_path / "wrong"
    wrong.write_text("f" * 40)
    wrong.chmod(0o600)
    return wrong


def _assert_refused(out: subprocess.CompletedProcess, word: str = "refused") -> None:
    assert out.returncode == 7, f"exit {out.returncode}: {out.stderr}"
    assert word in out.stderr and "Traceback" not in out.stderr, out.stderr
    error = json.loads(out.stdout)["error"]  # --json: one error object on stdout
    assert error["kind"] == "AgentError" and error["exit_code"] == 7 and word in error["message"]


def with_token(c: Cluster) -> tuple[str, ...]:
    return ("--agents", c.agents(), "--token-file", str(c.token_file))


def watch_until_report(c: Cluster, out: Path) -> tuple[Path, str]:
    """``hangdoc watch JOB --agents ...`` until it writes a report; then stop it (attach
    mode, --on-hang report: the job is left alone). Returns report.json and stderr."""
    watch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hangdoc",
            "watch",
            c.job_spec(),
            *with_token(c),
            "--stall-after",
            "2",
            "--check-interval",
            "1",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 90
        while not list(out.glob("hang-*/report.json")) and time.monotonic() < deadline and watch.poll() is None:
            time.sleep(0.3)
    finally:
        watch.terminate()
        _, err = watch.communicate(timeout=30)
    reports = list(out.glob("hang-*/report.json"))
    assert len(reports) == 1, f"expected one report, found {reports}\n{err[-3000:]}"
    return reports[0], err


class TestCollectiveMismatch:
    @pytest.fixture(scope="class")
    @classmethod
    def mc(cls, tmp_path_factory) -> Iterator[Cluster]:
        yield from _running(MISMATCH, tmp_path_factory, tls=True)

    def test_verdict_culprit_and_host_of_every_rank(self, mc: Cluster) -> None:
        out, _ = mc.diagnose(*with_token(mc))
        report = report_of(out)
        assert_diagnosis(report, MISMATCH)
        assert not any("other nodes" in n for n in report["notes"]), report["notes"]  # all asked

    def test_watch_through_agents_fires_on_the_hung_job(self, mc: Cluster, tmp_path) -> None:
        report_path, err = watch_until_report(mc, tmp_path / "hangs")
        report = json.loads(report_path.read_text())
        assert_diagnosis(report, MISMATCH)
        assert report["watch"]["signal"] == "stacks", err
        assert "HANG collective_mismatch" in err
        assert (report_path.parent / "snapshot.json.gz").exists()
        out2, _ = mc.diagnose(*with_token(mc))  # still there, still hung: watch did not touch it
        assert_diagnosis(report_of(out2), MISMATCH)

    def test_an_agent_sees_only_its_own_node(self, mc: Cluster) -> None:
        out, _ = mc.diagnose("--agents", mc.agent_address(1), "--token-file", str(mc.token_file))
        report = report_of(out)
        found = {r["rank"]: r["host"] for r in report["ranks"] if r["pid"] is not None}
        assert found == {1: "node1", 2: "node1"}, report["ranks"]
        _assert_part_of_the_job(report)
        (note,) = [n for n in report["notes"] if "other nodes" in n]  # once, not per agent
        assert note.startswith("ranks 1-2 of 4 are on the nodes asked"), note

    def test_one_node_without_agents_concludes_nothing_about_the_others(self, mc: Cluster) -> None:
        """`hangdoc diagnose` run on node1 itself, no agents: ranks 0 and 3 live on the other
        nodes, which nobody searched."""
        import psutil

        node_init = psutil.Process(mc.supervisors[1].pid).children()[0].pid  # PID 1 of node1
        out = subprocess.run(
            [
                "nsenter",
                "-t",
                str(node_init),
                "-p",
                "-m",
                "-n",
                sys.executable,
                "-m",
                "hangdoc",
                "diagnose",
                mc.job_spec(),
                "--json",
                "-q",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            check=False,
        )
        report = report_of(out)
        assert report["scope"]["seen"] == [[1, 2]], report["scope"]
        _assert_part_of_the_job(report)
        assert any("--agents NODE:7420" in e or "hangdoc agent" in e for e in report["evidence"] + report["notes"]), (
            report["evidence"]
        )

    def test_wrong_token_is_refused_by_one_agent(self, mc: Cluster, tmp_path) -> None:
        out, _ = mc.diagnose("--agents", mc.agent_address(0), "--token-file", str(_wrong_token(tmp_path)))
        _assert_refused(out)

    def test_wrong_token_is_refused_by_every_agent(self, mc: Cluster, tmp_path) -> None:
        out, _ = mc.diagnose("--agents", mc.agents(), "--token-file", str(_wrong_token(tmp_path)))
        _assert_refused(out)

    def test_mutual_tls_end_to_end(self, mc: Cluster) -> None:
        tls = mc.tls
        out, _ = mc.diagnose(
            "--agents",
            mc.agents(TLS_AGENT_PORT),
            "--tls-cert",
            str(tls.client_cert),
            "--tls-key",
            str(tls.client_key),
            "--tls-ca",
            str(tls.ca),
        )
        assert_diagnosis(report_of(out), MISMATCH)

    def test_tls_client_without_certificate_is_refused_by_one_agent(self, mc: Cluster) -> None:
        out, _ = mc.diagnose("--agents", mc.agent_address(0, TLS_AGENT_PORT), "--tls-ca", str(mc.tls.ca))
        _assert_refused(out, word="unavailable")

    def test_tls_client_without_certificate_is_refused_by_every_agent(self, mc: Cluster) -> None:
        out, _ = mc.diagnose("--agents", mc.agents(TLS_AGENT_PORT), "--tls-ca", str(mc.tls.ca))
        _assert_refused(out, word="unavailable")

    def test_stopped_agent_is_unreachable_within_the_deadline(self, mc: Cluster) -> None:
        pid = mc.agent_pid(2)
        os.kill(pid, signal.SIGSTOP)  # the agent, not the ranks: its node stops answering
        try:
            out, seconds = mc.diagnose(*with_token(mc), "--timeout", "2", timeout=60)
        finally:
            os.kill(pid, signal.SIGCONT)
        report = report_of(out)
        assert seconds < 15, f"diagnose took {seconds:.1f}s with a stopped agent"
        assert [u["target"] for u in report["unreachable"]] == [mc.agent_address(2)], report
        assert report["verdict"] != "rank_missing", report["summary"]
        assert 3 not in report["culprit_ranks"], report["summary"]
        assert report["partial"] is True, report["summary"]
        # SIGCONT: the agent answers again.
        out, _ = mc.diagnose(*with_token(mc))
        assert_diagnosis(report_of(out), MISMATCH)


class TestStraggler:
    @pytest.fixture(scope="class")
    @classmethod
    def sc(cls, tmp_path_factory) -> Iterator[Cluster]:
        yield from _running(STRAGGLER, tmp_path_factory)

    def test_verdict_culprit_and_host_of_every_rank(self, sc: Cluster) -> None:
        out, _ = sc.diagnose(*with_token(sc))
        assert_diagnosis(report_of(out), STRAGGLER)

    def test_killed_agent_is_named_and_its_ranks_are_not_blamed(self, sc: Cluster) -> None:
        # Last test of the class: node1 keeps running its ranks but has no agent any more.
        os.kill(sc.agent_pid(1), signal.SIGKILL)
        out, _ = sc.diagnose(*with_token(sc))
        report = report_of(out)
        why = f"{report['summary']}\n" + "\n".join(report["evidence"])
        assert [u["target"] for u in report["unreachable"]] == [sc.agent_address(1)], why
        assert report["verdict"] != "rank_missing", why
        assert not {2, 3} & set(report["culprit_ranks"]), why
        assert report["partial"] is True, why
        assert "partial" in report["summary"], why
        assert {r["host"] for r in report["ranks"] if r["rank"] in (0, 1, 4)} == {"node0", "node2"}


BEATING = ClusterJob(
    TESTS / "watchjobs" / "beating_mismatch.py",
    placement=((0,), (1,), (2,)),
    verdict="collective_mismatch",
    culprits=(2,),
)


class TestWatchWithHeartbeatsThroughAgents:
    @pytest.fixture(scope="class")
    @classmethod
    def bc(cls, tmp_path_factory) -> Iterator[Cluster]:
        # the ranks inherit it: their records land in a test directory, not in /dev/shm
        os.environ["HANGDOC_HEARTBEAT_DIR"] = str(tmp_path_factory.mktemp("heartbeats"))
        try:
            yield from _running(BEATING, tmp_path_factory)
        finally:
            del os.environ["HANGDOC_HEARTBEAT_DIR"]

    def test_heartbeats_of_every_node_drive_the_watchdog(self, bc: Cluster, tmp_path) -> None:
        report_path, err = watch_until_report(bc, tmp_path / "hangs")
        report = json.loads(report_path.read_text())
        assert_diagnosis(report, BEATING)
        w = report["watch"]
        assert w["signal"] == "heartbeat", err
        assert w["last_step"] == 5
        assert w["details"] == [
            f"rank {r} (pid {p['pid']} on node{r}): last heartbeat {_age(w, r)} s ago at step 5, inside a step"
            for r, p in sorted((p["rank"], p) for p in report["ranks"])
        ], w["details"]


def _age(watch: dict, rank: int) -> str:
    """The age the report printed for ``rank`` (the test checks everything else of the line)."""
    line = next(d for d in watch["details"] if d.startswith(f"rank {rank} "))
    return line.split("last heartbeat ")[1].split(" s ago")[0]


class TestTransportHang:
    @pytest.fixture(scope="class")
    @classmethod
    def tc(cls, tmp_path_factory) -> Iterator[Cluster]:
        yield from _running(TRANSPORT, tmp_path_factory)

    def test_verdict_and_host_of_every_rank(self, tc: Cluster) -> None:
        out, _ = tc.diagnose(*with_token(tc))
        assert_diagnosis(report_of(out), TRANSPORT)


REMOTE_SERVICE = ClusterJob(
    TESTS / "jobs" / "beyond" / "straggler_reward_service_on_another_node.py",
    placement=((0,), (1,)),
    verdict="straggler",
    culprits=(0,),
    settle=3.0,
)


class TestWaitOnAnotherNode:
    """Rank 0 (node0) reads from a reward service rank 1 started on node1: the wait leaves
    node0 as a TCP connection, node1's agent names the process holding its other end."""

    @pytest.fixture(scope="class")
    @classmethod
    def rc(cls, tmp_path_factory) -> Iterator[Cluster]:
        yield from _running(REMOTE_SERVICE, tmp_path_factory)

    def test_the_root_cause_is_the_service_on_the_other_node(self, rc: Cluster) -> None:
        out, _ = rc.diagnose(*with_token(rc), "--max-window", "4")
        report = report_of(out)
        assert_diagnosis(report, REMOTE_SERVICE)
        root = report["root_cause"]
        assert root is not None, report["evidence"]
        assert root["host"] == "node1" and root["rank"] is None and root["thread"] == "reward-model", root
        assert "--serve" in root["command"], root
        link = root["chain"][1]
        assert link["rank"] == 0 and link["waits"] == "socket" and link["on"] == f"pid {root['pid']} on node1"
        assert "the agent on node1 names" in link["how"] and link["certain"], link
