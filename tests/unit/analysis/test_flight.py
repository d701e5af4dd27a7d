"""Flight recorder dumps: reading them (JSON and torch's pickle, never code), matching each
group's collectives across ranks by sequence number, and folding that into the stack
diagnosis. The real dumps in ``tests/data/flight/`` were recorded from hung gloo jobs by
``tests/data/flight/record.py``."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
from pathlib import Path

import pytest
from support.factories import make_snapshot
from support.paths import TESTS
from support.settling import with_dumps

from hangdoc.analysis.analyse import analyse
from hangdoc.analysis.flight import FlightKind, match_flight
from hangdoc.bundle import snapshot_from_dict, snapshot_to_dict
from hangdoc.capture.dumps.flight_files import FlightDirError, read_flight_dir
from hangdoc.capture.read.flight_recorder import (
    MAX_ENTRIES,
    FlightRecordInvalid,
    read_flight_record,
)
from hangdoc.model import Confidence, FlightEntry, FlightGroup, FlightRecord, Verdict

DUMPS = TESTS / "data" / "flight"
ALL_REDUCE = ["train.py:main:10", "train.py:step:40", "torch/distributed/distributed_c10d.py:all_reduce:2800"]
SLEEPING = ["train.py:main:10", "train.py:wait_for_checkpoint:77", "time.py:sleep"]


def entry(
    seq: int,
    op: str = "all_reduce",
    size: int = 4,
    dtype: str = "Float",
    *,
    group: str = "0",
    retired: bool = True,
    p2p: bool = False,
) -> dict[str, object]:
    """One entry as torch writes it."""
    return {
        "record_id": seq,
        "pg_id": 0,
        "process_group": [group, "default_pg" if group == "0" else "tp"],
        "collective_seq_id": 0 if p2p else seq,
        "p2p_seq_id": seq if p2p else 0,
        "op_id": seq,
        "profiling_name": f"gloo:{op}",
        "input_sizes": [[size]],
        "input_dtypes": [dtype],
        "output_sizes": [[size]],
        "output_dtypes": [dtype],
        "is_p2p": p2p,
        "state": "scheduled",
        "retired": retired,
        "timeout_ms": 600000,
    }


def dump(*entries: dict[str, object], ranks: str = "[0, 1, 2]") -> dict[str, object]:
    return {
        "version": "2.10",
        "entries": list(entries),
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
        "pg_status": {},
    }


def record(*entries: dict[str, object], ranks: str = "[0, 1, 2]") -> FlightRecord:
    return read_flight_record(json.dumps(dump(*entries, ranks=ranks)).encode())


def with_flight(snapshot, records: dict[int, FlightRecord]):
    return dataclasses.replace(
        snapshot, ranks=tuple(dataclasses.replace(r, flight=records.get(r.rank)) for r in snapshot.ranks)
    )


# ------------------------------------------------------------------ real dumps, dumps alone


def test_real_dumps_op_mismatch_names_the_rank_that_broadcast() -> None:
    diagnosis = analyse(read_flight_dir(DUMPS / "op_mismatch"))
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == (Verdict.COLLECTIVE_MISMATCH, (0,))
    assert diagnosis.summary == (
        "collective mismatch (flight recorder): rank 0 called broadcast Float[1] as collective #8 of "
        "default_pg (0) while ranks 1-2 called all_reduce Float[1000]"
    )
    assert tuple(e.words() for e in diagnosis.evidence) == (
        "ranks 1-2 recorded all_reduce Float[1000] as collective #8 of default_pg (0)",
        "rank 0 recorded broadcast Float[1] as collective #8 of default_pg (0)",
        (
            "ranks 1-2 recorded all_reduce Float[1000] as every collective #7-#8 of default_pg (0): a call among "
            "them skipped (or added) on rank 0 would shift the numbers without showing before #8"
        ),
        "ranks 0-2 recorded the same calls (op, sizes, dtypes) as collectives #1-#7 of default_pg (0)",
    )
    assert diagnosis.confidence is Confidence.MEDIUM  # dumps alone: still waiting is not shown
    assert "no stacks" in diagnosis.basis[-1]


def test_real_dumps_rank_behind_is_the_one_that_skipped_a_collective() -> None:
    diagnosis = analyse(read_flight_dir(DUMPS / "behind"))
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == (Verdict.STRAGGLER, (1,))
    assert diagnosis.summary == (
        "rank 1 has not called collective #10 (all_reduce Float[1]) of default_pg (0), "
        "which ranks 0,2 wait in (flight recorder)"
    )
    assert "issued so far on default_pg (0): rank 1 up to #9" in [e.words() for e in diagnosis.evidence]


def test_a_directory_without_dumps_is_one_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "trace_0").write_text("not a dump")
    with pytest.raises(FlightDirError, match="no flight recorder dump") as caught:
        read_flight_dir(tmp_path)
    assert "\n" not in str(caught.value) and "trace_0" in str(caught.value)


def test_two_dumps_of_one_rank_are_refused(tmp_path: Path) -> None:
    raw = json.dumps(dump(entry(1))).encode()
    (tmp_path / "fr_trace_1").write_bytes(raw)
    (tmp_path / "other_1.json").write_bytes(raw)
    with pytest.raises(FlightDirError, match="two dumps for rank 1"):
        read_flight_dir(tmp_path)


# ------------------------------------------------------------------ reading a dump


def test_torch_pickle_reads_like_json() -> None:
    data = dump(entry(1), entry(2, "broadcast", retired=False))
    assert read_flight_record(pickle.dumps(data)) == read_flight_record(json.dumps(data).encode())
    rec = read_flight_record(pickle.dumps(data))
    assert [(e.seq, e.op, e.retired) for e in rec.entries] == [(1, "all_reduce", True), (2, "broadcast", False)]
    assert rec.groups == (FlightGroup("0", "default_pg", (0, 1, 2)),)


class _Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (pickle.dumps({"entries": [_Boom()]}), "plain data only"),
        (b"\x80\x04garbage", "not a readable pickle"),
        (b"{not json", "not valid JSON"),
        (b"hello", "neither JSON nor a pickle"),
        (json.dumps({"version": "2.10"}).encode(), "no 'entries'"),
        (json.dumps({"entries": [1]}).encode(), "entry 0 is not an object"),
        (json.dumps({"entries": [dict(entry(1), collective_seq_id="x")]}).encode(), "entry 0"),
        (json.dumps({"entries": [dict(entry(1), collective_seq_id=-1)]}).encode(), "out of range"),
        (json.dumps({"entries": [dict(entry(1), input_sizes="[4]")]}).encode(), "sizes are not a list"),
    ],
)
def test_bad_dumps_are_one_line_and_never_run_code(raw: bytes, message: str) -> None:
    with pytest.raises(FlightRecordInvalid, match=message) as caught:
        read_flight_record(raw)
    assert "\n" not in str(caught.value)


def test_a_huge_ring_is_cut_to_its_newest_entries() -> None:
    rec = record(*(entry(i) for i in range(1, MAX_ENTRIES + 11)))
    assert len(rec.entries) == MAX_ENTRIES and rec.entries[-1].seq == MAX_ENTRIES + 10


def test_bundles_keep_the_dumps() -> None:
    snap = with_flight(make_snapshot({0: ALL_REDUCE, 1: ALL_REDUCE}), {0: record(entry(1)), 1: record(entry(1))})
    assert snapshot_from_dict(json.loads(json.dumps(snapshot_to_dict(snap)))) == snap


# ------------------------------------------------------------------ matching


def test_a_tie_is_a_mismatch_without_culprits() -> None:
    snap = make_snapshot({0: ALL_REDUCE, 1: ALL_REDUCE})
    found = match_flight(
        with_flight(
            snap,
            {
                0: record(entry(5, retired=False), ranks="[0, 1]"),
                1: record(entry(5, "broadcast", retired=False), ranks="[0, 1]"),
            },
        )
    )
    assert found is not None and (found.kind, found.culprits, found.seq) == (FlightKind.MISMATCH, (), 5)
    assert "no call is the majority's" in found.summary


def test_the_first_differing_number_decides_even_when_the_ring_lost_older_ones() -> None:
    # rank 2's ring starts at #3: only the numbers every rank still holds are compared
    early = [entry(i) for i in (1, 2)]
    same = [entry(i) for i in (3, 4)]
    snap = make_snapshot({0: ALL_REDUCE, 1: ALL_REDUCE, 2: ALL_REDUCE})
    found = match_flight(
        with_flight(
            snap,
            {
                0: record(*early, *same, entry(5, size=8, retired=False)),
                1: record(*early, *same, entry(5, size=8, retired=False)),
                2: record(*same, entry(5, size=16, retired=False)),
            },
        )
    )
    assert found is not None and (found.kind, found.culprits, found.seq) == (FlightKind.MISMATCH, (2,), 5)
    assert found.evidence == (
        "ranks 0-1 recorded all_reduce Float[8] as collective #5 of default_pg (0)",
        "rank 2 recorded all_reduce Float[16] as collective #5 of default_pg (0)",
        "ranks 0-2 recorded the same calls (op, sizes, dtypes) as collectives #3-#4 of default_pg (0)",
    )
    assert found.summary.endswith("while ranks 0-1 called all_reduce Float[8]: same op, different sizes")


def test_all_in_and_a_member_without_a_dump() -> None:
    # every rank with a dump waits in #2 and their config lists rank 3, which left none and
    # has no stacks: the collective waits on it (not seen: low, never "missing")
    snap = make_snapshot({0: ALL_REDUCE, 1: ALL_REDUCE, 2: ALL_REDUCE})
    flights = with_flight(snap, {r: record(entry(1), entry(2, retired=False), ranks="[0, 1, 2, 3]") for r in (0, 1, 2)})
    found = match_flight(flights)
    assert found is not None and (found.kind, found.culprits, found.unseen) == (FlightKind.UNSEEN, (3,), (3,))
    assert (
        found.evidence[0]
        == "ranks 0-2 issued collective #2 (all_reduce Float[4]) of default_pg (0) and have not finished it"
    )
    assert "rank 3 left no flight recorder dump: not seen" in found.evidence[2]
    diagnosis = analyse(flights)
    assert (diagnosis.verdict, diagnosis.culprit_ranks, diagnosis.confidence) == (
        Verdict.STRAGGLER,
        (3,),
        Confidence.LOW,
    )
    # the same with every member's dump: they all wait in it, and the dumps name no one
    found = match_flight(with_flight(snap, {r: record(entry(1), entry(2, retired=False)) for r in (0, 1, 2)}))
    assert found is not None and (found.kind, found.culprits) == (FlightKind.ALL_IN, ())
    assert found.evidence == (
        (
            "ranks 0-2 all issued collective #2 (all_reduce Float[4]) of default_pg (0); none has finished it "
            "(flight recorder)"
        ),
    )


def test_nothing_pending_and_p2p_ops_give_no_finding() -> None:
    snap = make_snapshot({0: ALL_REDUCE, 1: ALL_REDUCE})
    done = {r: record(entry(1), entry(2), entry(3, "send", p2p=True, retired=False), ranks="[0, 1]") for r in (0, 1)}
    assert match_flight(with_flight(snap, done)) is None
    assert match_flight(snap) is None  # no dump at all


def test_groups_are_matched_apart_and_a_mismatch_outranks_a_lag() -> None:
    snap = make_snapshot({r: ALL_REDUCE for r in range(4)})
    world = [entry(1)]
    records = {
        0: record(*world, entry(1, group="7"), entry(2, group="7", retired=False)),
        1: record(*world, entry(1, group="7")),  # behind on group 7
        2: record(*world, entry(1, group="9", retired=False)),
        3: record(*world, entry(1, "broadcast", group="9", retired=False)),  # a tie on group 9
    }
    found = match_flight(with_flight(snap, records))
    assert found is not None and found.kind is FlightKind.MISMATCH and found.group == "tp (9)"
    records[3] = record(*world, entry(1, group="9", retired=False))
    found = match_flight(with_flight(snap, records))
    assert found is not None and (found.kind, found.culprits, found.group) == (FlightKind.BEHIND, (1,), "tp (7)")


# ------------------------------------------------------------------ into the stack diagnosis


def _behind_snapshot(stacks: dict[int, list[str]]):
    records = {
        0: record(entry(1), entry(2, retired=False)),
        1: record(entry(1)),
        2: record(entry(1), entry(2, retired=False)),
    }
    return with_flight(make_snapshot(stacks), records)


def test_dumps_that_agree_with_the_stacks_raise_the_confidence() -> None:
    snap = _behind_snapshot({0: ALL_REDUCE, 1: SLEEPING, 2: ALL_REDUCE})
    plain = analyse(dataclasses.replace(snap, ranks=tuple(dataclasses.replace(r, flight=None) for r in snap.ranks)))
    both = analyse(snap)
    assert (both.verdict, both.culprit_ranks) == (plain.verdict, plain.culprit_ranks) == (Verdict.STRAGGLER, (1,))
    assert both.summary == plain.summary  # the stacks' own words stay
    assert plain.ambiguous and both.confidence is plain.confidence  # idle 1 s: it may still come
    settled = with_dumps(dataclasses.replace(plain, ambiguous=False, confidence=Confidence.MEDIUM), match_flight(snap))
    assert settled.confidence is Confidence.HIGH
    assert both.evidence[0].words().startswith("ranks 0,2 issued collective #2")
    assert both.basis[0] == "flight recorder: collective #2 of default_pg (0) not yet called by the culprits"


def test_dumps_override_stacks_that_cannot_tell_and_say_so() -> None:
    # every rank at the same line: the stacks read a transport hang (rank 1's wait is
    # another call of the same wrapper); the dumps show rank 1 never issued #2
    snap = _behind_snapshot({0: ALL_REDUCE, 1: ALL_REDUCE, 2: ALL_REDUCE})
    stacks_only = analyse(
        dataclasses.replace(snap, ranks=tuple(dataclasses.replace(r, flight=None) for r in snap.ranks))
    )
    diagnosis = analyse(snap)
    assert stacks_only.verdict is not Verdict.STRAGGLER
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == (Verdict.STRAGGLER, (1,))
    assert any(
        e.words().startswith(f"the stacks alone read {stacks_only.verdict.value}")
        and e.words().endswith("the flight recorder overrides it")
        for e in diagnosis.evidence
    )


def test_a_job_the_stacks_saw_progressing_stays_not_hung() -> None:
    moving = make_snapshot({0: ALL_REDUCE, 1: ALL_REDUCE})
    base = analyse(moving)
    diagnosis = dataclasses.replace(base, verdict=Verdict.NOT_HUNG, culprit_ranks=())
    found = match_flight(
        with_flight(
            moving, {0: record(entry(1), entry(2, retired=False), ranks="[0, 1]"), 1: record(entry(1), ranks="[0, 1]")}
        )
    )
    after = with_dumps(diagnosis, found)
    assert after.verdict is Verdict.NOT_HUNG and after.culprit_ranks == ()
    assert after.evidence[-1].words().startswith("flight recorder (not weighed: the stacks saw progress)")


def test_an_entry_describes_itself() -> None:
    e = FlightEntry(group="0", seq=3, op="all_gather", input_sizes=((4, 8), (2,)), input_dtypes=("BFloat16", "Long"))
    assert e.describe() == "all_gather BFloat16[4,8]+Long[2]"


def test_a_rank_still_working_stays_as_unsure_as_the_stacks_leave_it() -> None:
    snap = _behind_snapshot({0: ALL_REDUCE, 1: SLEEPING, 2: ALL_REDUCE})
    base = analyse(snap)
    unsure = dataclasses.replace(base, ambiguous=True, confidence=Confidence.MEDIUM)
    after = with_dumps(unsure, match_flight(snap))
    assert after.culprit_ranks == (1,) and after.ambiguous and after.confidence is Confidence.MEDIUM
    assert after.evidence[0].words().startswith("ranks 0,2 issued collective #2")
