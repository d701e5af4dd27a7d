"""``hangdoc.capture.find.ray_workers``: what Ray's answers mean, without Ray: patterns, worker
selection, where ranks come from (Ray Train's run state, its controller's log, actor order),
job resolution and errors. The calls that ask the cluster: test_ray_job.py; the same code
against a real multi-node Ray cluster: tests/live/ray/test_ray_discovery.py."""

from __future__ import annotations

import pytest
from support.rayactors import (
    AGENT,
    CONTROLLER,
    CONTROLLER_LOG,
    JOB,
    NODE_A,
    NODE_B,
    SYNC,
    W0,
    W1,
    W2,
    actor,
    v2_worker,
)

from hangdoc.capture.find.ray_workers import (
    JobInfo,
    RayWorker,
    TrainRank,
    TrainRanks,
    actor_order,
    actor_processes,
    no_workers,
    number_workers,
    parse_patterns,
    ranks_from_controller_log,
    ranks_from_train_runs,
    ray_job_of,
    resolve_job,
    select_actors,
)
from hangdoc.errors import JobNotFound, RayJobNotFound, RayWorkersNotFound
from hangdoc.model import RankProcess, RankSource

pytestmark = pytest.mark.timeout(30)


# ------------------------------------------------------------------ patterns


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("RayTrainWorker", ("RayTrainWorker",)),
        (" RayTrainWorker , Trainer* ,", ("RayTrainWorker", "Trainer*")),
        ("a,,b", ("a", "b")),
        ("", ()),
        (" , ", ()),
    ],
)
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
    train = TrainRanks(
        {
            "w0": TrainRank(2, 0, 3, "run state"),
            "w1": TrainRank(0, 0, 3, "run state"),
            "w2": TrainRank(1, 1, 3, "run state"),
        },
        "world ranks read from X",
    )
    workers, notes = number_workers([W0, W1, W2], train, train_job=True)
    assert [(w.actor_id, w.world_rank, w.local_rank) for w in workers] == [("w1", 0, 0), ("w2", 1, 1), ("w0", 2, 0)]
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
        ("w0", 0, RankSource.RAY),
        ("x", None, None),
    ]
    assert "Evaluator 'eval'" in notes[1]


def test_to_rank_process() -> None:
    worker = RayWorker(
        pid=4242,
        node_id=NODE_B,
        node_ip="10.0.0.2",
        actor_id="w",
        actor_class="C",
        actor_name="",
        world_rank=3,
        world_size=4,
        local_rank=1,
        rank_evidence="Ray Train world rank 3 (run state)",
        rank_source=RankSource.RAY,
    )
    assert worker.to_rank_process("node-b") == RankProcess(
        pid=4242,
        host="node-b",
        rank=3,
        rank_source=RankSource.RAY,
        rank_evidence="Ray Train world rank 3 (run state)",
        world_size=4,
        local_rank=1,
    )


def test_actors_outside_a_known_run_are_numbered_in_actor_order() -> None:
    train = TrainRanks({"w0": TrainRank(0, 0, 1, "run state")}, "from the run state")
    workers, notes = number_workers([CONTROLLER], train, train_job=True)
    assert workers[0].rank_evidence == "actor order 0: not a worker of the Ray Train run"
    assert "not workers of the Ray Train run" in notes[0]


# ------------------------------------------------------------------ Ray Train's record


def test_train_v2_run_state_takes_the_latest_attempt_of_the_live_run() -> None:
    old_attempt = {
        "attempt_id": "a1",
        "start_time_ns": 1,
        "workers": [v2_worker("dead0", 0, 1), v2_worker("dead1", 1, 2)],
    }
    new_attempt = {
        "attempt_id": "a2",
        "start_time_ns": 2,
        "workers": [v2_worker("w1", 0, 101), v2_worker("w0", 1, 100)],
    }
    payload = {
        "train_runs": [
            {
                "id": "r1",
                "name": "mine",
                "job_id": JOB.upper(),
                "start_time_ns": 5,
                "attempts": [new_attempt, old_attempt],
            },
            {
                "id": "r0",
                "name": "other-job",
                "job_id": "03000000",
                "start_time_ns": 9,
                "attempts": [{"start_time_ns": 3, "workers": [v2_worker("w0", 7, 100)]}],
            },
        ]
    }
    found = ranks_from_train_runs(payload, JOB, ["w0", "w1", "ctl"], "/api/train/v2/runs/v1")
    assert found.ranks == {"w1": TrainRank(0, 0, 2, "run state"), "w0": TrainRank(1, 1, 2, "run state")}
    assert "/api/train/v2/runs/v1" in found.note and "mine" in found.note


