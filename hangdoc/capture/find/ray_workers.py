"""Which of a Ray job's actors are its training workers, and their world ranks: what Ray's
answers mean, with no Ray and no network (``capture.find.ray_job`` asks the cluster and hands
its answers here as values: ``ActorInfo``, ``JobInfo``, Ray Train's records).

Ranks. A Ray Train worker learns its rank inside the process (Ray Train sets ``RANK``
there, after start-up), so ``/proc/PID/environ`` cannot tell it. Ray Train's own record of
its workers can, in this order:

1. its *run state*: the ``TrainStateActor`` that the dashboard serves at
   ``/api/train/v2/runs/v1`` (Train V2, Ray 2.60's default: ``RAY_TRAIN_V2_ENABLED``; each
   run's latest attempt lists its workers: ``actor_id``, ``world_rank``, ``local_rank``) or
   ``/api/train/v2/runs`` (Train V1: the same fields on the run). Ray keeps it only when
   the driver ran with ``RAY_TRAIN_ENABLE_STATE_TRACKING=1`` (``ranks_from_train_runs``);
2. the Train V2 controller's log line ``Started training worker group of size N:``, one
   ``- (ip=IP, pid=PID) world_rank=R, local_rank=L, node_rank=K`` line per worker, read
   through the state API's log endpoint: Ray Train writes it for every run, tracked or not
   (``ranks_from_controller_log``).

Both are ``RankSource.RAY``. Without either, the workers are numbered in *actor order*
(by actor name, then class name and actor id) as ``RankSource.INFERRED``, and the job's
``notes`` say that the numbers are labels, not the job's ranks (``number_workers``).

Workers. With ``patterns`` (shell patterns, ``parse_patterns``), the live actors whose
class name or name matches one. Without: Ray Train's worker actors when the job has a Ray
Train run (the run's workers, else every ``RayTrainWorker``); otherwise every live actor of
the job except Ray's own (``RAY_INTERNAL_ACTORS``: the Train controller and state actor,
the job supervisor, ...) and hangdoc's agent (``HangdocAgent``) (``select_actors``).
``ray_job_of`` puts these together into the ``RayJob`` a diagnosis reads.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import RayJobNotFound, RayWorkersNotFound, one_line, shown
from ...model import RankProcess, RankSource

# Actors that Ray (Train, Tune, jobs, Data) runs for itself, and hangdoc's agent: never
# training workers unless --workers names them.
RAY_INTERNAL_ACTORS = frozenset(
    {
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
    }
)
TRAIN_WORKER_CLASS = "RayTrainWorker"  # Ray Train V1 and V2 worker actors
TRAIN_CONTROLLER_CLASS = "TrainController"

# a job in one of these states has ended (Ray's JobStatus): its workers will not come back
ENDED_STATUSES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
MAX_JOBS_LISTED = 10  # jobs named in RayJobNotFound's help


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


def select_actors(
    actors: Sequence[ActorInfo], patterns: Sequence[str], train_actor_ids: Iterable[str] = ()
) -> tuple[ActorInfo, ...]:
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
    return sorted(actors, key=lambda a: (a.name == "", _natural(a.name), a.class_name, a.actor_id))


# ------------------------------------------------------------------ numbering


def _worker(
    actor: ActorInfo, rank: int | None, size: int | None, local: int | None, evidence: str, source: RankSource | None
) -> RayWorker:
    return RayWorker(
        pid=actor.pid,
        node_id=actor.node_id,
        node_ip=actor.node_ip,
        actor_id=actor.actor_id,
        actor_class=actor.class_name,
        actor_name=actor.name,
        world_rank=rank,
        world_size=size,
        local_rank=local,
        rank_evidence=evidence,
        rank_source=source,
    )


def _by_rank(workers: Iterable[RayWorker]) -> tuple[RayWorker, ...]:
    return tuple(sorted(workers, key=lambda w: (w.world_rank is None, w.world_rank or 0, w.actor_id)))


def number_workers(
    selected: Sequence[ActorInfo], train: TrainRanks, train_job: bool
) -> tuple[tuple[RayWorker, ...], tuple[str, ...]]:
    """The workers with their ranks, and the notes that say where the ranks came from."""
    known = {a.actor_id: train.ranks[a.actor_id] for a in selected if a.actor_id in train.ranks}
    if known:
        return _ranked_by_train(selected, known, train.note)
    if not train_job:
        return _ranked_by_order(selected, "not a Ray Train job", "not a Ray Train job")
    if train.ranks:
        return _ranked_by_order(
            selected, "not a worker of the Ray Train run", "the selected actors are not workers of the Ray Train run"
        )
    return _ranked_by_order(selected, "Ray Train run state not available", train.note)


def _ranked_by_train(
    selected: Sequence[ActorInfo], known: Mapping[str, TrainRank], note: str
) -> tuple[tuple[RayWorker, ...], tuple[str, ...]]:
    workers = []
    for actor in selected:
        tr = known.get(actor.actor_id)
        if tr is None:
            workers.append(_worker(actor, None, None, None, "not a worker of the Ray Train run", None))
        else:
            workers.append(
                _worker(
                    actor,
                    tr.world_rank,
                    tr.world_size,
                    tr.local_rank,
                    f"Ray Train world rank {tr.world_rank} ({tr.source})",
                    RankSource.RAY,
                )
            )
    notes = [note]
    outside = [a.label for a in selected if a.actor_id not in known]
    if outside:
        notes.append(
            one_line(
                f"no rank for {len(outside)} selected actors outside the Ray "
                f"Train run: {', '.join(sorted(set(outside)))}",
                1000,
            )
        )
    return _by_rank(workers), tuple(notes)


def _ranked_by_order(
    selected: Sequence[ActorInfo], reason: str, why: str
) -> tuple[tuple[RayWorker, ...], tuple[str, ...]]:
    """Numbered in actor order: ``reason`` for each worker's evidence, ``why`` for the note."""
    ordered = actor_order(selected)
    workers = tuple(
        _worker(a, i, len(ordered), None, f"actor order {i}: {reason}", RankSource.INFERRED)
        for i, a in enumerate(ordered)
    )
    note = f"rank numbers follow actor order (actor name, then class name and actor id), not the job's own ranks: {why}"
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


