"""``hangdoc diagnose ray:JOB`` end to end, on a real local Ray cluster (a head and two worker
nodes, ``support.raycluster``): the CLI places its agents, finds the job's workers and
their world ranks, samples them and names the hang.

Six Ray jobs (``tests/jobs/ray/``), all submitted at once when the module starts (a Ray
Train job takes about a minute to reach its train loop) and stopped when it ends:

* three Ray Train ``TorchTrainer`` jobs (gloo, 3 workers, half a CPU each, spread over the
  nodes): rank 2 in ``all_gather`` while 0-1 ``all_reduce`` (mismatch), rank 1 blocked on a
  lock outside any collective (straggler), and one that keeps training (not hung);
* three plain-actor jobs: a driver whose actors ``w0``-``w2`` join a gloo group themselves as
  ranks 0-2 (actor order equals the rank they were given): ``w0`` in ``broadcast`` while the
  others ``all_reduce`` (mismatch), ``w2`` polling for a file (straggler), and a second
  mismatch for ``hangdoc watch ray:JOB``, which reports it and stops it with ``ray job stop``.

Each worker writes ``ready.<rank>`` (its pid) right before the call it hangs in; a test
then only runs ``python -m hangdoc diagnose ray:ID --ray-address GCS --json``, and checks
the verdict, the culprits, the ranks' pids against the markers, and that no
``HangdocAgent`` actor outlives the diagnosis.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")

from support.harness import free_port
from support.raycluster import RayCluster, ray_cluster  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(420)  # the first test that needs the jobs waits for them (~150 s)

REPO = Path(__file__).resolve().parents[3]
RAY_JOBS = REPO / "tests" / "jobs" / "ray"
READY_TIMEOUT_S = 300  # 3 Train jobs and 2 actor jobs starting at once on a small machine
DIAGNOSE_TIMEOUT_S = 180
STOP_TIMEOUT_S = 60
WATCH_TIMEOUT_S = 240  # 8 s of stall, a diagnosis, `ray job stop`, the workers seen gone


@dataclass
class RayJobUnderTest:
    name: str
    script: str
    args: list[str]
    ready_dir: Path
    submission_id: str = ""
    pids: dict[int, int] = field(default_factory=dict)  # rank -> pid, from the markers

    @property
    def job_id(self) -> str:
        """The hex Ray job id (the plain-actor drivers write it)."""
        return (self.ready_dir / "job_id").read_text().strip()


def _jobs(root: Path) -> dict[str, RayJobUnderTest]:
    def job(name: str, script: str, *args: str) -> RayJobUnderTest:
        ready = root / name
        ready.mkdir()
        return RayJobUnderTest(name, script, [*args, str(ready)], ready)

    return {
        "train_mismatch": job("train_mismatch", "train_mismatch.py"),
        "train_straggler": job("train_straggler", "train_straggler.py"),
        "train_healthy": job("train_healthy", "train_healthy.py"),
        "actors_mismatch": job("actors_mismatch", "actors_hang.py", "mismatch", str(free_port())),
        "actors_straggler": job("actors_straggler", "actors_hang.py", "straggler", str(free_port())),
        "actors_watched": job("actors_watched", "actors_hang.py", "mismatch", str(free_port())),
    }


@dataclass
class Submitted:
    client: Any  # ray.job_submission.JobSubmissionClient
    jobs: dict[str, RayJobUnderTest]


@pytest.fixture(scope="module")
def submitted(
    ray_cluster: RayCluster,
    tmp_path_factory: pytest.TempPathFactory,  # noqa: F811
) -> Iterator[Submitted]:
    """Every job of the module, submitted at once (not waited for); stopped at the end."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(ray_cluster.dashboard_url)
    jobs = _jobs(tmp_path_factory.mktemp("rayjobs"))
    try:
        for job in jobs.values():
            job.submission_id = client.submit_job(
                entrypoint=" ".join([sys.executable, str(RAY_JOBS / job.script), *job.args])
            )
        yield Submitted(client, jobs)
    finally:
        _stop(client, [job.submission_id for job in jobs.values() if job.submission_id])


