"""Flight recorder matching over every collective of every group (issue 24 item 7): a member
without a dump that its peers' dumps list, a member that never issued an older collective
(a gather) than the group's newest, a hang in one group while another waits behind it, a
broadcast whose root the dumps do not record, and groups whose collectives ranks issue in
different orders.

The real dumps (``tests/data/flight/{unseen_member,gather_never_issued,two_groups,
broadcast_root}``) were recorded once from hung 3-rank (two_groups: 4-rank) gloo jobs by
``tests/data/flight/record_groups.py``, and ``{subgroup_skip,order_inversion,
object_collective_skip,extra_barrier,all_to_all_skip}`` by ``record_more.py``; they are
replayed here through ``hangdoc analyze DIR --json`` (the CLI, real files) and through
``match_flight``/``settle.by_flight``, with every recorded hung dump of ``tests/data/flight``
held to its verdict and culprits.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from support.factories import make_snapshot
from support.paths import TESTS
from support.settling import with_dumps

from hangdoc.analysis.analyse import analyse
from hangdoc.analysis.flight import FlightKind, match_flight
from hangdoc.capture.dumps.flight_files import read_flight_dir
from hangdoc.capture.read.flight_recorder import read_flight_record
from hangdoc.cli import main
from hangdoc.model import Confidence, FlightRecord, Verdict

pytestmark = pytest.mark.timeout(60)
DUMPS = TESTS / "data" / "flight"
C10D = "torch/distributed/distributed_c10d.py"
ALL_REDUCE = ["train.py:main:10", "train.py:step:40", f"{C10D}:all_reduce:2800"]
SUB_REDUCE = ["train.py:main:10", "train.py:step:52", f"{C10D}:all_reduce:2800"]
LOADING = ["train.py:main:10", "train.py:next_batch:71", "time.py:sleep"]

# every recorded hung job's dumps: (verdict, culprits, confidence) by `hangdoc analyze DIR`
EXPECTED = {
    "op_mismatch": ("collective_mismatch", [0], "medium"),
    "behind": ("straggler", [1], "medium"),
    "drifted_broadcast": ("collective_mismatch", [1], "medium"),
    "drifted_silent": ("collective_mismatch", [1], "medium"),
    "size_mismatch": ("collective_mismatch", [2], "medium"),
    "p2p_pipeline": ("unknown", [], "low"),
    "unseen_member": ("straggler", [2], "low"),  # not seen: named on its peers' word
    "gather_never_issued": ("straggler", [2], "medium"),
    "two_groups": ("straggler", [0], "low"),  # gloo's subgroup configs list no ranks: size unknown
    "broadcast_root": ("unknown", [], "low"),
    # record_more.py; gloo's WORLD config lists no ranks once subgroups exist: size unknown, low
    "subgroup_skip": ("collective_mismatch", [5], "low"),  # not ranks 3-4, whom WORLD's collective names
    "order_inversion": ("collective_mismatch", [0, 1], "low"),  # two ranks, one order each: a tie
    "object_collective_skip": ("collective_mismatch", [2], "medium"),
    "extra_barrier": ("collective_mismatch", [0], "medium"),
    "all_to_all_skip": ("collective_mismatch", [1], "medium"),
}


def analyze_json(capsys: pytest.CaptureFixture[str], case: str) -> dict:
    """``hangdoc analyze tests/data/flight/CASE --json``, through the CLI."""
    assert main(["analyze", str(DUMPS / case), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def real_records(case: str) -> dict[int, FlightRecord]:
    return {r.rank: r.flight for r in read_flight_dir(DUMPS / case).ranks if r.flight and r.rank is not None}


def with_flight(snapshot, records: dict[int, FlightRecord]):
    return dataclasses.replace(
        snapshot, ranks=tuple(dataclasses.replace(r, flight=records.get(r.rank)) for r in snapshot.ranks)
    )


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_every_recorded_hung_dump_gets_its_verdict_and_culprits(capsys, case: str) -> None:
    report = analyze_json(capsys, case)
    assert (report["verdict"], report["culprit_ranks"], report["confidence"]) == EXPECTED[case]


# ------------------------------------------------------------------ (a) a member with no dump


def test_a_member_without_a_dump_that_its_peers_list_is_waited_on_not_missing(capsys) -> None:
    report = analyze_json(capsys, "unseen_member")
    assert report["summary"] == (
        "ranks 0-1 wait in collective #4 (all_reduce Float[1000]) of default_pg (0) for rank 2, which their "
        "dumps list as a member and which left no dump (not seen) (flight recorder)"
    )
    assert report["evidence"][1:] == [
        (
            "every rank of default_pg (0) with a dump issued collective #4; their dumps list rank 2 as a member "
            "of default_pg (0): the collective waits on it"
        ),
        (
            "rank 2 left no flight recorder dump: not seen, which is no evidence of a dead process; whether it "
            "lags before #4 or waits inside it the dumps cannot show"
        ),
    ]
    assert report["verdict"] != "rank_missing" and report["confidence"] == "low"
    # the dumps' WORLD config gives the job's size: rank 2 is known to exist, not seen, never missing
    assert {r["rank"]: r["state"] for r in report["ranks"]}.get(2) == "unknown"
    assert "missing" not in {r["state"] for r in report["ranks"]}


def test_gloo_names_world_blank_in_its_config_and_the_entries_place_it() -> None:
    records = real_records("unseen_member")
    assert {(g.name, g.ranks) for rec in records.values() for g in rec.groups} == {("", (0, 1, 2))}
    found = match_flight(read_flight_dir(DUMPS / "unseen_member"))
    assert found is not None and (found.kind, found.culprits, found.unseen) == (FlightKind.UNSEEN, (2,), (2,))
    # an unnamed config that does not hold the rank that wrote it is not that rank's WORLD
    raw = json.loads((DUMPS / "unseen_member" / "fr_trace_0.json").read_text())
    raw["pg_config"][""]["ranks"] = "[1, 2]"
    odd = {**records, 0: read_flight_record(json.dumps(raw).encode())}
    snap = read_flight_dir(DUMPS / "unseen_member")
    snap = dataclasses.replace(snap, ranks=tuple(dataclasses.replace(r, flight=odd[r.rank]) for r in snap.ranks))
    found = match_flight(snap)
    assert found is not None and found.unseen == (2,)  # rank 1's config still lists it


def test_stacks_that_see_the_rank_without_a_dump_keep_their_confidence() -> None:
    snap = make_snapshot({0: ALL_REDUCE, 1: ALL_REDUCE, 2: LOADING})
    found = match_flight(with_flight(snap, real_records("unseen_member")))
    assert found is not None and (found.kind, found.culprits, found.unseen) == (FlightKind.UNSEEN, (2,), ())
    diagnosis = analyse(with_flight(snap, real_records("unseen_member")))
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == (Verdict.STRAGGLER, (2,))
    assert diagnosis.confidence is Confidence.MEDIUM  # seen by its stacks: not capped as not seen


# ------------------------------------------------------------------ (b) an older collective never issued


def test_a_member_that_never_issued_a_gather_is_found_below_the_newest_collective(capsys) -> None:
    report = analyze_json(capsys, "gather_never_issued")
    assert report["summary"] == (
        "rank 2 has not called collective #8 (gather Float[1]) of default_pg (0), "
        "which rank 0 waits in (flight recorder)"
    )
    assert report["evidence"] == [
        "rank 0 issued collective #8 (gather Float[1]) of default_pg (0) and has not finished it",
        "issued so far on default_pg (0): rank 2 up to #7",
        (
            "rank 1 finished its side of collective #8 and waits in collective #9 (all_reduce Float[1]) of "
            "default_pg (0)"
        ),
    ]
    found = match_flight(read_flight_dir(DUMPS / "gather_never_issued"))
    assert found is not None and (found.kind, found.seq, found.culprits) == (FlightKind.BEHIND, 8, (2,))


# ------------------------------------------------------------------ (c) one group waits behind another


def test_a_hang_in_one_group_names_its_cause_not_the_victim_another_group_waits_for(capsys) -> None:
    report = analyze_json(capsys, "two_groups")
    assert report["summary"] == (
        "rank 0 has not called collective #5 (all_reduce Float[8]) of group 1, which rank 1 waits in (flight recorder)"
    )
    assert report["evidence"] == [
        "rank 1 issued collective #5 (all_reduce Float[8]) of group 1 and has not finished it",
        "issued so far on group 1: rank 0 up to #4",
        (
            "ranks 2-3 wait in collective #3 (all_reduce Float[32]) of group 2, which rank 1 has not called: "
            "rank 1 waits in collective #5 (all_reduce Float[8]) of group 1 for rank 0"
        ),
    ]


def test_two_groups_with_stacks() -> None:
    # the stacks: rank 0 loading data, rank 1 in group 1's all_reduce, ranks 2-3 in group 2's
    snap = with_flight(
        make_snapshot({0: LOADING, 1: SUB_REDUCE, 2: ALL_REDUCE, 3: ALL_REDUCE}), real_records("two_groups")
    )
    found = match_flight(snap)
    assert found is not None and (found.kind, found.group, found.culprits) == (FlightKind.BEHIND, "group 1", (0,))
    diagnosis = analyse(snap)
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == (Verdict.STRAGGLER, (0,))
    assert diagnosis.evidence[2].words() == (
        "ranks 2-3 wait in collective #3 (all_reduce Float[32]) of group 2, which rank 1 has not called: "
        "rank 1 waits in collective #5 (all_reduce Float[8]) of group 1 for rank 0"
    )


def _rec(rank: int, *ops: tuple[str, int, bool]) -> FlightRecord:
    """A gloo-shaped dump: (group, number, finished) per op, every op an all_reduce."""
    entries = [
        {
            "record_id": i,
            "process_group": [g, "default_pg" if g == "0" else "undefined"],
            "collective_seq_id": n,
            "p2p_seq_id": 0,
            "profiling_name": "gloo:all_reduce",
            "input_sizes": [[4]],
            "input_dtypes": ["Float"],
            "is_p2p": False,
            "state": "scheduled",
            "retired": done,
        }
        for i, (g, n, done) in enumerate(ops)
    ]
    return read_flight_record(
        json.dumps(
            {"version": "2.10", "entries": entries, "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}}}
        ).encode()
    )


def test_groups_called_in_different_orders_wait_on_each_other() -> None:
    # ranks 0 and 1 share groups 1 and 2; rank 0 calls 1 then 2, rank 1 calls 2 then 1
    snap = make_snapshot({0: ALL_REDUCE, 1: SUB_REDUCE})
    records = {
        0: _rec(0, ("0", 1, True), ("1", 1, True), ("2", 1, True), ("1", 2, False)),
        1: _rec(1, ("0", 1, True), ("1", 1, True), ("2", 1, True), ("2", 2, False)),
    }
    found = match_flight(with_flight(snap, records))
    assert found is not None and (found.kind, found.culprits) == (FlightKind.GROUP_CYCLE, (0, 1))
    assert found.verdict is Verdict.COLLECTIVE_MISMATCH
    assert found.evidence == (
        "rank 0 waits in collective #2 (all_reduce Float[4]) of group 1 for rank 1",
        "rank 1 waits in collective #2 (all_reduce Float[4]) of group 2 for rank 0",
    )


def test_waits_that_end_in_a_collective_every_member_called_name_no_one() -> None:
    # rank 1 waits in group 1 with rank 0 (both called it); rank 2 waits in group 2 for rank 1
    snap = make_snapshot({0: ALL_REDUCE, 1: ALL_REDUCE, 2: SUB_REDUCE})
    records = {
        0: _rec(0, ("0", 1, True), ("1", 1, False)),
        1: _rec(1, ("0", 1, True), ("2", 1, True), ("1", 1, False)),
        2: _rec(2, ("0", 1, True), ("2", 1, True), ("2", 2, False)),
    }
    found = match_flight(with_flight(snap, records))
    assert found is not None and (found.kind, found.group, found.culprits) == (FlightKind.ALL_IN, "group 1", ())
    assert found.evidence == (
        "ranks 0-1 all issued collective #1 (all_reduce Float[4]) of group 1; none has finished it (flight recorder)",
        (
            "rank 2 waits in collective #2 (all_reduce Float[4]) of group 2, which rank 1 has not called: rank 1 "
            "waits in collective #1 (all_reduce Float[4]) of group 1"
        ),
    )


def test_a_member_that_skipped_its_subgroups_collective_is_outvoted_by_the_members_of_both(capsys) -> None:
    # ranks 3-4 wait in group 2 for rank 5; rank 5 waits in WORLD with ranks 0-2 for ranks 3-4
    report = analyze_json(capsys, "subgroup_skip")
    assert report["summary"] == (
        "collective mismatch (flight recorder): rank 5 issued collective #3 of default_pg (0) first while "
        "ranks 3-4 issued collective #3 of group 2 first: the ranks wait on each other across process groups"
    )
    assert report["evidence"][2:] == [
        "ranks 3-4 issued collective #3 of group 2 first",
        "rank 5 issued collective #3 of default_pg (0) first",
        (
            "ranks 3-5, the members of group 2 and default_pg (0) with a dump, issued these collectives in "
            "different orders: ranks 3-4 one way, rank 5 the other"
        ),
        (
            "ranks 0-2 wait in collective #3 (all_reduce Float[1000]) of default_pg (0) for ranks 3-4, which wait "
            "in the cycle"
        ),
    ]
    found = match_flight(read_flight_dir(DUMPS / "subgroup_skip"))
    assert found is not None and (found.kind, found.culprits) == (FlightKind.GROUP_CYCLE, (5,))


def test_two_ranks_that_issue_two_groups_in_opposite_orders_are_both_named(capsys) -> None:
    report = analyze_json(capsys, "order_inversion")
    assert report["evidence"] == [
        "rank 0 waits in collective #3 (all_reduce Float[1000]) of group 1 for rank 1",
        "rank 1 waits in collective #3 (all_reduce Float[4]) of group 2 for rank 0",
    ]
    found = match_flight(read_flight_dir(DUMPS / "order_inversion"))
    assert found is not None and (found.kind, found.culprits) == (FlightKind.GROUP_CYCLE, (0, 1))


def test_the_members_of_both_groups_decide_which_order_is_wrong() -> None:
    # ranks 0-2 share groups 1 and 2; at #2 ranks 0-1 call 1 then 2, rank 2 calls 2 then 1
    snap = make_snapshot({0: ALL_REDUCE, 1: ALL_REDUCE, 2: SUB_REDUCE})
    both = (("0", 1, True), ("1", 1, True), ("2", 1, True))
    records = {
        0: _rec(0, *both, ("1", 2, False)),
        1: _rec(1, *both, ("1", 2, False)),
        2: _rec(2, *both, ("2", 2, False)),
    }
    found = match_flight(with_flight(snap, records))
    assert found is not None and (found.kind, found.culprits) == (FlightKind.GROUP_CYCLE, (2,))
    assert found.verdict is Verdict.COLLECTIVE_MISMATCH
    assert found.evidence[-1] == (
        "ranks 0-2, the members of group 1 and group 2 with a dump, issued these "
        "collectives in different orders: ranks 0-1 one way, rank 2 the other"
    )
    # two against two: a tie names every member that took a side, not only the two a cycle passes
    snap = make_snapshot({0: ALL_REDUCE, 1: ALL_REDUCE, 2: SUB_REDUCE, 3: SUB_REDUCE})
    records[3] = _rec(3, *both, ("2", 2, False))
    found = match_flight(with_flight(snap, records))
    assert found is not None and (found.kind, found.culprits) == (FlightKind.GROUP_CYCLE, (0, 1, 2, 3))


def test_only_members_of_every_group_in_the_cycle_vote() -> None:
    # rank 3 is only in group 2 and waits there with rank 2: it has no say on the order of
    # groups 1 and 2, so ranks 0 and 2 tie and both are named
    snap = make_snapshot({0: ALL_REDUCE, 2: SUB_REDUCE, 3: SUB_REDUCE})
    records = {
        0: _rec(0, ("0", 1, True), ("1", 1, True), ("2", 1, True), ("1", 2, False)),
        2: _rec(2, ("0", 1, True), ("1", 1, True), ("2", 1, True), ("2", 2, False)),
        3: _rec(3, ("0", 1, True), ("2", 1, True), ("2", 2, False)),
    }
    found = match_flight(with_flight(snap, records))
    assert found is not None and (found.kind, found.culprits) == (FlightKind.GROUP_CYCLE, (0, 2))


# ------------------------------------------------------------------ (d) a root the dumps do not record


def test_a_broadcast_whose_root_the_dumps_do_not_record_names_no_one(capsys) -> None:
    report = analyze_json(capsys, "broadcast_root")
    assert report["summary"] == (
        "every rank of default_pg (0) issued collective #8 (broadcast Float[64]); ranks 0,2 have not finished "
        "it while rank 1 finished its side (flight recorder)"
    )
    assert report["evidence"] == [
        "ranks 0,2 issued collective #8 (broadcast Float[64]) of default_pg (0) and have not finished it",
        (
            "rank 1 finished its side of collective #8 and waits in collective #9 (all_reduce Float[1]) of "
            "default_pg (0)"
        ),
        (
            "the dumps do not record a broadcast's root (src/dst): whether the ranks agree on it they cannot "
            "show, so they name no culprit"
        ),
    ]
    found = match_flight(read_flight_dir(DUMPS / "broadcast_root"))
    assert found is not None and (found.kind, found.culprits, found.verdict) == (FlightKind.STUCK, (), None)
    diagnosis = with_dumps(
        analyse(dataclasses.replace(read_flight_dir(DUMPS / "broadcast_root"))), found, had_stacks=False
    )
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == (Verdict.UNKNOWN, ())


def test_stacks_that_blame_the_rank_past_the_broadcast_are_overruled() -> None:
    # ranks 0,2 sit in broadcast, rank 1 in the next all_reduce: the stacks blame rank 1,
    # which the dumps show got its data and waits past #8
    broadcast = ["train.py:main:10", "train.py:step:44", f"{C10D}:broadcast:2600"]
    loss = ["train.py:main:10", "train.py:step:46", f"{C10D}:all_reduce:2800"]
    snap = make_snapshot({0: broadcast, 1: loss, 2: broadcast})
    stacks = analyse(snap)
    assert (stacks.verdict, stacks.culprit_ranks) == (Verdict.COLLECTIVE_MISMATCH, (1,))
    diagnosis = analyse(with_flight(snap, real_records("broadcast_root")))
    assert (diagnosis.verdict, diagnosis.culprit_ranks, diagnosis.confidence) == (Verdict.UNKNOWN, (), Confidence.LOW)
    assert any(
        e.words().startswith("the stacks alone read collective_mismatch (culprits 1)")
        and e.words().endswith(
            "the flight recorder shows rank 1 finished its side of collective #8 of default_pg (0), which the others "
            "wait in"
        )
        for e in diagnosis.evidence
    )


# ------------------------------------------------------------------ the files each rank came from


def test_each_rank_read_from_a_file_names_its_own_file() -> None:
    snap = read_flight_dir(DUMPS / "two_groups")
    assert [(r.rank, r.process.rank_evidence) for r in snap.ranks] == [
        (r, f"from the dump's file name fr_trace_{r}.json") for r in range(4)
    ]


def test_each_rank_read_from_a_dump_names_its_own_file_in_the_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    report = analyze_json(capsys, "two_groups")
    evidence = {r["rank"]: r["rank_evidence"] for r in report["ranks"] if r["pid"] in (None, 0)}
    assert len(evidence) >= 2 and len(set(evidence.values())) == len(evidence), evidence
    for rank, said in evidence.items():
        assert str(rank) in said, (rank, said)