def ranks_from_train_runs(
    payload: Mapping[str, Any], job_id: str, alive: Iterable[str], route: str = "run state"
) -> TrainRanks:
    """Ranks by actor id from a ``/api/train/...runs`` answer, for the job's live actors.

    Of the job's runs, the latest one that has a live worker: a job may run several trainers,
    one after another (their old workers are gone) or at once (Tune: the note says so)."""
    alive_ids = set(alive)
    runs = [
        r
        for r in payload.get("train_runs") or []
        if isinstance(r, Mapping) and str(r.get("job_id", "")).lower() == job_id.lower()
    ]
    live_runs = [r for r in runs if any(w.get("actor_id") in alive_ids for w in _run_workers(r))]
    run = _latest(live_runs, "start_time_ns", "start_time_ms")
    if run is None:
        return TrainRanks({}, f"no live Ray Train run of job {job_id} in {route}")
    workers = _run_workers(run)
    ranks = {}
    for w in workers:
        rank, local = w.get("world_rank"), w.get("local_rank")
        if isinstance(w.get("actor_id"), str) and isinstance(rank, int):
            ranks[w["actor_id"]] = TrainRank(rank, local if isinstance(local, int) else None, len(workers), "run state")
    note = f"world ranks read from Ray Train's run state ({route}, run {run.get('name', '?')!s})"
    if len(live_runs) > 1:
        note += f"; the job has {len(live_runs)} live Ray Train runs: the latest is diagnosed"
    return TrainRanks(ranks, one_line(note, 300))


_GROUP_STARTED = re.compile(
    r"Started (?:training worker group of size|distributed worker "
    r"processes)\b"
)
_WORKER_LINE = re.compile(
    r"- \((?:node_id=[0-9a-fA-F]+, )?ip=(?P<ip>[^,()\s]+), pid=(?P<pid>\d+)\) "
    r"world_rank=(?P<rank>\d+), local_rank=(?P<local>\d+)"
)


