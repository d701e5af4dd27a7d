"""What the service decides from its agents' reports (``watcher``): a job is suspected when
any rank on any node has been still for the timeout, never while it is diagnosed, hung or
dismissed; an open incident resumes when no rank is still that long, and ends only when
every node that held it has reported without it."""

from __future__ import annotations

from hangdoc.fleet.jobwatch import NodeJobs, WatchedJob, WatchedRank
from hangdoc.service.records import JobState
from hangdoc.service.watcher import Report, Track, agent_views, due, job_views

STALL = 600.0


def _report(agent: str, host: str, at: float, *jobs: tuple[str, list[float]]) -> Report:
    node = NodeJobs(
        host,
        tuple(
            WatchedJob(job, 4, tuple(WatchedRank(100 + i, i, s) for i, s in enumerate(stills))) for job, stills in jobs
        ),
    )
    return Report(agent, True, node, at)


def test_a_job_is_seen_across_its_nodes_by_its_longest_still_rank() -> None:
    reports = [
        _report("a:1", "n0", 1000.0, ("j:1", [5.0, 700.0])),
        _report("b:1", "n1", 1000.0, ("j:1", [3.0, 2.0]), ("k:2", [1.0])),
    ]
    views = job_views(reports, {}, fresh_after=900.0)
    assert [v.job for v in views] == ["j:1", "k:2"]
    j = views[0]
    assert [n.node for n in j.nodes] == ["n0", "n1"] and j.still_for == 700.0 and j.world_size == 4
    assert j.nodes[0].ranks == (0, 1) and j.nodes[0].pids == (100, 101)
    assert due(views, {}, 1000.0, STALL, {"n0", "n1"}).diagnose == ("j:1",)


def test_a_stale_agent_is_not_heard() -> None:
    reports = [_report("a:1", "n0", 100.0, ("j:1", [700.0]))]
    assert job_views(reports, {}, fresh_after=900.0) == []
    assert agent_views(reports)[0].last_report == 100.0


def test_both_sides_of_the_timeout() -> None:
    below = job_views([_report("a:1", "n0", 1000.0, ("j:1", [STALL - 0.5]))], {}, 0.0)
    at = job_views([_report("a:1", "n0", 1000.0, ("j:1", [STALL]))], {}, 0.0)
    assert due(below, {}, 1000.0, STALL, {"n0"}).diagnose == ()
    assert due(at, {}, 1000.0, STALL, {"n0"}).diagnose == ("j:1",)


def test_no_second_diagnosis_while_diagnosing_hung_or_dismissed() -> None:
    views = job_views([_report("a:1", "n0", 1000.0, ("j:1", [900.0]))], {}, 0.0)
    for track in (
        Track(JobState.SUSPECTED),
        Track(JobState.HUNG, incident=3, nodes=("n0",)),
        Track(JobState.DISMISSED, until=1001.0),
    ):
        assert due(views, {"j:1": track}, 1000.0, STALL, {"n0"}).diagnose == ()
    # a dismissal runs out
    assert due(views, {"j:1": Track(JobState.DISMISSED, until=999.0)}, 1000.0, STALL, {"n0"}).diagnose == ("j:1",)


def test_an_open_incident_resumes_when_every_rank_moved() -> None:
    hung = {"j:1": Track(JobState.HUNG, incident=7, nodes=("n0",))}
    still = job_views([_report("a:1", "n0", 1000.0, ("j:1", [1.0, 900.0]))], hung, 0.0)
    moved = job_views([_report("a:1", "n0", 1000.0, ("j:1", [1.0, 2.0]))], hung, 0.0)
    assert due(still, hung, 1000.0, STALL, {"n0"}).resumed == ()
    assert due(moved, hung, 1000.0, STALL, {"n0"}).resumed == (("j:1", 7),)


def test_an_incident_ends_only_when_every_node_that_held_it_reported_without_it() -> None:
    hung = {"j:1": Track(JobState.HUNG, incident=7, nodes=("n0", "n1"))}
    assert due([], hung, 1000.0, STALL, {"n0"}).ended == ()  # n1 not heard from yet (a restart)
    assert due([], hung, 1000.0, STALL, {"n0", "n1"}).ended == (("j:1", 7),)
    assert due([], {"j:1": Track(JobState.HUNG, incident=7)}, 1000.0, STALL, {"n0"}).ended == ()
