"""Find the training workers of a Ray job and their world ranks: ``ray:JOB_ID``.

``find_ray_job`` asks the cluster, through Ray's state API (served by the dashboard), which
job ``JOB_ID`` names (a hex job id like ``02000000`` or a submission id like
``raysubmit_...``), lists the job's live actors (pid, Ray node id, class name, name), picks
the training workers among them and numbers them. It never connects as a Ray driver: it
only reads, over HTTP.

Ranks. A Ray Train worker learns its rank inside the process (Ray Train sets ``RANK``
there, after start-up), so ``/proc/PID/environ`` cannot tell it. Ray Train's own record of
its workers can, in this order:

1. its *run state*: the ``TrainStateActor`` that the dashboard serves at
   ``/api/train/v2/runs/v1`` (Train V2, Ray 2.60's default: ``RAY_TRAIN_V2_ENABLED``; each
   run's latest attempt lists its workers: ``actor_id``, ``world_rank``, ``local_rank``) or
   ``/api/train/v2/runs`` (Train V1: the same fields on the run). Ray keeps it only when
   the driver ran with ``RAY_TRAIN_ENABLE_STATE_TRACKING=1``;
2. the Train V2 controller's log line ``Started training worker group of size N:``, one
   ``- (ip=IP, pid=PID) world_rank=R, local_rank=L, node_rank=K`` line per worker, read
   through the state API's log endpoint: Ray Train writes it for every run, tracked or not.

Both are ``RankSource.RAY``. Without either, the workers are numbered in *actor order*
(by actor name, then class name and actor id) as ``RankSource.INFERRED``, and the job's
``notes`` say that the numbers are labels, not the job's ranks.

Workers. With ``patterns`` (shell patterns, ``parse_patterns``), the live actors whose
class name or name matches one. Without: Ray Train's worker actors when the job has a Ray
Train run (the run's workers, else every ``RayTrainWorker``); otherwise every live actor of
the job except Ray's own (``RAY_INTERNAL_ACTORS``: the Train controller and state actor,
the job supervisor, ...) and hangdoc's agent (``HangdocAgent``).

Address (``address``, else ``RAY_ADDRESS``, else ``auto``): the dashboard URL
``http://HEAD:8265``, the GCS ``HEAD:6379`` (a dashboard's ``HOST:PORT`` works too), a Ray
Client address ``ray://HEAD:10001``, or ``auto`` (the cluster this node runs). Ray is
imported inside the functions: hangdoc imports without it (``pip install 'hangdoc[ray]'``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import (
    RayJobNotFound,
    RayNotInstalled,
    RayUnreachable,
    RayWorkersNotFound,
    UsageError,
    one_line,
    shown,
)
from ..model import RankProcess, RankSource

# Actors that Ray (Train, Tune, jobs, Data) runs for itself, and hangdoc's agent: never
# training workers unless --workers names them.
RAY_INTERNAL_ACTORS = frozenset({
    # Ray Train V2 (2.60 starts all of these with a TorchTrainer)
    "TrainController",  # drives the worker group
    "TrainStateActor",  # the run state (Train V1 too)
    "SynchronizationActor",  # barriers between workers
    "DatasetManager",
    "PlacementGroupCleaner",
    "PreemptionWatcher",
    "_AutoscalingCoordinatorActor",  # Ray Data / Train resource requests
    # Ray jobs and Ray Data
    "JobSupervisor",  # runs a submitted job's entrypoint
    "_StatsActor",
    # hangdoc's own agent, placed as a Ray actor (hangdoc/fleet/ray_agents.py)
    "HangdocAgent",
})
TRAIN_WORKER_CLASS = "RayTrainWorker"  # Ray Train V1 and V2 worker actors
TRAIN_CONTROLLER_CLASS = "TrainController"

DEFAULT_ADDRESS = "auto"
CONNECT_TIMEOUT_S = 3.0  # a TCP connect to the address the user gave
GCS_TIMEOUT_S = 10.0  # reading the dashboard's URL from the GCS
STATE_TIMEOUT_S = 15  # one state API call (the dashboard asks every raylet for actors)
TRAIN_STATE_TIMEOUT_S = 30  # the dashboard asks Ray Train's state actor, then decorates
MAX_ACTORS = 10_000  # the state API's own upper bound on one listing
MAX_JOBS_LISTED = 10  # jobs named in RayJobNotFound's help
CONTROLLER_LOG_LINES = 5000  # the tail of the Train controller's log that is read
_API_SERVER_ENV = "RAY_API_SERVER_ADDRESS"  # Ray's own override of the dashboard URL

T = TypeVar("T")


# ------------------------------------------------------------------ the result


@dataclass(frozen=True)
class RayWorker:
    """One training worker: a live actor of the job, on one Ray node, with its rank."""

    pid: int
    node_id: str  # Ray node id (hex): nodes are keyed by it; several can share an IP
    node_ip: str
    actor_id: str
    actor_class: str
    actor_name: str  # "" for an unnamed actor
    world_rank: int | None
    world_size: int | None
    local_rank: int | None
    rank_evidence: str  # "Ray Train world rank 2 (run state)", "actor order 2: ..."
    rank_source: RankSource | None = None  # RAY: Ray Train's record; INFERRED: actor order

    def to_rank_process(self, host: str) -> RankProcess:
        """The worker as discovery reports a rank; ``host`` names its node (an agent's)."""
        return RankProcess(
            pid=self.pid,
            host=host,
            rank=self.world_rank,
            rank_source=self.rank_source,
            rank_evidence=self.rank_evidence,
            world_size=self.world_size,
            local_rank=self.local_rank,
        )


@dataclass(frozen=True)
class RayJob:
    """A Ray job's training workers, sorted by world rank then actor id."""

    job_id: str  # hex, as Ray prints it
    submission_id: str | None
    workers: tuple[RayWorker, ...]
    notes: tuple[str, ...] = ()  # how they were found, for the report

    @property
    def node_ids(self) -> tuple[str, ...]:
        """The Ray nodes that hold a worker, in order of first appearance."""
        return tuple(dict.fromkeys(w.node_id for w in self.workers))


# ------------------------------------------------------------------ Ray's answers, as values


@dataclass(frozen=True)
class ActorInfo:
    """A live actor as the state API lists it."""

    actor_id: str
    class_name: str
    name: str
    pid: int
    node_id: str
    node_ip: str = ""

    @property
    def label(self) -> str:
        return f"{self.class_name} {self.name!r}" if self.name else self.class_name


@dataclass(frozen=True)
class JobInfo:
    """A job as the state API lists it."""

    job_id: str | None  # None while a submitted job has not started its driver
    submission_id: str | None
    status: str
    entrypoint: str = ""


@dataclass(frozen=True)
class TrainRank:
    """Ray Train's word on one worker."""

    world_rank: int
    local_rank: int | None
    world_size: int
    source: str  # "run state", "controller log"


@dataclass(frozen=True)
class TrainRanks:
    """What Ray Train says about the job's workers: ranks by actor id, or why nothing."""

    ranks: Mapping[str, TrainRank]
    note: str  # where they came from, or why they are missing


# ------------------------------------------------------------------ patterns and selection


def parse_patterns(text: str) -> tuple[str, ...]:
    """``"RayTrainWorker, Trainer*,"`` -> ``("RayTrainWorker", "Trainer*")``."""
    return tuple(p.strip() for p in text.split(",") if p.strip())


def matches(actor: ActorInfo, patterns: Sequence[str]) -> bool:
    """Whether a shell pattern matches the actor's class name or its name (case-sensitive)."""
    names = [actor.class_name, *([actor.name] if actor.name else [])]
    return any(fnmatch.fnmatchcase(n, p) for p in patterns for n in names)


def is_internal(actor: ActorInfo) -> bool:
    """One of Ray's own actors or hangdoc's agent."""
    return actor.class_name in RAY_INTERNAL_ACTORS


def select_actors(actors: Sequence[ActorInfo], patterns: Sequence[str],
                  train_actor_ids: Iterable[str] = ()) -> tuple[ActorInfo, ...]:
    """The training workers among a job's live actors (see the module's docstring)."""
    if patterns:
        return tuple(a for a in actors if matches(a, patterns))
    in_run = set(train_actor_ids)
    workers = tuple(a for a in actors if a.actor_id in in_run)
    if workers:
        return workers
    workers = tuple(a for a in actors if a.class_name == TRAIN_WORKER_CLASS)
    if workers:
        return workers
    return tuple(a for a in actors if not is_internal(a))


def has_train_run(actors: Sequence[ActorInfo]) -> bool:
    return any(a.class_name in (TRAIN_WORKER_CLASS, TRAIN_CONTROLLER_CLASS) for a in actors)


def _natural(text: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that puts ``w2`` before ``w10``."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", text) if p)


