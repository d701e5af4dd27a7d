"""``ray:JOB_ID`` discovery against a real local Ray cluster (a head and two worker nodes,
``support.raycluster``): a plain-actor job started by a driver script, and a Ray Train
``TorchTrainer`` (gloo, 3 workers) submitted as a Ray job whose workers block in their train
loop. Each job says what it is (pids, node ids, its own world ranks) in files the test reads;
``find_ray_job`` must agree. The cluster and both jobs end with the module, pass or fail."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from support.raycluster import RayCluster, ray_cluster  # noqa: F401  (the fixture)

from hangdoc.capture.find import ray_job
from hangdoc.capture.find.ray_job import find_ray_job
from hangdoc.capture.find.ray_workers import RayJob, parse_patterns
from hangdoc.errors import RayJobNotFound, RayUnreachable
from hangdoc.model import RankSource

pytest.importorskip("ray")
pytestmark = pytest.mark.timeout(420)  # the first test pays for the cluster's start-up

READY_TIMEOUT_S = 240  # a Train job on 2 busy cores: controller, 3 workers, torch, gloo

PLAIN_DRIVER = textwrap.dedent("""\
    import json, os, sys, time
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    address, out, *nodes = sys.argv[1:]
    ray.init(address=address, namespace="hangdoc-plain", log_to_driver=False)

    @ray.remote(num_cpus=0)
    class Trainer:
        def whoami(self):
            ctx = ray.get_runtime_context()
            return {"pid": os.getpid(), "node_id": ctx.get_node_id(),
                    "actor_id": ctx.get_actor_id()}

    actors = [Trainer.options(name=f"trainer-{i}", scheduling_strategy=
                              NodeAffinitySchedulingStrategy(nodes[i], soft=False)).remote()
              for i in range(3)]
    found = {"job_id": ray.get_runtime_context().get_job_id(),
             "actors": {f"trainer-{i}": info
                        for i, info in enumerate(ray.get([a.whoami.remote() for a in actors]))}}
    with open(out + ".tmp", "w") as f:
        json.dump(found, f)
    os.replace(out + ".tmp", out)
    while True:  # keep the job and its actors alive until the test ends it
        time.sleep(1)
""")

TRAIN_SCRIPT = textwrap.dedent("""\
    import json, os, sys, time
    import ray
    import ray.train
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    out = sys.argv[1]

    def train_loop():
        ctx = ray.train.get_context()
        me = {"world_rank": ctx.get_world_rank(), "local_rank": ctx.get_local_rank(),
              "world_size": ctx.get_world_size(), "pid": os.getpid(),
              "node_id": ray.get_runtime_context().get_node_id()}
        path = os.path.join(out, f"rank{me['world_rank']}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(me, f)
        os.replace(path + ".tmp", path)
        while True:  # "hung": the training thread never comes back
            time.sleep(1)

    ray.init()
    trainer = TorchTrainer(
        train_loop,
        scaling_config=ScalingConfig(num_workers=3, use_gpu=False),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name="hangdoc-ray-test", storage_path=os.path.join(out, "results")),
    )
    trainer.fit()