def ranks_from_controller_log(text: str, actors: Sequence[ActorInfo]) -> dict[str, TrainRank]:
    """Ranks by actor id from the last worker-group listing in a Train controller's log,
    matched to the live actors by (node IP, pid)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if _GROUP_STARTED.search(line)]
    if not starts:
        return {}
    listing = []
    for line in lines[starts[-1] + 1 :]:
        m = _WORKER_LINE.search(line)
        if m is None:
            break
        listing.append(m)
    by_place = {(a.node_ip, a.pid): a for a in actors}
    ranks = {}
    for m in listing:
        actor = by_place.get((m["ip"], int(m["pid"])))
        if actor is not None:
            ranks[actor.actor_id] = TrainRank(int(m["rank"]), int(m["local"]), len(listing), "controller log")
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
    raise RayJobNotFound(f"no Ray job {shown(job)} on the cluster ({len(jobs)} jobs known)", help=_jobs_help(jobs))


def _jobs_help(jobs: Sequence[JobInfo]) -> str:
    if not jobs:
        return "The cluster has no job. " + RayJobNotFound.help
    shown_jobs = list(jobs)[-MAX_JOBS_LISTED:]  # the state API lists them oldest first
    listed = "; ".join(
        one_line(f"{j.job_id or '-'} {j.submission_id or ''} {j.status}".replace("  ", " "), 80) for j in shown_jobs
    )
    more = f" (the last {len(shown_jobs)} of {len(jobs)})" if len(jobs) > len(shown_jobs) else ""
    return f"Jobs on the cluster{more}: {listed}. " + RayJobNotFound.help


# ------------------------------------------------------------------ the job's workers


def ray_job_of(info: JobInfo, actors: Sequence[ActorInfo], patterns: Sequence[str], train: TrainRanks) -> RayJob:
    """The training workers of the started job ``info`` among its live ``actors`` and their
    ranks, from what Ray Train said (``train``); ``RayWorkersNotFound`` when none is."""
    assert info.job_id is not None
    selected = select_actors(actors, patterns, train.ranks)
    if not selected:
        raise no_workers(info, actors, patterns)
    workers, notes = number_workers(selected, train, has_train_run(actors))
    left_out = sorted({a.label for a in actors if a not in selected})
    if left_out:
        notes += (one_line(f"actors of the job left out: {', '.join(left_out)}", 1000),)
    return RayJob(info.job_id, info.submission_id, workers, notes)


def no_workers(info: JobInfo, actors: Sequence[ActorInfo], patterns: Sequence[str]) -> RayWorkersNotFound:
    """Why the job has no training worker to diagnose, and whether it still runs."""
    classes = sorted({a.class_name for a in actors})
    where = f"Ray job {info.job_id} (status {info.status})"
    running = info.status.upper() not in ENDED_STATUSES
    if not actors:
        return RayWorkersNotFound(
            f"{where} has no live actor",
            help="A job that has finished or not yet started its "
            "workers has nothing to diagnose. " + RayWorkersNotFound.help,
            running=running,
        )
    what = f"no live actor matches --workers {','.join(patterns)}" if patterns else "no live actor is a training worker"
    return RayWorkersNotFound(
        one_line(f"{where}: {what}; its actor classes: {', '.join(classes)}"),
        help=RayWorkersNotFound.help,
        running=running,
    )


def actor_processes(
    actors: Iterable[ActorInfo], job_id: str, node_id: str, host: str, own_pid: int
) -> tuple[RankProcess, ...]:
    """The live actor processes of job ``job_id`` on Ray node ``node_id`` (but the asking
    process ``own_pid``), unnumbered: what an agent on that node may sample."""
    return tuple(
        RankProcess(
            pid=a.pid, host=host, rank=None, rank_evidence=f"actor {a.label} of Ray job {job_id} on node {node_id[:12]}"
        )
        for a in actors
        if a.node_id == node_id and a.pid != own_pid
    )
