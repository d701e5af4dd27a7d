"""Find the training workers of a Ray job and their world ranks on the cluster: ``ray:JOB_ID``.

``find_ray_job`` asks the cluster, through Ray's state API (served by the dashboard), which
job ``JOB_ID`` names (a hex job id like ``02000000`` or a submission id like
``raysubmit_...``), lists the job's live actors (pid, Ray node id, class name, name) and
reads Ray Train's record of its workers (its run state, else its controller's log); what
those answers mean (which actors are the workers, their ranks) is ``capture.find.ray_workers``.
It never connects as a Ray driver: it only reads, over HTTP. ``job_processes_here`` is the
same search from an agent placed on a Ray node, for that node's processes.

Address (``address``, else ``RAY_ADDRESS``, else ``auto``): the dashboard URL
``http://HEAD:8265``, the GCS ``HEAD:6379`` (a dashboard's ``HOST:PORT`` works too), a Ray
Client address ``ray://HEAD:10001``, or ``auto`` (the cluster this node runs). Ray is
imported inside the functions: hangdoc imports without it (``pip install '.[ray]'`` from a clone).
This is the one module of ``capture/`` that imports Ray.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from ...errors import RayJobNotFound, RayNotInstalled, RayUnreachable, UsageError, one_line, shown
from ...model import RankProcess
from .ray_workers import (
    TRAIN_CONTROLLER_CLASS,
    ActorInfo,
    JobInfo,
    RayJob,
    TrainRank,
    TrainRanks,
    actor_processes,
    has_train_run,
    ranks_from_controller_log,
    ranks_from_train_runs,
    ray_job_of,
    resolve_job,
)

DEFAULT_ADDRESS = "auto"
CONNECT_TIMEOUT_S = 3.0  # a TCP connect to the address the user gave
GCS_TIMEOUT_S = 10.0  # reading the dashboard's URL from the GCS
STATE_TIMEOUT_S = 15  # one state API call (the dashboard asks every raylet for actors)
TRAIN_STATE_TIMEOUT_S = 30  # the dashboard asks Ray Train's state actor, then decorates
MAX_ACTORS = 10_000  # the state API's own upper bound on one listing
CONTROLLER_LOG_LINES = 5000  # the tail of the Train controller's log that is read
_API_SERVER_ENV = "RAY_API_SERVER_ADDRESS"  # Ray's own override of the dashboard URL

T = TypeVar("T")


# ------------------------------------------------------------------ talking to Ray


def _import_state_api() -> Any:
    try:
        from ray.dashboard.modules.dashboard_sdk import SubmissionClient  # noqa: F401
        from ray.util import state
    except ImportError as exc:
        raise RayNotInstalled(
            f"ray:JOB_ID needs Ray with its dashboard client, which this "
            f"Python cannot import: {one_line(str(exc), 200)}"
        ) from None
    return state


def ray_address(address: str | None) -> str:
    """The address to use: ``address``, else ``RAY_ADDRESS``, else ``auto``."""
    chosen = address or os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS
    return chosen.strip().rstrip("/")


def _host_port(address: str) -> tuple[str, int] | None:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _tcp_check(address: str, host: str, port: int) -> None:
    """Fail fast, and in bounded time, when nothing listens at HOST:PORT."""
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise RayUnreachable(
            f"cannot connect to the Ray cluster at {shown(address)}: {one_line(str(exc) or type(exc).__name__, 200)}"
        ) from None


def _with_deadline(fn: Callable[[], T], seconds: float, what: str) -> T:
    """``fn()`` in a daemon thread, given up after ``seconds`` (Ray's GCS client retries
    for about 40 s on its own)."""
    value: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            value.append(fn())
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=run, name="hangdoc-ray", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise RayUnreachable(f"{what}: no answer within {seconds:.0f} s")
    if error:
        raise error[0]
    return value[0]


def _dashboard_from_gcs(gcs: str) -> str:
    """The dashboard URL the cluster's GCS at ``gcs`` (HOST:PORT) records."""
    from ray._private import ray_constants
    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # Cython, no stub

    def read() -> bytes | None:
        client = GcsClient(address=gcs)
        got: bytes | None = client.internal_kv_get(
            ray_constants.DASHBOARD_ADDRESS.encode(), ray_constants.KV_NAMESPACE_DASHBOARD, timeout=GCS_TIMEOUT_S
        )
        return got

    try:
        url = _with_deadline(read, GCS_TIMEOUT_S + 5, f"the Ray GCS at {gcs}")
    except RayUnreachable:
        raise
    except Exception as exc:  # noqa: BLE001 - Ray's RpcError and friends, as one line
        raise RayUnreachable(f"the Ray GCS at {gcs} did not answer: {one_line(str(exc), 200)}") from None
    if not url:
        raise RayUnreachable(f"the Ray cluster at {gcs} runs no dashboard: hangdoc reads Ray's state API through it")
    text = url.decode()
    return text if "://" in text else f"http://{text}"