""")


def _wait_for(what: str, check: Any, timeout: float, failed: Any = lambda: None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        reason = failed()
        if reason:
            pytest.fail(f"{what}: {reason}")
        time.sleep(0.5)
    pytest.fail(f"{what}: not within {timeout:.0f} s")


# ------------------------------------------------------------------ the jobs


@pytest.fixture(scope="module")
def plain_job(
    ray_cluster: RayCluster,
    tmp_path_factory: pytest.TempPathFactory,  # noqa: F811
) -> Iterator[dict[str, Any]]:
    """A driver with 3 named actors, one on each node; what they said about themselves."""
    tmp = tmp_path_factory.mktemp("plain")
    script, out, log = tmp / "driver.py", tmp / "actors.json", tmp / "driver.log"
    script.write_text(PLAIN_DRIVER)
    with log.open("w") as sink:
        driver = subprocess.Popen(
            [sys.executable, str(script), ray_cluster.address, str(out), *ray_cluster.node_ids],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        _wait_for(
            "the plain-actor driver",
            out.exists,
            READY_TIMEOUT_S,
            lambda: driver.poll() is not None and f"exited: {log.read_text()[-2000:]}",
        )
        yield json.loads(out.read_text())
    finally:
        _end(driver)


def _end(proc: subprocess.Popen) -> None:
    """SIGTERM the driver's session (SIGKILL after 15 s): its job ends, Ray ends its actors."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def train_jobs(
    ray_cluster: RayCluster,
    tmp_path_factory: pytest.TempPathFactory,  # noqa: F811
) -> Iterator[dict[str, dict[str, Any]]]:
    """Two 3-worker TorchTrainers submitted as Ray jobs at once (6 CPUs: both fit): one
    ``tracked`` by Ray Train's state actor (RAY_TRAIN_ENABLE_STATE_TRACKING=1), one in Ray's
    default configuration (``untracked``). Each worker's own word on its rank, pid, node."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(ray_cluster.dashboard_url)
    jobs = {}
    try:
        for kind, env in (("tracked", "RAY_TRAIN_ENABLE_STATE_TRACKING=1 "), ("untracked", "")):
            tmp = tmp_path_factory.mktemp(kind)
            (tmp / "train.py").write_text(TRAIN_SCRIPT)
            jobs[kind] = {
                "dir": tmp,
                "client": client,
                "submission_id": client.submit_job(entrypoint=f"{env}{sys.executable} {tmp / 'train.py'} {tmp}"),
            }
        for kind, job in jobs.items():
            job["ranks"] = _wait_for(
                f"the {kind} Ray Train job", lambda j=job: _reports(j), READY_TIMEOUT_S, lambda j=job: _failed(j)
            )
        yield jobs
    finally:
        for job in jobs.values():
            _stop(client, job["submission_id"])


def _reports(job: dict[str, Any]) -> dict[int, dict[str, Any]] | None:
    files = sorted(job["dir"].glob("rank*.json"))
    if len(files) < 3:
        return None
    return {int(r["world_rank"]): r for r in (json.loads(f.read_text()) for f in files)}


def _failed(job: dict[str, Any]) -> str | None:
    status = job["client"].get_job_status(job["submission_id"])
    if status.is_terminal():
        return f"job {status}: {job['client'].get_job_logs(job['submission_id'])[-3000:]}"
    return None


def _stop(client: Any, submission: str) -> None:
    try:
        client.stop_job(submission)
        _wait_for("the Ray Train job to stop", lambda: client.get_job_status(submission).is_terminal(), 60)
    except Exception as exc:  # noqa: BLE001 - the cluster's shutdown ends it anyway
        print(f"stopping the Ray Train job: {exc}")


@pytest.fixture(scope="module")
def train_job(train_jobs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return train_jobs["tracked"]


# ------------------------------------------------------------------ (a) plain actors


def test_plain_actors_by_hex_job_id(
    ray_cluster: RayCluster,  # noqa: F811
    plain_job: dict[str, Any],
) -> None:
    started = time.monotonic()
    job = find_ray_job(plain_job["job_id"], address=ray_cluster.address)
    print(f"find_ray_job (plain actors, GCS address): {time.monotonic() - started:.2f} s")
    assert job.job_id == plain_job["job_id"] and job.submission_id is None
    assert [w.actor_name for w in job.workers] == ["trainer-0", "trainer-1", "trainer-2"]
    for rank, worker in enumerate(job.workers):
        said = plain_job["actors"][worker.actor_name]
        assert (worker.pid, worker.node_id, worker.actor_id) == (said["pid"], said["node_id"], said["actor_id"])
        assert psutil.pid_exists(worker.pid)
        assert worker.actor_class == "Trainer" and worker.node_ip
        assert (worker.world_rank, worker.world_size) == (rank, 3)
        assert worker.rank_source is RankSource.INFERRED
        assert worker.rank_evidence == f"actor order {rank}: not a Ray Train job"
        process = worker.to_rank_process(worker.node_ip)
        assert (process.pid, process.rank, process.rank_source) == (worker.pid, rank, RankSource.INFERRED)
    assert set(job.node_ids) == set(ray_cluster.node_ids)  # one actor on each node
    assert any("actor order" in note for note in job.notes)


@pytest.mark.parametrize("form", ["dashboard url", "dashboard host:port", "RAY_ADDRESS"])
def test_address_forms(
    ray_cluster: RayCluster,
    plain_job: dict[str, Any],  # noqa: F811
    form: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = ray_cluster.dashboard_url
    address: str | None = {
        "dashboard url": url,
        "dashboard host:port": url.removeprefix("http://"),
        "RAY_ADDRESS": None,
    }[form]
    if address is None:
        monkeypatch.setenv("RAY_ADDRESS", ray_cluster.address)
    started = time.monotonic()
    job = find_ray_job(plain_job["job_id"], address=address)
    print(f"find_ray_job ({form}): {time.monotonic() - started:.2f} s")
    assert len(job.workers) == 3


def test_an_explicit_address_wins_over_ray_address(
    ray_cluster: RayCluster,
    plain_job: dict[str, Any],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:9")  # Ray's clients would take this
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://127.0.0.1:9")
    job = find_ray_job(plain_job["job_id"], address=ray_cluster.dashboard_url)
    assert len(job.workers) == 3
    assert os.environ["RAY_API_SERVER_ADDRESS"] == "http://127.0.0.1:9"  # given back


def test_without_ray_train_its_routes_fail_fast(
    ray_cluster: RayCluster,  # noqa: F811
    plain_job: dict[str, Any],
) -> None:
    """No Train run on the cluster yet: no state actor. The dashboard says so at once and
    ``train_ranks`` comes back empty-handed, with the reason (runs before the Train job)."""
    api = ray_job.StateApi(ray_cluster.dashboard_url)
    for route in ray_job.TRAIN_RUN_ROUTES:
        started = time.monotonic()
        status, body = api.get(route, ray_job.TRAIN_STATE_TIMEOUT_S)
        print(f"{route}: HTTP {status} in {time.monotonic() - started:.2f} s")
        assert status != 200 or not json.loads(body).get("train_runs")
    found = ray_job.train_ranks(api, plain_job["job_id"], api.actors(plain_job["job_id"]))
    assert found.ranks == {} and "RAY_TRAIN_ENABLE_STATE_TRACKING=1" in found.note


# ------------------------------------------------------------------ (c) --workers


def test_worker_patterns_select_a_subset(
    ray_cluster: RayCluster,  # noqa: F811
    plain_job: dict[str, Any],
) -> None:
    job = find_ray_job(
        plain_job["job_id"], address=ray_cluster.address, patterns=parse_patterns("trainer-0, trainer-2,Nope*")
    )
    assert [(w.actor_name, w.world_rank) for w in job.workers] == [("trainer-0", 0), ("trainer-2", 1)]
    assert any("left out: Trainer 'trainer-1'" in note for note in job.notes)
    by_class = find_ray_job(plain_job["job_id"], address=ray_cluster.address, patterns=("Train*",))
    assert len(by_class.workers) == 3


# ------------------------------------------------------------------ (b) Ray Train


def _train_job(address: str, submission: str) -> RayJob:
    """The job once Ray Train's state actor has recorded its workers (it does so just after
    the train loops start)."""

    def ranked() -> RayJob | None:
        job = find_ray_job(submission, address=address)
        if all(w.rank_source is RankSource.RAY for w in job.workers):
            return job
        print(f"not yet from the run state: {job.notes}")
        return None

    return _wait_for("Ray Train's run state", ranked, 60)


def test_ray_train_world_ranks_from_the_run_state(
    ray_cluster: RayCluster,  # noqa: F811
    train_job: dict[str, Any],
) -> None:
    started = time.monotonic()
    job = _train_job(ray_cluster.dashboard_url, train_job["submission_id"])
    print(f"find_ray_job (Ray Train, dashboard URL): {time.monotonic() - started:.2f} s")
    assert job.submission_id == train_job["submission_id"]
    assert [w.world_rank for w in job.workers] == [0, 1, 2]
    for worker in job.workers:
        said = train_job["ranks"][worker.world_rank]  # what that worker itself reported
        assert (worker.pid, worker.node_id) == (said["pid"], said["node_id"])
        assert (worker.local_rank, worker.world_size) == (said["local_rank"], 3)
        assert worker.actor_class == "RayTrainWorker"
        assert worker.rank_evidence == f"Ray Train world rank {worker.world_rank} (run state)"
        assert psutil.pid_exists(worker.pid)
    assert any("run state" in note for note in job.notes)
    left_out = next(note for note in job.notes if "left out" in note)
    assert "TrainController" in left_out  # Ray Train's own actors are not workers
    # the hex job id names the same job; the GCS address reaches the same cluster
    started = time.monotonic()
    same = find_ray_job(job.job_id, address=ray_cluster.address)
    print(f"find_ray_job (Ray Train, GCS address): {time.monotonic() - started:.2f} s; notes: {same.notes}")
    assert [(w.pid, w.world_rank) for w in same.workers] == [(w.pid, w.world_rank) for w in job.workers]


def test_ray_train_world_ranks_from_the_controller_log(
    ray_cluster: RayCluster,  # noqa: F811
    train_job: dict[str, Any],
) -> None:
    """The fallback when the run state is not kept (the default): the controller's log."""
    job = _train_job(ray_cluster.dashboard_url, train_job["submission_id"])
    api = ray_job.StateApi(ray_cluster.dashboard_url)
    actors = api.actors(job.job_id)
    started = time.monotonic()
    logged = ray_job._ranks_from_controller(api, actors)
    print(f"controller log read in {time.monotonic() - started:.2f} s")
    assert {a: r.world_rank for a, r in logged.items()} == {w.actor_id: w.world_rank for w in job.workers}
    assert {r.source for r in logged.values()} == {"controller log"}