def _stop(client: Any, submissions: list[str]) -> None:
    """Stop the jobs (all at once), then wait for each to end."""
    for submission in submissions:
        try:
            client.stop_job(submission)
        except Exception as exc:  # noqa: BLE001 - the cluster's shutdown ends it anyway
            print(f"stopping {submission}: {exc}")
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for submission in submissions:
        try:
            while not client.get_job_status(submission).is_terminal():
                if time.monotonic() > deadline:
                    print(f"{submission} did not stop within {STOP_TIMEOUT_S} s")
                    break
                time.sleep(0.5)
        except Exception as exc:  # noqa: BLE001
            print(f"waiting for {submission} to stop: {exc}")


@pytest.fixture(scope="module")
def ready_jobs(submitted: Submitted) -> dict[str, RayJobUnderTest]:
    """The jobs once every rank of each has written its ready marker."""
    started = time.monotonic()
    pending = dict(submitted.jobs)
    while pending:
        for name, job in list(pending.items()):
            markers = {int(p.name.split(".")[1]): int(p.read_text()) for p in job.ready_dir.glob("ready.*")}
            if len(markers) == 3 and (not job.script.startswith("actors") or (job.ready_dir / "job_id").exists()):
                job.pids = markers
                print(f"{name} ready after {time.monotonic() - started:.1f} s: pids {markers}")
                del pending[name]
                continue
            _fail_if_ended(submitted.client, job)
        if time.monotonic() - started > READY_TIMEOUT_S:
            pytest.fail(f"not ready within {READY_TIMEOUT_S} s: {sorted(pending)}")
        time.sleep(1)
    # a rank writes its marker right before the call it hangs in: let it get there
    time.sleep(3)
    return submitted.jobs


def _fail_if_ended(client: Any, job: RayJobUnderTest) -> None:
    status = client.get_job_status(job.submission_id)
    if status.is_terminal():
        logs = client.get_job_logs(job.submission_id)[-4000:]
        pytest.fail(f"job {job.name} ({job.submission_id}) ended: {status}\n{logs}")


# ------------------------------------------------------------------ running hangdoc


def diagnose(cluster: RayCluster, job: str, *extra: str) -> subprocess.CompletedProcess:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "hangdoc", "diagnose", f"ray:{job}", "--ray-address", cluster.address, "--json", *extra],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=DIAGNOSE_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    print(
        f"hangdoc diagnose ray:{job}: exit {done.returncode} in "
        f"{time.monotonic() - started:.1f} s\nstderr: {done.stderr[-3000:]}"
    )
    return done


def report_of(
    cluster: RayCluster, submitted: Submitted, job: RayJobUnderTest, spec: str | None = None
) -> dict[str, Any]:
    """Diagnose the job (still running: a hang that ended is no test of hangdoc)."""
    _fail_if_ended(submitted.client, job)
    done = diagnose(cluster, spec or job.submission_id)
    assert_no_agent_left(cluster)  # whatever the outcome
    assert done.returncode == 0, f"exit {done.returncode}\nstdout: {done.stdout[-3000:]}"
    # --json: exactly one JSON object on stdout, nothing else (docs/json-schema.md)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        pytest.fail(
            f"stdout is not one JSON object ({exc}); it starts with "
            f"{done.stdout[:400]!r}; the report in it says {_embedded(done.stdout)}"
        )
    print(
        json.dumps(
            {
                k: report.get(k)
                for k in ("verdict", "culprit_ranks", "summary", "confidence", "basis", "evidence", "notes")
            },
            indent=1,
        )
    )
    for entry in report["ranks"]:
        print(
            f"rank {entry['rank']} pid {entry['pid']} {entry['state']} "
            f"op={entry['op'] and (entry['op']['name'], entry['op']['call_site'])} "
            f"{entry['rank_source']} ({entry['rank_evidence']}): {entry['detail']}"
        )
    return report


def _embedded(stdout: str) -> str:
    """What the JSON report found inside a polluted stdout says (for the failure message)."""
    start = stdout.find("\n{")
    try:
        report = json.loads(stdout[start + 1 :]) if start >= 0 else {}
    except json.JSONDecodeError:
        return "(no report found)"
    return json.dumps({k: report.get(k) for k in ("verdict", "culprit_ranks", "summary")})


