"""``hangdoc.capture.ray_job`` without a cluster: patterns, worker selection, where ranks come
from (Ray Train's run state, its controller's log, actor order), job resolution and errors.
The same code against a real multi-node Ray cluster: tests/live/ray/test_ray_discovery.py."""

from __future__ import annotations

import sys
import time

import pytest

from hangdoc.capture import ray_job
from hangdoc.capture.ray_job import (
    ActorInfo,
    JobInfo,
    RayWorker,
    TrainRank,
    TrainRanks,
    actor_order,
    dashboard_url,
    number_workers,
    parse_patterns,
    ranks_from_controller_log,
    ranks_from_train_runs,
    ray_address,
    resolve_job,
    select_actors,
)
from hangdoc.errors import (
    JobNotFound,
    RayJobNotFound,
    RayNotInstalled,
    RayUnreachable,
    RayWorkersNotFound,
)
from hangdoc.model import RankProcess, RankSource

pytestmark = pytest.mark.timeout(30)

NODE_A, NODE_B = "a" * 56, "b" * 56
JOB = "02000000"


def actor(actor_id: str, cls: str = "RayTrainWorker", name: str = "", pid: int = 100,
          node: str = NODE_A, ip: str = "10.0.0.1") -> ActorInfo:
    return ActorInfo(actor_id, cls, name, pid, node, ip)


W0, W1, W2 = (actor(f"w{i}", pid=100 + i, node=(NODE_A, NODE_B, NODE_B)[i]) for i in range(3))
CONTROLLER = actor("ctl", "TrainController", pid=90)
SYNC = actor("sync", "SynchronizationActor", pid=91)
AGENT = actor("agent", "HangdocAgent", name="hangdoc-agent-x", pid=92)


# ------------------------------------------------------------------ patterns


@pytest.mark.parametrize(("text", "expected"), [
    ("RayTrainWorker", ("RayTrainWorker",)),
    (" RayTrainWorker , Trainer* ,", ("RayTrainWorker", "Trainer*")),
    ("a,,b", ("a", "b")),
    ("", ()),
    (" , ", ()),
])
def test_parse_patterns(text: str, expected: tuple[str, ...]) -> None:
    assert parse_patterns(text) == expected


def test_patterns_match_class_or_name_case_sensitively() -> None:
    named = actor("x", "Trainer", name="worker-3")
    actors = [named, W0, CONTROLLER]
    assert select_actors(actors, ["worker-*"]) == (named,)
    assert select_actors(actors, ["Train*"]) == (named, CONTROLLER)
    assert select_actors(actors, ["trainer"]) == ()
    assert select_actors(actors, ["TrainController"]) == (CONTROLLER,)  # asked for: taken


# ------------------------------------------------------------------ default selection


def test_default_takes_the_train_run_workers() -> None:
    stray = actor("old", pid=5)  # a RayTrainWorker the run does not list
    actors = [CONTROLLER, W0, W1, SYNC, stray, W2]
    assert select_actors(actors, [], {"w0", "w1", "w2"}) == (W0, W1, W2)


def test_default_without_run_state_takes_ray_train_workers() -> None:
    assert select_actors([CONTROLLER, W1, SYNC, W0, AGENT], []) == (W1, W0)


def test_default_without_ray_train_takes_all_but_ray_and_hangdoc() -> None:
    mine = [actor("p1", "Trainer", name="t1"), actor("p2", "ParamServer")]
    supervisor = actor("sup", "JobSupervisor")
    assert select_actors([supervisor, *mine, AGENT, SYNC], []) == tuple(mine)


def test_actor_order_is_natural_by_name_then_class_and_id() -> None:
    named = [actor(f"id{n}", "T", name=f"w{n}") for n in (10, 2, 1)]
    unnamed = [actor("zz", "B"), actor("aa", "B"), actor("mm", "A")]
    ordered = actor_order([*unnamed, *named])
    assert [a.name or a.actor_id for a in ordered] == ["w1", "w2", "w10", "mm", "aa", "zz"]


# ------------------------------------------------------------------ numbering


def test_ranks_from_ray_train() -> None:
    train = TrainRanks({"w0": TrainRank(2, 0, 3, "run state"), "w1": TrainRank(0, 0, 3, "run state"),
                        "w2": TrainRank(1, 1, 3, "run state")}, "world ranks read from X")
    workers, notes = number_workers([W0, W1, W2], train, train_job=True)
    assert [(w.actor_id, w.world_rank, w.local_rank) for w in workers] == [
        ("w1", 0, 0), ("w2", 1, 1), ("w0", 2, 0)]
    assert {w.rank_source for w in workers} == {RankSource.RAY}
    assert workers[2].rank_evidence == "Ray Train world rank 2 (run state)"
    assert all(w.world_size == 3 for w in workers)
    assert notes == ("world ranks read from X",)