def test_ray_train_default_configuration(
    ray_cluster: RayCluster,  # noqa: F811
    train_jobs: dict[str, dict[str, Any]],
) -> None:
    """No run state kept (Ray's default): the ranks come from the controller's log."""
    untracked = train_jobs["untracked"]

    def logged() -> RayJob | None:
        job = find_ray_job(untracked["submission_id"], address=ray_cluster.address)
        return job if all(w.rank_source is RankSource.RAY for w in job.workers) else None

    started = time.monotonic()
    job = _wait_for("the controller's worker list", logged, 60)
    print(f"find_ray_job (Ray Train, untracked): {time.monotonic() - started:.2f} s; notes: {job.notes}")
    assert [w.world_rank for w in job.workers] == [0, 1, 2]
    for worker in job.workers:
        said = untracked["ranks"][worker.world_rank]
        assert (worker.pid, worker.node_id, worker.local_rank) == (said["pid"], said["node_id"], said["local_rank"])
        assert worker.rank_evidence == f"Ray Train world rank {worker.world_rank} (controller log)"
    assert "controller's log" in job.notes[0]
    assert "RAY_TRAIN_ENABLE_STATE_TRACKING=1" in job.notes[0]
    tracked_pids = {r["pid"] for r in train_jobs["tracked"]["ranks"].values()}
    assert not tracked_pids & {w.pid for w in job.workers}  # the other job's workers stay out