def _auto_gcs() -> str:
    """The GCS of the cluster this node runs (Ray's own search for ``auto``)."""
    from ray._private import services

    try:
        return str(services.canonicalize_bootstrap_address_or_die("auto"))
    except Exception as exc:  # noqa: BLE001 - ConnectionError, ValueError: none found
        raise RayUnreachable(f"no Ray cluster found on this node (address auto): {one_line(str(exc), 200)}") from None


def _is_dashboard(url: str) -> bool:
    """Whether ``url`` answers as a Ray dashboard (``/api/version``)."""
    import requests

    try:
        reply = requests.get(f"{url}/api/version", timeout=CONNECT_TIMEOUT_S)
        return reply.status_code == 200 and "ray_version" in reply.json()
    except (requests.RequestException, ValueError):
        return False


def dashboard_url(address: str) -> str:
    """The dashboard URL (``http://HOST:PORT``) behind any address a user may type."""
    if address.startswith(("http://", "https://")):
        return address
    if address.startswith("ray://"):
        return _dashboard_from_ray_client(address)
    gcs = _auto_gcs() if address == DEFAULT_ADDRESS else address
    where = _host_port(gcs)
    if where is None:
        raise RayUnreachable(
            f"{shown(address)} is not a Ray address: give http://HOST:PORT, HOST:PORT, ray://HOST:PORT or auto"
        )
    _tcp_check(address, *where)
    if _is_dashboard(f"http://{gcs}"):  # a dashboard's HOST:PORT, typed without http://
        return f"http://{gcs}"
    return _dashboard_from_gcs(gcs)


def _dashboard_from_ray_client(address: str) -> str:
    from ray.dashboard.utils import ray_client_address_to_api_server_url

    where = _host_port(address.removeprefix("ray://"))
    if where is not None:
        _tcp_check(address, *where)
    try:
        return str(ray_client_address_to_api_server_url(address))
    except Exception as exc:  # noqa: BLE001 - whatever ray.init(ray://) raises
        raise RayUnreachable(
            f"the Ray Client server at {shown(address)} did not answer: {one_line(str(exc), 200)}"
        ) from None


@contextlib.contextmanager
def _api_server(url: str) -> Iterator[None]:
    """Ray's clients take ``RAY_API_SERVER_ADDRESS`` and ``RAY_ADDRESS`` over the address
    they are given: name ``url`` there while one is made, so the address hangdoc chose wins."""
    saved = os.environ.get(_API_SERVER_ENV)
    os.environ[_API_SERVER_ENV] = url
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(_API_SERVER_ENV, None)
        else:
            os.environ[_API_SERVER_ENV] = saved


def _text(value: Any) -> str:
    """An enum's value (Ray's ``JobStatus.RUNNING`` -> ``RUNNING``), else ``str``."""
    return str(getattr(value, "value", value) or "")


def _ray_failure(exc: Exception, url: str, what: str) -> RayUnreachable:
    return RayUnreachable(f"the Ray dashboard at {url} failed {what}: {one_line(str(exc) or type(exc).__name__, 300)}")