def test_actor_order_when_ray_train_state_is_missing() -> None:
    why = "Ray Train's run state was not found (set RAY_TRAIN_ENABLE_STATE_TRACKING=1 ...)"
    workers, notes = number_workers([W2, W0, W1], TrainRanks({}, why), train_job=True)
    assert [(w.actor_id, w.world_rank) for w in workers] == [("w0", 0), ("w1", 1), ("w2", 2)]
    assert {w.rank_source for w in workers} == {RankSource.INFERRED}
    assert workers[2].rank_evidence == "actor order 2: Ray Train run state not available"
    assert len(notes) == 1 and "actor order" in notes[0] and why in notes[0]
    assert all(w.world_size == 3 and w.local_rank is None for w in workers)


def test_actor_order_for_a_job_without_ray_train() -> None:
    mine = [actor("b", "Trainer", name="t1"), actor("a", "Trainer", name="t0")]
    workers, notes = number_workers(mine, TrainRanks({}, ""), train_job=False)
    assert [(w.actor_name, w.world_rank) for w in workers] == [("t0", 0), ("t1", 1)]
    assert workers[0].rank_evidence == "actor order 0: not a Ray Train job"
    assert "not a Ray Train job" in notes[0]


def test_selected_actors_outside_the_run_have_no_rank() -> None:
    extra = actor("x", "Evaluator", name="eval")
    train = TrainRanks({"w0": TrainRank(0, 0, 1, "controller log")}, "from the log")
    workers, notes = number_workers([extra, W0], train, train_job=True)
    assert [(w.actor_id, w.world_rank, w.rank_source) for w in workers] == [
        ("w0", 0, RankSource.RAY), ("x", None, None)]
    assert "Evaluator 'eval'" in notes[1]


def test_to_rank_process() -> None:
    worker = RayWorker(pid=4242, node_id=NODE_B, node_ip="10.0.0.2", actor_id="w", actor_class="C",
                       actor_name="", world_rank=3, world_size=4, local_rank=1,
                       rank_evidence="Ray Train world rank 3 (run state)",
                       rank_source=RankSource.RAY)
    assert worker.to_rank_process("node-b") == RankProcess(
        pid=4242, host="node-b", rank=3, rank_source=RankSource.RAY,
        rank_evidence="Ray Train world rank 3 (run state)", world_size=4, local_rank=1)


# ------------------------------------------------------------------ Ray Train's record


def _v2_worker(actor_id: str, rank: int, pid: int) -> dict:
    return {"actor_id": actor_id, "world_rank": rank, "local_rank": rank % 2, "node_rank": 0,
            "node_id": NODE_A, "node_ip": "10.0.0.1", "pid": pid, "gpu_ids": []}


def test_train_v2_run_state_takes_the_latest_attempt_of_the_live_run() -> None:
    old_attempt = {"attempt_id": "a1", "start_time_ns": 1,
                   "workers": [_v2_worker("dead0", 0, 1), _v2_worker("dead1", 1, 2)]}
    new_attempt = {"attempt_id": "a2", "start_time_ns": 2,
                   "workers": [_v2_worker("w1", 0, 101), _v2_worker("w0", 1, 100)]}
    payload = {"train_runs": [
        {"id": "r1", "name": "mine", "job_id": JOB.upper(), "start_time_ns": 5,
         "attempts": [new_attempt, old_attempt]},
        {"id": "r0", "name": "other-job", "job_id": "03000000", "start_time_ns": 9,
         "attempts": [{"start_time_ns": 3, "workers": [_v2_worker("w0", 7, 100)]}]},
    ]}
    found = ranks_from_train_runs(payload, JOB, ["w0", "w1", "ctl"], "/api/train/v2/runs/v1")
    assert found.ranks == {"w1": TrainRank(0, 0, 2, "run state"),
                           "w0": TrainRank(1, 1, 2, "run state")}
    assert "/api/train/v2/runs/v1" in found.note and "mine" in found.note


