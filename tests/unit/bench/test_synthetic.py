"""bench/synthetic.py: snapshots shaped like real ones, each analysed to its scenario's verdict."""

from __future__ import annotations

import sys

import pytest
from support.paths import REPO

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot, save_snapshot

sys.path.insert(0, str(REPO / "bench"))
from synthetic import RANKS_PER_NODE, SCENARIOS, expected, main, synthetic_snapshot


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("world", [24, 200])
def test_each_scenario_gets_its_verdict(scenario: str, world: int) -> None:
    diagnosis = analyse(synthetic_snapshot(world, scenario))
    verdict, culprits = expected(world, scenario)
    assert diagnosis.verdict is verdict, diagnosis.summary
    assert tuple(diagnosis.culprit_ranks) == culprits


def test_the_shape_is_a_real_jobs() -> None:
    snap = synthetic_snapshot(2_000, "straggler")
    assert snap.world_size == 2_000 and len(snap.ranks) == 2_000
    main_depths = {len(s.threads[0].frames) for r in snap.ranks for s in r.samples}
    assert min(main_depths) >= 36 and max(main_depths) <= 67
    threads = {len(s.threads) for r in snap.ranks for s in r.samples}
    assert min(threads) == 4 and max(threads) == 12
    assert {len(r.samples) for r in snap.ranks} == {3}
    hosts: dict[str, int] = {}
    for r in snap.ranks:
        hosts[r.process.host] = hosts.get(r.process.host, 0) + 1
    assert set(hosts.values()) == {RANKS_PER_NODE}
    distinct = {th.frames for r in snap.ranks for s in r.samples for th in s.threads}
    assert 200 <= len(distinct) <= 400  # a few hundred distinct stacks
    assert len({(r.process.host, r.process.pid) for r in snap.ranks}) == 2_000


def test_a_ranks_unchanged_threads_are_shared_across_samples_as_a_capture_shares_them() -> None:
    snap = synthetic_snapshot(2_000, "straggler")
    (busy,) = expected(2_000, "straggler")[1]
    for r in snap.ranks:
        first, *later = r.samples
        if r.process.rank == busy:  # its main thread moves; the others stay put
            assert len({id(s.threads) for s in r.samples}) == 3
            assert all(s.threads[0] != first.threads[0] for s in later)
            assert all(s.threads[1:] == first.threads[1:] for s in later)
            assert all(a is b for s in later for a, b in zip(s.threads[1:], first.threads[1:], strict=True))
        else:
            assert all(s.threads is first.threads for s in later)


def test_it_writes_a_bundle_analyze_reads(tmp_path, capsys) -> None:
    out = tmp_path / "s.json.gz"
    assert main(["--ranks", "64", "--scenario", "cleanup_deadlock", "--out", str(out)]) == 0
    assert "cleanup_deadlock" in capsys.readouterr().out
    assert analyse(load_snapshot(out)).verdict.value == "cleanup_deadlock"
    save_snapshot(load_snapshot(out), tmp_path / "again.json")  # round-trips


def test_a_bad_scenario_or_size_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown scenario"):
        synthetic_snapshot(64, "deadlock")
    with pytest.raises(ValueError, match="at least 24"):
        synthetic_snapshot(16)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scenario", ["init_deadlock", "cleanup_deadlock"])
def test_the_verdicts_of_every_rank_alike_are_right_at_30k(scenario: str) -> None:
    # an init deadlock (every rank in init_process_group) and a half-and-half cleanup deadlock
    # put every rank into one list a verdict reasons over: a quadratic step there took 7 s
    # at 8k ranks, so some 100 s at 30k, past the timeout; linear, building and analysing
    # take some 6 s here (20 s at 100k: bench/bench_scale.py measures that size)
    world = 30_000
    diagnosis = analyse(synthetic_snapshot(world, scenario))
    verdict, culprits = expected(world, scenario)
    assert diagnosis.verdict is verdict, diagnosis.summary
    assert tuple(diagnosis.culprit_ranks) == culprits