def alive_agents(cluster: RayCluster) -> list[Any]:
    from ray.util.state import list_actors

    return list_actors(
        address=cluster.dashboard_url,
        raise_on_missing_output=False,
        filters=[("class_name", "=", "HangdocAgent"), ("state", "=", "ALIVE")],
    )


def assert_no_agent_left(cluster: RayCluster) -> None:
    assert alive_agents(cluster) == []


def ranks_of(report: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {entry["rank"]: entry for entry in report["ranks"]}


def op_name(entry: dict[str, Any]) -> str | None:
    return entry["op"]["name"] if entry["op"] else None


def assert_ranks_are_the_job_s(report: dict[str, Any], job: RayJobUnderTest, source: str) -> None:
    """Ranks 0-2, each the process that wrote that rank's marker, numbered from ``source``."""
    ranks = ranks_of(report)
    assert sorted(ranks) == [0, 1, 2]
    assert {r: e["pid"] for r, e in ranks.items()} == job.pids
    assert {e["rank_source"] for e in ranks.values()} == {source}


# ------------------------------------------------------------------ the tests


def test_unknown_job_is_one_line_on_stderr(
    ray_cluster: RayCluster,  # noqa: F811
    submitted: Submitted,
) -> None:
    """Runs while the module's jobs start (it needs none of them)."""
    done = diagnose(ray_cluster, "ffffff99")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    # hangdoc's error shape (hangdoc/cli.py): one error line, then its "  help:" line
    error, *rest = done.stderr.strip().splitlines()
    assert error.startswith("hangdoc: error: ") and "ffffff99" in error, done.stderr
    assert "no ray job" in error.lower()
    assert all(line.startswith("  help: ") for line in rest), done.stderr
    said = json.loads(done.stdout)["error"]  # --json: the same error as one object
    assert said["kind"].endswith("NotFound") and said["exit_code"] == done.returncode
    assert f"hangdoc: error: {said['message']}" == error
    # the help lists the cluster's jobs: the module's own, submitted just before
    assert all(job.submission_id in said["help"] for job in submitted.jobs.values())
    assert_no_agent_left(ray_cluster)


def test_ray_train_collective_mismatch(
    ray_cluster: RayCluster,  # noqa: F811
    submitted: Submitted,
    ready_jobs: dict[str, RayJobUnderTest],
) -> None:
    job = ready_jobs["train_mismatch"]
    report = report_of(ray_cluster, submitted, job)
    assert (report["verdict"], report["culprit_ranks"]) == ("collective_mismatch", [2])
    assert "all_gather" in report["summary"] and "all_reduce" in report["summary"]
    assert_ranks_are_the_job_s(report, job, "ray")
    ranks = ranks_of(report)
    assert [op_name(ranks[r]) for r in (0, 1, 2)] == ["all_reduce", "all_reduce", "all_gather"]
    assert "train_mismatch.py" in ranks[2]["op"]["call_site"]


def test_ray_train_straggler(
    ray_cluster: RayCluster,
    submitted: Submitted,  # noqa: F811
    ready_jobs: dict[str, RayJobUnderTest],
) -> None:
    job = ready_jobs["train_straggler"]
    report = report_of(ray_cluster, submitted, job)
    assert (report["verdict"], report["culprit_ranks"]) == ("straggler", [1])
    assert "all_reduce" in report["summary"]
    assert_ranks_are_the_job_s(report, job, "ray")
    ranks = ranks_of(report)
    assert [op_name(ranks[r]) for r in (0, 1, 2)] == ["all_reduce", None, "all_reduce"]
    assert any("load_latest_shard" in line for line in report["evidence"]), report["evidence"]


def test_ray_train_healthy_job_is_not_hung(
    ray_cluster: RayCluster,  # noqa: F811
    submitted: Submitted,
    ready_jobs: dict[str, RayJobUnderTest],
) -> None:
    job = ready_jobs["train_healthy"]
    report = report_of(ray_cluster, submitted, job)
    assert (report["verdict"], report["culprit_ranks"]) == ("not_hung", [])
    assert_ranks_are_the_job_s(report, job, "ray")


def test_plain_actors_collective_mismatch(
    ray_cluster: RayCluster,  # noqa: F811
    submitted: Submitted,
    ready_jobs: dict[str, RayJobUnderTest],
) -> None:
    """Named by its hex job id; ranks in actor order (w0, w1, w2), as the report says."""
    job = ready_jobs["actors_mismatch"]
    report = report_of(ray_cluster, submitted, job, spec=job.job_id)
    assert (report["verdict"], report["culprit_ranks"]) == ("collective_mismatch", [0])
    assert "broadcast" in report["summary"] and "all_reduce" in report["summary"]
    assert_ranks_are_the_job_s(report, job, "inferred")
    ranks = ranks_of(report)
    assert [op_name(ranks[r]) for r in (0, 1, 2)] == ["broadcast", "all_reduce", "all_reduce"]
    assert all("actor order" in ranks[r]["rank_evidence"] for r in ranks)


def test_plain_actors_straggler(
    ray_cluster: RayCluster,
    submitted: Submitted,  # noqa: F811
    ready_jobs: dict[str, RayJobUnderTest],
) -> None:
    job = ready_jobs["actors_straggler"]
    report = report_of(ray_cluster, submitted, job)
    assert (report["verdict"], report["culprit_ranks"]) == ("straggler", [2])
    assert "all_reduce" in report["summary"]
    assert_ranks_are_the_job_s(report, job, "inferred")
    ranks = ranks_of(report)
    assert [op_name(ranks[r]) for r in (0, 1, 2)] == ["all_reduce", "all_reduce", None]
    assert any("wait_for_shard" in line for line in report["evidence"]), report["evidence"]


# ------------------------------------------------------------------ watch


def test_watch_reports_the_hang_and_stops_the_job_through_ray(
    ray_cluster: RayCluster,
    submitted: Submitted,  # noqa: F811
    ready_jobs: dict[str, RayJobUnderTest],
    tmp_path: Path,
) -> None:
    """``hangdoc watch ray:JOB --on-hang 'exec ray job stop {job}'`` on a hung plain-actor
    job: the stall (stacks still for 8 s) is diagnosed through the agents the watch placed,
    the report is written, the hook stops the job, the watch sees its workers gone and exits
    0; no agent actor is left."""
    from ray.job_submission import JobStatus

    job = ready_jobs["actors_watched"]
    _fail_if_ended(submitted.client, job)
    out = tmp_path / "hangs"
    ray_cli = Path(sys.executable).with_name("ray")
    stop = f"exec {ray_cli} job stop --address {ray_cluster.dashboard_url} {{job}}"
    started = time.monotonic()
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "hangdoc",
                "watch",
                f"ray:{job.submission_id}",
                "--ray-address",
                ray_cluster.address,
                "--stall-after",
                "8",
                "--check-interval",
                "2",
                "--out",
                str(out),
                "--on-hang",
                stop,
            ],
            check=False,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=WATCH_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        said = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        pytest.fail(f"hangdoc watch still running after {WATCH_TIMEOUT_S} s; it said:\n{(said or '')[-4000:]}")
    print(f"hangdoc watch: exit {done.returncode} in {time.monotonic() - started:.1f} s\nstderr: {done.stderr[-4000:]}")
    assert_no_agent_left(ray_cluster)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "HANG collective_mismatch (culprit ranks 0): " in done.stderr
    assert f"job stop --address {ray_cluster.dashboard_url} {job.submission_id}" in done.stderr
    assert "the job's rank processes are gone: stopped watching" in done.stderr
    (hang,) = out.iterdir()
    report = json.loads((hang / "report.json").read_text())
    assert (report["verdict"], report["culprit_ranks"]) == ("collective_mismatch", [0])
    assert {r: e["pid"] for r, e in ranks_of(report).items()} == job.pids
    assert submitted.client.get_job_status(job.submission_id) == JobStatus.STOPPED