def test_train_v1_run_state_and_finished_runs() -> None:
    finished = {"name": "first", "job_id": JOB, "start_time_ms": 1,
                "workers": [_v2_worker("gone", 0, 1)]}
    running = {"name": "second", "job_id": JOB, "start_time_ms": 2,
               "workers": [_v2_worker("w0", 0, 100), _v2_worker("w1", 1, 101)]}
    found = ranks_from_train_runs({"train_runs": [running, finished]}, JOB, ["w0", "w1"])
    assert {k: v.world_rank for k, v in found.ranks.items()} == {"w0": 0, "w1": 1}
    assert "second" in found.note
    assert ranks_from_train_runs({"train_runs": [finished]}, JOB, ["w0"]).ranks == {}
    assert ranks_from_train_runs({}, JOB, ["w0"]).ranks == {}


CONTROLLER_LOG = """\
(TrainController pid=90) some start-up line
[2026-11-23 08:40:01,000 I 90 90] worker_group.py:433: Started training worker group of size 2:
- (ip=10.0.0.1, pid=50) world_rank=0, local_rank=0, node_rank=0
- (ip=10.0.0.1, pid=51) world_rank=1, local_rank=1, node_rank=0
a restart happened
Started training worker group of size 3:
- (ip=10.0.0.2, pid=101) world_rank=0, local_rank=0, node_rank=0
- (ip=10.0.0.1, pid=100) world_rank=1, local_rank=0, node_rank=1
- (ip=10.0.0.2, pid=102) world_rank=2, local_rank=1, node_rank=0
training...
"""


def test_controller_log_uses_the_last_worker_group_and_matches_ip_and_pid() -> None:
    w0 = actor("w0", pid=100, ip="10.0.0.1")
    w1 = actor("w1", pid=101, ip="10.0.0.2")
    w2 = actor("w2", pid=102, ip="10.0.0.2")
    same_pid_other_ip = actor("other", pid=102, ip="10.0.0.1")
    ranks = ranks_from_controller_log(CONTROLLER_LOG, [w0, w1, w2, same_pid_other_ip])
    assert ranks == {"w1": TrainRank(0, 0, 3, "controller log"),
                     "w0": TrainRank(1, 0, 3, "controller log"),
                     "w2": TrainRank(2, 1, 3, "controller log")}
    assert ranks_from_controller_log("nothing here\n", [w0]) == {}


def test_controller_log_of_train_v1() -> None:
    text = ("Started distributed worker processes: \n"
            f"- (node_id={NODE_A}, ip=10.0.0.1, pid=100) world_rank=0, local_rank=0, "
            "node_rank=0\n")
    assert ranks_from_controller_log(text, [actor("w0", pid=100)])["w0"].world_rank == 0


# ------------------------------------------------------------------ jobs and errors


JOBS = [JobInfo("01000000", None, "SUCCEEDED"), JobInfo(JOB, "raysubmit_AbC123", "RUNNING"),
        JobInfo(None, "raysubmit_pending", "PENDING")]


def test_resolve_job_by_submission_or_hex_id() -> None:
    assert resolve_job(JOBS, "raysubmit_AbC123").job_id == JOB
    assert resolve_job(JOBS, "02000000").submission_id == "raysubmit_AbC123"
    assert resolve_job(JOBS, "0200000A".replace("A", "0").upper()).job_id == JOB
    assert resolve_job(JOBS, "raysubmit_pending").job_id is None


def test_unknown_job_is_one_line_and_lists_the_jobs() -> None:
    many = [JobInfo(f"{i:02x}000000", None, "SUCCEEDED") for i in range(1, 30)]
    with pytest.raises(RayJobNotFound) as caught:
        resolve_job(many, "ffffff00\n\x1b[2J")
    err = caught.value
    assert isinstance(err, JobNotFound) and err.exit_code == 3
    assert "\n" not in str(err) and "\x1b" not in str(err)
    assert "the last 10 of 29" in err.help and "1d000000" in err.help
    assert "01000000" not in err.help
    with pytest.raises(RayJobNotFound, match="no Ray job 'x'"):
        resolve_job([], "x")


def test_no_workers_error_names_the_job_s_actor_classes() -> None:
    err = ray_job._no_workers(JOBS[1], [CONTROLLER, SYNC], ["Nope*"])
    assert isinstance(err, RayWorkersNotFound) and err.exit_code == 3
    assert "--workers Nope*" in str(err)
    assert "SynchronizationActor, TrainController" in str(err)
    empty = ray_job._no_workers(JOBS[1], [], [])
    assert "has no live actor" in str(empty)


def test_error_classes() -> None:
    assert RayNotInstalled.exit_code == 4 and "hangdoc[ray]" in RayNotInstalled.help
    assert RayUnreachable.exit_code == 7 and "RAY_ADDRESS" in RayUnreachable.help
    assert "--workers" in RayWorkersNotFound.help