class StateApi:
    """Ray's state API at one dashboard, with every answer turned into hangdoc's values."""

    def __init__(self, url: str) -> None:
        state = _import_state_api()
        self.url = url
        try:
            with _api_server(url):
                self.client = state.StateApiClient(address=url)
        except Exception as exc:  # noqa: BLE001 - Ray's client, any failure: one line
            raise _ray_failure(exc, url, "to connect") from None
        status, _ = self.get("/api/version", CONNECT_TIMEOUT_S)
        if status != 200:
            raise RayUnreachable(f"no Ray dashboard answers at {url} (HTTP {status})")

    def _list(self, resource: str, filters: list[tuple[str, str, str | bool | int | float]], what: str) -> list[Any]:
        from ray.util.state.common import ListApiOptions, StateResource

        options = ListApiOptions(limit=MAX_ACTORS, timeout=STATE_TIMEOUT_S, filters=filters, detail=False)
        try:
            return list(self.client.list(StateResource(resource), options=options, raise_on_missing_output=False))
        except Exception as exc:  # noqa: BLE001 - requests', Ray's state API errors
            raise _ray_failure(exc, self.url, what) from None

    def jobs(self) -> list[JobInfo]:
        return [
            JobInfo(
                job_id=getattr(j, "job_id", None),
                submission_id=getattr(j, "submission_id", None),
                status=_text(getattr(j, "status", "")),
                entrypoint=str(getattr(j, "entrypoint", "") or ""),
            )
            for j in self._list("jobs", [], "to list jobs")
        ]

    def node_ips(self) -> dict[str, str]:
        return {n.node_id: n.node_ip for n in self._list("nodes", [], "to list nodes")}

    def actors(self, job_id: str) -> list[ActorInfo]:
        found = self._list(
            "actors", [("job_id", "=", job_id), ("state", "=", "ALIVE")], f"to list the actors of job {job_id}"
        )
        ips = self.node_ips() if found else {}
        return [
            ActorInfo(
                actor_id=a.actor_id,
                class_name=a.class_name or "",
                name=a.name or "",
                pid=int(a.pid or 0),
                node_id=a.node_id or "",
                node_ip=ips.get(a.node_id or "", ""),
            )
            for a in found
            if a.pid
        ]

    def get(self, endpoint: str, timeout: float, params: Mapping[str, Any] | None = None) -> tuple[int, str]:
        """A GET on another dashboard route (status, body), with the client's headers."""
        try:
            reply = self.client._do_request("GET", endpoint, params=dict(params or {}), timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - requests', Ray's authentication errors
            raise _ray_failure(exc, self.url, f"on {endpoint}") from None
        return reply.status_code, reply.text


# ------------------------------------------------------------------ Ray Train, live


# The dashboard's Train routes: V2 runs first (Ray's default trainer), then V1.
TRAIN_RUN_ROUTES = ("/api/train/v2/runs/v1", "/api/train/v2/runs")
_NO_STATE = "set RAY_TRAIN_ENABLE_STATE_TRACKING=1 for the driver to keep it"


def train_ranks(api: StateApi, job_id: str, actors: Sequence[ActorInfo]) -> TrainRanks:
    """Ray Train's ranks for the job's live actors: its run state, else the controller's
    log. A dashboard that fails here costs the ranks, not the discovery."""
    alive = [a.actor_id for a in actors]
    for route in TRAIN_RUN_ROUTES:
        found = _train_route(api, route, job_id, alive)
        if found.ranks:
            return found
    try:
        logged = _ranks_from_controller(api, actors)
    except RayUnreachable:
        logged = {}
    if logged:
        return TrainRanks(
            logged, f"world ranks read from the Ray Train controller's log; its run state was not found ({_NO_STATE})"
        )
    return TrainRanks(
        {}, f"Ray Train's run state was not found ({_NO_STATE}), nor the controller's list of workers in its log"
    )


def _train_route(api: StateApi, route: str, job_id: str, alive: Sequence[str]) -> TrainRanks:
    import json

    try:
        status, body = api.get(route, TRAIN_STATE_TIMEOUT_S)
    except RayUnreachable as exc:
        return TrainRanks({}, str(exc))
    if status != 200:
        return TrainRanks({}, f"{route}: HTTP {status} {one_line(body, 120)}")
    try:
        return ranks_from_train_runs(json.loads(body), job_id, alive, route)
    except (ValueError, TypeError, AttributeError) as exc:
        return TrainRanks({}, f"{route}: unreadable answer ({one_line(str(exc), 120)})")


def _ranks_from_controller(api: StateApi, actors: Sequence[ActorInfo]) -> dict[str, TrainRank]:
    for controller in (a for a in actors if a.class_name == TRAIN_CONTROLLER_CLASS):
        for suffix in ("err", "out"):
            query = {
                "actor_id": controller.actor_id,
                "suffix": suffix,
                "media_type": "file",
                "lines": CONTROLLER_LOG_LINES,
                "timeout": STATE_TIMEOUT_S,
            }
            status, text = api.get("/api/v0/logs/file", STATE_TIMEOUT_S, query)
            ranks = ranks_from_controller_log(text, actors) if status == 200 else {}
            if ranks:
                return ranks
    return {}


# ------------------------------------------------------------------ the entry point


def find_ray_job(job: str, *, address: str | None = None, patterns: Sequence[str] = ()) -> RayJob:
    """The training workers of Ray job ``job`` (hex job id or submission id) on the cluster
    at ``address`` (default: ``RAY_ADDRESS``, else ``auto``), with their world ranks.

    Raises ``RayNotInstalled``, ``RayUnreachable``, ``RayJobNotFound`` or
    ``RayWorkersNotFound``; never one of Ray's own exceptions."""
    api, info = _started_job(job, address)
    assert info.job_id is not None
    actors = api.actors(info.job_id)
    train = train_ranks(api, info.job_id, actors) if has_train_run(actors) else TrainRanks({}, "")
    return ray_job_of(info, actors, patterns, train)


def _started_job(job: str, address: str | None) -> tuple[StateApi, JobInfo]:
    """The cluster's state API and job ``job``, whose driver has started (it has a job id)."""
    _import_state_api()
    api = StateApi(dashboard_url(ray_address(address)))
    info = resolve_job(api.jobs(), job.strip())
    if info.job_id is None:
        raise RayJobNotFound(
            f"Ray job {shown(job)} has not started its driver yet (status {info.status})", help=RayJobNotFound.help
        )
    return api, info


# ------------------------------------------------------------------ on one node (agents)

# Set in the process of hangdoc's agent actor (hangdoc/fleet/ray_agents.py) by the actor
# itself: the Ray node it runs on and its cluster's GCS address. An agent started any other
# way has neither and does not look for Ray jobs.
NODE_ID_ENV = "HANGDOC_RAY_NODE_ID"
ADDRESS_ENV = "HANGDOC_RAY_ADDRESS"


def job_processes_here(job: str, host: str) -> tuple[RankProcess, ...]:
    """Every live actor process of Ray job ``job`` on this agent's own Ray node, unnumbered:
    what an agent placed by hangdoc may sample. The caller (which found the job's workers
    and their ranks on the cluster) picks among them and numbers them.

    Raises ``UsageError`` outside an agent placed as a Ray actor, and the errors of
    ``find_ray_job``."""
    node_id, address = os.environ.get(NODE_ID_ENV), os.environ.get(ADDRESS_ENV)
    if not node_id or not address:
        raise UsageError(
            f"ray:{job}: Ray jobs are found by the agents hangdoc places as Ray actors",
            help="Run `hangdoc diagnose ray:JOB --ray-address ADDRESS` from a machine that can "
            "reach the cluster; it starts one agent actor per node and removes it after.",
        )
    api, info = _started_job(job, address)
    assert info.job_id is not None
    return actor_processes(api.actors(info.job_id), info.job_id, node_id, host, os.getpid())