def actor_order(actors: Iterable[ActorInfo]) -> list[ActorInfo]:
    """Named actors by name (naturally: w2 before w10), then the others by class and id."""
    return sorted(actors, key=lambda a: (a.name == "", _natural(a.name), a.class_name,
                                         a.actor_id))


# ------------------------------------------------------------------ numbering


def _worker(actor: ActorInfo, rank: int | None, size: int | None, local: int | None,
            evidence: str, source: RankSource | None) -> RayWorker:
    return RayWorker(pid=actor.pid, node_id=actor.node_id, node_ip=actor.node_ip,
                     actor_id=actor.actor_id, actor_class=actor.class_name,
                     actor_name=actor.name, world_rank=rank, world_size=size,
                     local_rank=local, rank_evidence=evidence, rank_source=source)


def _by_rank(workers: Iterable[RayWorker]) -> tuple[RayWorker, ...]:
    return tuple(sorted(workers, key=lambda w: (w.world_rank is None, w.world_rank or 0,
                                                w.actor_id)))


def number_workers(selected: Sequence[ActorInfo], train: TrainRanks,
                   train_job: bool) -> tuple[tuple[RayWorker, ...], tuple[str, ...]]:
    """The workers with their ranks, and the notes that say where the ranks came from."""
    known = {a.actor_id: train.ranks[a.actor_id] for a in selected if a.actor_id in train.ranks}
    if known:
        return _ranked_by_train(selected, known, train.note)
    if not train_job:
        return _ranked_by_order(selected, "not a Ray Train job", "not a Ray Train job")
    if train.ranks:
        return _ranked_by_order(selected, "not a worker of the Ray Train run",
                                "the selected actors are not workers of the Ray Train run")
    return _ranked_by_order(selected, "Ray Train run state not available", train.note)