def test_train_v1_run_state_and_finished_runs() -> None:
    finished = {"name": "first", "job_id": JOB, "start_time_ms": 1, "workers": [v2_worker("gone", 0, 1)]}
    running = {
        "name": "second",
        "job_id": JOB,
        "start_time_ms": 2,
        "workers": [v2_worker("w0", 0, 100), v2_worker("w1", 1, 101)],
    }
    found = ranks_from_train_runs({"train_runs": [running, finished]}, JOB, ["w0", "w1"])
    assert {k: v.world_rank for k, v in found.ranks.items()} == {"w0": 0, "w1": 1}
    assert "second" in found.note
    assert ranks_from_train_runs({"train_runs": [finished]}, JOB, ["w0"]).ranks == {}
    assert ranks_from_train_runs({}, JOB, ["w0"]).ranks == {}


def test_controller_log_uses_the_last_worker_group_and_matches_ip_and_pid() -> None:
    w0 = actor("w0", pid=100, ip="10.0.0.1")
    w1 = actor("w1", pid=101, ip="10.0.0.2")
    w2 = actor("w2", pid=102, ip="10.0.0.2")
    same_pid_other_ip = actor("other", pid=102, ip="10.0.0.1")
    ranks = ranks_from_controller_log(CONTROLLER_LOG, [w0, w1, w2, same_pid_other_ip])
    assert ranks == {
        "w1": TrainRank(0, 0, 3, "controller log"),
        "w0": TrainRank(1, 0, 3, "controller log"),
        "w2": TrainRank(2, 1, 3, "controller log"),
    }
    assert ranks_from_controller_log("nothing here\n", [w0]) == {}


def test_controller_log_of_train_v1() -> None:
    text = (
        "Started distributed worker processes: \n"
        f"- (node_id={NODE_A}, ip=10.0.0.1, pid=100) world_rank=0, local_rank=0, "
        "node_rank=0\n"
    )
    assert ranks_from_controller_log(text, [actor("w0", pid=100)])["w0"].world_rank == 0


# ------------------------------------------------------------------ jobs and errors


JOBS = [
    JobInfo("01000000", None, "SUCCEEDED"),
    JobInfo(JOB, "raysubmit_AbC123", "RUNNING"),
    JobInfo(None, "raysubmit_pending", "PENDING"),
]


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
    err = no_workers(JOBS[1], [CONTROLLER, SYNC], ["Nope*"])
    assert isinstance(err, RayWorkersNotFound) and err.exit_code == 3
    assert "--workers Nope*" in str(err)
    assert "SynchronizationActor, TrainController" in str(err)
    empty = no_workers(JOBS[1], [], [])
    assert "has no live actor" in str(empty)


# ------------------------------------------------------------------ the job's workers


def test_ray_job_of_numbers_the_workers_and_says_who_was_left_out() -> None:
    train = TrainRanks(
        {"w0": TrainRank(1, 0, 2, "run state"), "w1": TrainRank(0, 0, 2, "run state")},
        "world ranks read from the run state",
    )
    job = ray_job_of(JOBS[1], [CONTROLLER, W0, SYNC, W1], [], train)
    assert (job.job_id, job.submission_id) == (JOB, "raysubmit_AbC123")
    assert [(w.actor_id, w.world_rank) for w in job.workers] == [("w1", 0), ("w0", 1)]
    assert job.node_ids == (NODE_B, NODE_A)
    assert job.notes == (
        "world ranks read from the run state",
        "actors of the job left out: SynchronizationActor, TrainController",
    )


def test_ray_job_of_without_a_worker_is_an_error() -> None:
    with pytest.raises(RayWorkersNotFound, match="no live actor matches --workers Nope"):
        ray_job_of(JOBS[1], [CONTROLLER, W0], ["Nope"], TrainRanks({}, ""))


def test_actor_processes_are_the_node_s_own_but_the_asker() -> None:
    asker = actor("agent", "HangdocAgent", pid=7, node=NODE_B)
    found = actor_processes([W0, W1, W2, asker], JOB, NODE_B, "node-b", own_pid=7)
    assert found == tuple(
        RankProcess(
            pid=a.pid,
            host="node-b",
            rank=None,
            rank_evidence=f"actor RayTrainWorker of Ray job {JOB} on node {NODE_B[:12]}",
        )
        for a in (W1, W2)
    )