def test_ray_train_patterns_select_ray_s_own_actors(
    ray_cluster: RayCluster,  # noqa: F811
    train_job: dict[str, Any],
) -> None:
    job = find_ray_job(train_job["submission_id"], address=ray_cluster.address, patterns=("TrainController",))
    assert [w.actor_class for w in job.workers] == ["TrainController"]
    assert job.workers[0].rank_evidence == "actor order 0: not a worker of the Ray Train run"


# ------------------------------------------------------------------ (d) errors


def test_unknown_job_id(
    ray_cluster: RayCluster,
    plain_job: dict[str, Any],  # noqa: F811
) -> None:
    with pytest.raises(RayJobNotFound) as caught:
        find_ray_job("ffffff00", address=ray_cluster.address)
    assert "\n" not in str(caught.value) and "ffffff00" in str(caught.value)
    assert plain_job["job_id"] in caught.value.help  # the cluster's jobs are listed


@pytest.mark.parametrize("form", ["{}", "http://{}"])
def test_unreachable_address_fails_fast(form: str) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        where = f"127.0.0.1:{s.getsockname()[1]}"
    started = time.monotonic()
    with pytest.raises(RayUnreachable) as caught:
        find_ray_job("02000000", address=form.format(where))
    assert time.monotonic() - started < 10
    assert where in str(caught.value) and "\n" not in str(caught.value)