def _ranked_by_train(selected: Sequence[ActorInfo], known: Mapping[str, TrainRank],
                     note: str) -> tuple[tuple[RayWorker, ...], tuple[str, ...]]:
    workers = []
    for actor in selected:
        tr = known.get(actor.actor_id)
        if tr is None:
            workers.append(_worker(actor, None, None, None, "not a worker of the Ray Train run",
                                   None))
        else:
            workers.append(_worker(actor, tr.world_rank, tr.world_size, tr.local_rank,
                                   f"Ray Train world rank {tr.world_rank} ({tr.source})",
                                   RankSource.RAY))
    notes = [note]
    outside = [a.label for a in selected if a.actor_id not in known]
    if outside:
        notes.append(one_line(f"no rank for {len(outside)} selected actors outside the Ray "
                              f"Train run: {', '.join(sorted(set(outside)))}", 1000))
    return _by_rank(workers), tuple(notes)


def _ranked_by_order(selected: Sequence[ActorInfo], reason: str,
                     why: str) -> tuple[tuple[RayWorker, ...], tuple[str, ...]]:
    """Numbered in actor order: ``reason`` for each worker's evidence, ``why`` for the note."""
    ordered = actor_order(selected)
    workers = tuple(_worker(a, i, len(ordered), None, f"actor order {i}: {reason}",
                            RankSource.INFERRED) for i, a in enumerate(ordered))
    note = ("rank numbers follow actor order (actor name, then class name and actor id), "
            f"not the job's own ranks: {why}")
    return _by_rank(workers), (note,)


# ------------------------------------------------------------------ Ray Train's record


def _latest(items: Iterable[Mapping[str, Any]], *keys: str) -> Mapping[str, Any] | None:
    """The item with the largest of the first present time field among ``keys``."""
    def when(item: Mapping[str, Any]) -> int:
        return next((int(item[k]) for k in keys if isinstance(item.get(k), int)), 0)
    return max(items, key=when, default=None)