# ------------------------------------------------------------------ addresses


def test_ray_address_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_address(None) == "auto"
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265/")
    assert ray_address(None) == "http://head:8265"
    assert ray_address("10.0.0.1:6379") == "10.0.0.1:6379"


def test_dashboard_url_forms() -> None:
    assert dashboard_url("http://head:8265") == "http://head:8265"
    assert dashboard_url("https://head") == "https://head"
    with pytest.raises(RayUnreachable, match="is not a Ray address"):
        dashboard_url("head-without-port")


def test_nothing_listening_is_unreachable_at_once() -> None:
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(RayUnreachable) as caught:
        dashboard_url(f"127.0.0.1:{port}")
    assert time.monotonic() - started < ray_job.CONNECT_TIMEOUT_S + 1
    assert f"127.0.0.1:{port}" in str(caught.value) and "\n" not in str(caught.value)


def test_ray_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(RayNotInstalled, match="needs Ray") as caught:
        ray_job.find_ray_job("02000000", address="http://127.0.0.1:1")
    assert "pip install 'hangdoc[ray]'" in caught.value.help


def test_actors_outside_a_known_run_are_numbered_in_actor_order() -> None:
    train = TrainRanks({"w0": TrainRank(0, 0, 1, "run state")}, "from the run state")
    workers, notes = number_workers([CONTROLLER], train, train_job=True)
    assert workers[0].rank_evidence == "actor order 0: not a worker of the Ray Train run"
    assert "not workers of the Ray Train run" in notes[0]


class FakeDashboard:
    """The two dashboard calls ``train_ranks`` makes, answered from a table."""

    def __init__(self, replies: dict[str, tuple[int, str] | Exception]) -> None:
        self.replies, self.asked = replies, []

    def get(self, endpoint: str, timeout: float, params: dict | None = None) -> tuple[int, str]:
        self.asked.append((endpoint, (params or {}).get("suffix")))
        reply = self.replies.get(endpoint, (404, "Not Found"))
        if isinstance(reply, Exception):
            raise reply
        return reply


NO_STATE = (500, "Train state data is not available. Please make sure Ray Train is running")
LOG_ACTORS = [CONTROLLER, actor("w0", pid=100, ip="10.0.0.1"), actor("w1", pid=101, ip="10.0.0.2"),
              actor("w2", pid=102, ip="10.0.0.2")]


def test_train_ranks_prefer_the_run_state() -> None:
    import json

    payload = {"train_runs": [{"name": "r", "job_id": JOB, "start_time_ns": 1, "attempts": [
        {"start_time_ns": 1, "workers": [_v2_worker("w0", 0, 100)]}]}]}
    api = FakeDashboard({"/api/train/v2/runs/v1": (200, json.dumps(payload))})
    found = ray_job.train_ranks(api, JOB, LOG_ACTORS)  # type: ignore[arg-type]
    assert found.ranks == {"w0": TrainRank(0, 0, 1, "run state")}
    assert [e for e, _ in api.asked] == ["/api/train/v2/runs/v1"]


def test_train_ranks_fall_back_to_the_controller_log() -> None:
    api = FakeDashboard({"/api/train/v2/runs/v1": NO_STATE, "/api/train/v2/runs": NO_STATE,
                         "/api/v0/logs/file": (200, CONTROLLER_LOG)})
    found = ray_job.train_ranks(api, JOB, LOG_ACTORS)  # type: ignore[arg-type]
    assert {a: r.world_rank for a, r in found.ranks.items()} == {"w1": 0, "w0": 1, "w2": 2}
    assert "controller's log" in found.note and "RAY_TRAIN_ENABLE_STATE_TRACKING=1" in found.note


def test_train_ranks_missing_everywhere_cost_the_ranks_not_the_discovery() -> None:
    api = FakeDashboard({"/api/train/v2/runs/v1": RayUnreachable("timed out"),
                         "/api/train/v2/runs": (200, "not json"),
                         "/api/v0/logs/file": RayUnreachable("no log")})
    found = ray_job.train_ranks(api, JOB, LOG_ACTORS)  # type: ignore[arg-type]
    assert found.ranks == {}
    assert "run state was not found" in found.note
    workers, notes = number_workers(LOG_ACTORS[1:], found, train_job=True)
    assert {w.rank_source for w in workers} == {RankSource.INFERRED}
    assert "RAY_TRAIN_ENABLE_STATE_TRACKING=1" in notes[0]
