"""``hangdoc.capture.find.ray_job`` without a cluster: addresses, Ray missing, and where Ray
Train's ranks are asked for (a fake dashboard). What the answers mean: test_ray_workers.py;
the same code against a real multi-node Ray cluster: tests/live/ray/test_ray_discovery.py."""

from __future__ import annotations

import sys
import time

import pytest
from support.rayactors import CONTROLLER, CONTROLLER_LOG, JOB, actor, v2_worker

from hangdoc.capture.find import ray_job
from hangdoc.capture.find.ray_job import dashboard_url, ray_address
from hangdoc.capture.find.ray_workers import TrainRank, number_workers
from hangdoc.errors import RayNotInstalled, RayUnreachable, RayWorkersNotFound
from hangdoc.model import RankSource

pytestmark = pytest.mark.timeout(30)


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


# ------------------------------------------------------------------ Ray Train's record, asked for


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
LOG_ACTORS = [
    CONTROLLER,
    actor("w0", pid=100, ip="10.0.0.1"),
    actor("w1", pid=101, ip="10.0.0.2"),
    actor("w2", pid=102, ip="10.0.0.2"),
]


def test_train_ranks_prefer_the_run_state() -> None:
    import json

    payload = {
        "train_runs": [
            {
                "name": "r",
                "job_id": JOB,
                "start_time_ns": 1,
                "attempts": [{"start_time_ns": 1, "workers": [v2_worker("w0", 0, 100)]}],
            }
        ]
    }
    api = FakeDashboard({"/api/train/v2/runs/v1": (200, json.dumps(payload))})
    found = ray_job.train_ranks(api, JOB, LOG_ACTORS)  # type: ignore[arg-type]
    assert found.ranks == {"w0": TrainRank(0, 0, 1, "run state")}
    assert [e for e, _ in api.asked] == ["/api/train/v2/runs/v1"]


def test_train_ranks_fall_back_to_the_controller_log() -> None:
    api = FakeDashboard(
        {"/api/train/v2/runs/v1": NO_STATE, "/api/train/v2/runs": NO_STATE, "/api/v0/logs/file": (200, CONTROLLER_LOG)}
    )
    found = ray_job.train_ranks(api, JOB, LOG_ACTORS)  # type: ignore[arg-type]
    assert {a: r.world_rank for a, r in found.ranks.items()} == {"w1": 0, "w0": 1, "w2": 2}
    assert "controller's log" in found.note and "RAY_TRAIN_ENABLE_STATE_TRACKING=1" in found.note


def test_train_ranks_missing_everywhere_cost_the_ranks_not_the_discovery() -> None:
    api = FakeDashboard(
        {
            "/api/train/v2/runs/v1": RayUnreachable("timed out"),
            "/api/train/v2/runs": (200, "not json"),
            "/api/v0/logs/file": RayUnreachable("no log"),
        }
    )
    found = ray_job.train_ranks(api, JOB, LOG_ACTORS)  # type: ignore[arg-type]
    assert found.ranks == {}
    assert "run state was not found" in found.note
    workers, notes = number_workers(LOG_ACTORS[1:], found, train_job=True)
    assert {w.rank_source for w in workers} == {RankSource.INFERRED}
    assert "RAY_TRAIN_ENABLE_STATE_TRACKING=1" in notes[0]