def _run_workers(run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A run's current workers: Train V2 keeps them per attempt, Train V1 on the run."""
    if isinstance(run.get("attempts"), list):
        attempt = _latest(run["attempts"], "start_time_ns")
        return list(attempt.get("workers") or []) if attempt else []
    return list(run.get("workers") or [])


def ranks_from_train_runs(payload: Mapping[str, Any], job_id: str, alive: Iterable[str],
                          route: str = "run state") -> TrainRanks:
    """Ranks by actor id from a ``/api/train/...runs`` answer, for the job's live actors.

    Of the job's runs, the latest one that has a live worker: a job may run several trainers,
    one after another (their old workers are gone) or at once (Tune: the note says so)."""
    alive_ids = set(alive)
    runs = [r for r in payload.get("train_runs") or []
            if isinstance(r, Mapping) and str(r.get("job_id", "")).lower() == job_id.lower()]
    live_runs = [r for r in runs
                 if any(w.get("actor_id") in alive_ids for w in _run_workers(r))]
    run = _latest(live_runs, "start_time_ns", "start_time_ms")
    if run is None:
        return TrainRanks({}, f"no live Ray Train run of job {job_id} in {route}")
    workers = _run_workers(run)
    ranks = {}
    for w in workers:
        rank, local = w.get("world_rank"), w.get("local_rank")
        if isinstance(w.get("actor_id"), str) and isinstance(rank, int):
            ranks[w["actor_id"]] = TrainRank(rank, local if isinstance(local, int) else None,
                                             len(workers), "run state")
    note = f"world ranks read from Ray Train's run state ({route}, run {run.get('name', '?')!s})"
    if len(live_runs) > 1:
        note += f"; the job has {len(live_runs)} live Ray Train runs: the latest is diagnosed"
    return TrainRanks(ranks, one_line(note, 300))


_GROUP_STARTED = re.compile(r"Started (?:training worker group of size|distributed worker "
                            r"processes)\b")
_WORKER_LINE = re.compile(
    r"- \((?:node_id=[0-9a-fA-F]+, )?ip=(?P<ip>[^,()\s]+), pid=(?P<pid>\d+)\) "
    r"world_rank=(?P<rank>\d+), local_rank=(?P<local>\d+)")


def ranks_from_controller_log(text: str, actors: Sequence[ActorInfo]) -> dict[str, TrainRank]:
    """Ranks by actor id from the last worker-group listing in a Train controller's log,
    matched to the live actors by (node IP, pid)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if _GROUP_STARTED.search(line)]
    if not starts:
        return {}
    listing = []
    for line in lines[starts[-1] + 1:]:
        m = _WORKER_LINE.search(line)
        if m is None:
            break
        listing.append(m)
    by_place = {(a.node_ip, a.pid): a for a in actors}
    ranks = {}
    for m in listing:
        actor = by_place.get((m["ip"], int(m["pid"])))
        if actor is not None:
            ranks[actor.actor_id] = TrainRank(int(m["rank"]), int(m["local"]), len(listing),
                                              "controller log")
    return ranks


# ------------------------------------------------------------------ job resolution


def resolve_job(jobs: Sequence[JobInfo], job: str) -> JobInfo:
    """The job ``job`` names: a hex job id (any case) or a submission id (exactly)."""
    for info in jobs:
        if info.submission_id is not None and info.submission_id == job:
            return info
    for info in jobs:
        if info.job_id is not None and info.job_id.lower() == job.lower():
            return info
    raise RayJobNotFound(f"no Ray job {shown(job)} on the cluster "
                         f"({len(jobs)} jobs known)", help=_jobs_help(jobs))


def _jobs_help(jobs: Sequence[JobInfo]) -> str:
    if not jobs:
        return "The cluster has no job. " + RayJobNotFound.help
    shown_jobs = list(jobs)[-MAX_JOBS_LISTED:]  # the state API lists them oldest first
    listed = "; ".join(
        one_line(f"{j.job_id or '-'} {j.submission_id or ''} {j.status}".replace("  ", " "), 80)
        for j in shown_jobs)
    more = f" (the last {len(shown_jobs)} of {len(jobs)})" if len(jobs) > len(shown_jobs) else ""
    return f"Jobs on the cluster{more}: {listed}. " + RayJobNotFound.help


# ------------------------------------------------------------------ talking to Ray


def _import_state_api() -> Any:
    try:
        from ray.dashboard.modules.dashboard_sdk import SubmissionClient  # noqa: F401
        from ray.util import state
    except ImportError as exc:
        raise RayNotInstalled(f"ray:JOB_ID needs Ray with its dashboard client, which this "
                              f"Python cannot import: {one_line(str(exc), 200)}") from None
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
        raise RayUnreachable(f"cannot connect to the Ray cluster at {shown(address)}: "
                             f"{one_line(str(exc) or type(exc).__name__, 200)}") from None


def _with_deadline(fn: Callable[[], T], seconds: float, what: str) -> T:
    """``fn()`` in a daemon thread, given up after ``seconds`` (Ray's GCS client retries
    for about 40 s on its own)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="hangdoc-ray", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise RayUnreachable(f"{what}: no answer within {seconds:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _dashboard_from_gcs(gcs: str) -> str:
    """The dashboard URL the cluster's GCS at ``gcs`` (HOST:PORT) records."""
    from ray._private import ray_constants
    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # Cython, no stub

    def read() -> bytes | None:
        client = GcsClient(address=gcs)
        return client.internal_kv_get(ray_constants.DASHBOARD_ADDRESS.encode(),
                                      ray_constants.KV_NAMESPACE_DASHBOARD,
                                      timeout=GCS_TIMEOUT_S)

    try:
        url = _with_deadline(read, GCS_TIMEOUT_S + 5, f"the Ray GCS at {gcs}")
    except RayUnreachable:
        raise
    except Exception as exc:  # noqa: BLE001 - Ray's RpcError and friends, as one line
        raise RayUnreachable(f"the Ray GCS at {gcs} did not answer: "
                             f"{one_line(str(exc), 200)}") from None
    if not url:
        raise RayUnreachable(f"the Ray cluster at {gcs} runs no dashboard: hangdoc reads "
                             "Ray's state API through it")
    text = url.decode()
    return text if "://" in text else f"http://{text}"


def _auto_gcs() -> str:
    """The GCS of the cluster this node runs (Ray's own search for ``auto``)."""
    from ray._private import services

    try:
        return str(services.canonicalize_bootstrap_address_or_die("auto"))
    except Exception as exc:  # noqa: BLE001 - ConnectionError, ValueError: none found
        raise RayUnreachable(f"no Ray cluster found on this node (address auto): "
                             f"{one_line(str(exc), 200)}") from None


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
        raise RayUnreachable(f"{shown(address)} is not a Ray address: give http://HOST:PORT, "
                             "HOST:PORT, ray://HOST:PORT or auto")
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
        raise RayUnreachable(f"the Ray Client server at {shown(address)} did not answer: "
                             f"{one_line(str(exc), 200)}") from None


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
    return RayUnreachable(f"the Ray dashboard at {url} failed {what}: "
                          f"{one_line(str(exc) or type(exc).__name__, 300)}")


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

    def _list(self, resource: str, filters: list[tuple[str, str, str | bool | int | float]],
              what: str) -> list[Any]:
        from ray.util.state.common import ListApiOptions, StateResource

        options = ListApiOptions(limit=MAX_ACTORS, timeout=STATE_TIMEOUT_S, filters=filters,
                                 detail=False)
        try:
            return list(self.client.list(StateResource(resource), options=options,
                                         raise_on_missing_output=False))
        except Exception as exc:  # noqa: BLE001 - requests', Ray's state API errors
            raise _ray_failure(exc, self.url, what) from None

    def jobs(self) -> list[JobInfo]:
        return [JobInfo(job_id=getattr(j, "job_id", None),
                        submission_id=getattr(j, "submission_id", None),
                        status=_text(getattr(j, "status", "")),
                        entrypoint=str(getattr(j, "entrypoint", "") or ""))
                for j in self._list("jobs", [], "to list jobs")]

    def node_ips(self) -> dict[str, str]:
        return {n.node_id: n.node_ip for n in self._list("nodes", [], "to list nodes")}

    def actors(self, job_id: str) -> list[ActorInfo]:
        found = self._list("actors", [("job_id", "=", job_id), ("state", "=", "ALIVE")],
                           f"to list the actors of job {job_id}")
        ips = self.node_ips() if found else {}
        return [ActorInfo(actor_id=a.actor_id, class_name=a.class_name or "",
                          name=a.name or "", pid=int(a.pid or 0), node_id=a.node_id or "",
                          node_ip=ips.get(a.node_id or "", ""))
                for a in found if a.pid]

    def get(self, endpoint: str, timeout: float,
            params: Mapping[str, Any] | None = None) -> tuple[int, str]:
        """A GET on another dashboard route (status, body), with the client's headers."""
        try:
            reply = self.client._do_request("GET", endpoint, params=dict(params or {}),
                                            timeout=timeout)
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
        return TrainRanks(logged, "world ranks read from the Ray Train controller's log; its "
                          f"run state was not found ({_NO_STATE})")
    return TrainRanks({}, f"Ray Train's run state was not found ({_NO_STATE}), nor the "
                      "controller's list of workers in its log")


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
            query = {"actor_id": controller.actor_id, "suffix": suffix, "media_type": "file",
                     "lines": CONTROLLER_LOG_LINES, "timeout": STATE_TIMEOUT_S}
            status, text = api.get("/api/v0/logs/file", STATE_TIMEOUT_S, query)
            ranks = ranks_from_controller_log(text, actors) if status == 200 else {}
            if ranks:
                return ranks
    return {}


# ------------------------------------------------------------------ the entry point


# a job in one of these states has ended (Ray's JobStatus): its workers will not come back
ENDED_STATUSES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


def find_ray_job(job: str, *, address: str | None = None,
                 patterns: Sequence[str] = ()) -> RayJob:
    """The training workers of Ray job ``job`` (hex job id or submission id) on the cluster
    at ``address`` (default: ``RAY_ADDRESS``, else ``auto``), with their world ranks.

    Raises ``RayNotInstalled``, ``RayUnreachable``, ``RayJobNotFound`` or
    ``RayWorkersNotFound``; never one of Ray's own exceptions."""
    api, info = _started_job(job, address)
    assert info.job_id is not None
    actors = api.actors(info.job_id)
    train_job = has_train_run(actors)
    train = train_ranks(api, info.job_id, actors) if train_job else TrainRanks({}, "")
    selected = select_actors(actors, patterns, train.ranks)
    if not selected:
        raise _no_workers(info, actors, patterns)
    workers, notes = number_workers(selected, train, train_job)
    left_out = sorted({a.label for a in actors if a not in selected})
    if left_out:
        notes += (one_line(f"actors of the job left out: {', '.join(left_out)}", 1000),)
    return RayJob(info.job_id, info.submission_id, workers, notes)


def _started_job(job: str, address: str | None) -> tuple[StateApi, JobInfo]:
    """The cluster's state API and job ``job``, whose driver has started (it has a job id)."""
    _import_state_api()
    api = StateApi(dashboard_url(ray_address(address)))
    info = resolve_job(api.jobs(), job.strip())
    if info.job_id is None:
        raise RayJobNotFound(f"Ray job {shown(job)} has not started its driver yet "
                             f"(status {info.status})", help=RayJobNotFound.help)
    return api, info


def _no_workers(info: JobInfo, actors: Sequence[ActorInfo],
                patterns: Sequence[str]) -> RayWorkersNotFound:
    classes = sorted({a.class_name for a in actors})
    where = f"Ray job {info.job_id} (status {info.status})"
    running = info.status.upper() not in ENDED_STATUSES
    if not actors:
        return RayWorkersNotFound(f"{where} has no live actor",
                                  help="A job that has finished or not yet started its "
                                  "workers has nothing to diagnose. " + RayWorkersNotFound.help,
                                  running=running)
    what = (f"no live actor matches --workers {','.join(patterns)}" if patterns
            else "no live actor is a training worker")
    return RayWorkersNotFound(
        one_line(f"{where}: {what}; its actor classes: {', '.join(classes)}"),
        help=RayWorkersNotFound.help, running=running)


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
                 "reach the cluster; it starts one agent actor per node and removes it after.")
    api, info = _started_job(job, address)
    assert info.job_id is not None
    own = os.getpid()
    return tuple(
        RankProcess(pid=a.pid, host=host, rank=None,
                    rank_evidence=f"actor {a.label} of Ray job {info.job_id} on node {node_id[:12]}")
        for a in api.actors(info.job_id) if a.node_id == node_id and a.pid != own)
