"""Version 2 bundles (tables): exact round trips of every recorded and synthetic snapshot,
shared objects on loading, version 1 files still read, the size per rank, and one-line
errors that say where a table is wrong."""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from support.factories import make_rank, make_snapshot
from support.paths import REPO, TESTS
from test_bundle import rich_snapshot

from hangdoc import bundle
from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import (
    load_snapshot,
    save_snapshot,
    snapshot_bytes,
    snapshot_from_dict,
    snapshot_to_dict,
)
from hangdoc.errors import BundleError
from hangdoc.model import (
    CaptureErrorKind,
    FlightEntry,
    FlightGroup,
    FlightRecord,
    Frame,
    GpuState,
    Heartbeat,
    JobSnapshot,
    Note,
    NoteKind,
    RankSource,
    ThreadException,
    ThreadStack,
    Verdict,
)

sys.path.insert(0, str(REPO / "bench"))
from synthetic import SCENARIOS, synthetic_snapshot

RECORDED = sorted((TESTS / "snapshots").glob("*.json.gz")) + [TESTS / "data" / "demo_mismatch.json.gz"]
V1_FIXTURES = sorted((TESTS / "data" / "bundles_v1").glob("*.json.gz"))
TRUNK = ["<frozen runpy>:_run_module_as_main:198", "train.py:<module>:60", "train.py:main:55"]
ALL_REDUCE = [*TRUNK, "train.py:step:30", "torch/distributed/distributed_c10d.py:all_reduce:2800"]
SIDE = {"pin_memory": ["threading.py:_bootstrap:995", "threading.py:run:100"]}


def _through_json(snapshot: JobSnapshot, version: int = 2) -> JobSnapshot:
    return snapshot_from_dict(json.loads(json.dumps(snapshot_to_dict(snapshot, schema_version=version))))


def _threads(snapshot: JobSnapshot) -> list[ThreadStack]:
    return [th for r in snapshot.ranks for s in r.samples for th in s.threads]


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
def test_every_recorded_snapshot_round_trips(tmp_path: Path, path: Path) -> None:
    snap = load_snapshot(path)  # version 1, as recorded
    assert _through_json(snap) == snap
    save_snapshot(snap, tmp_path / "v2.json.gz")
    assert load_snapshot(tmp_path / "v2.json.gz") == snap


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_synthetic_snapshots_round_trip(scenario: str) -> None:
    snap = synthetic_snapshot(200, scenario)
    back = _through_json(snap)
    assert back == snap
    assert analyse(back).verdict is analyse(snap).verdict


def varied_snapshot(ranks: int = 80) -> JobSnapshot:
    """Every kind of field, varied over enough ranks that tables share columns and write
    runs: side threads with counters and call arguments, failed and gone samples, ranks
    without a number, GPU state, flight records, probe answers, odd strings and numbers."""
    built = []
    for r in range(ranks):
        rank = make_rank(
            None if r == 7 else r,
            ALL_REDUCE if r % 5 else [*TRUNK, "train.py:evaluate:48"],
            host=f"node{r // 8}",
            pid=1000 + r,
            threads=SIDE if r % 3 else None,
            active=r == 40,
            cpu_per_sample=0.25 if r == 40 else 0.0,
            thread_cpu={"MainThread": 0.1, "pin_memory": 0.0} if r % 4 == 0 else None,
            arguments=[(4, {"async_op": "False", "group": "None"})] if r % 2 else (),
            error=CaptureErrorKind.PTRACE_DENIED if r == 13 else None,
            gone_after=1 if r == 21 else None,
            world_size=ranks if r % 9 else None,
            local_rank=r % 8,
            rank_source=RankSource.INFERRED if r == 30 else RankSource.ENV,
            env={"RANK": str(r), "MASTER_PORT": "29500", "ODD": "bad \udcff bytes"},
            launcher_pid=900 + r // 8 if r % 6 else None,
        )
        extra: dict[str, Any] = {}
        if r % 10 == 0:
            extra["gpus"] = (
                GpuState(
                    index=r % 8,
                    uuid=f"GPU-{r}",
                    utilization_percent=r % 101,
                    memory_used_bytes=2**34,
                    xids=(79,) if r == 20 else (),
                ),
            )
        if r % 16 == 0:
            entries = (
                FlightEntry("0", 5, "all_reduce", ((4,),), ("Float",), state="scheduled"),
                FlightEntry("0", 6, "send", p2p=True, peer=1),
            )
            extra["flight"] = FlightRecord(
                entries, (FlightGroup("0", "default_pg", (0, 1)),), source=f"file trace_{r}", from_start=True
            )
        if r % 25 == 0:
            extra["exceptions"] = (ThreadException(7, None, "RuntimeError", Frame("step", "/job/train.py", 30)),)
            extra["heartbeat"] = Heartbeat(1000 + r, None if r == 0 else r, 3, True, 1.5)
        built.append(dataclasses.replace(rank, **extra))
    odd = built[3]
    sample = odd.samples[0]
    threads = (
        dataclasses.replace(sample.threads[0], thread_id=2**64 - 1, name=None, native_id=None),
        *sample.threads[1:],
    )
    state = dataclasses.replace(sample.state, cpu_seconds=-0.0)
    built[3] = dataclasses.replace(
        odd, samples=(dataclasses.replace(sample, threads=threads, state=state), *odd.samples[1:])
    )
    return make_snapshot(
        built,
        world_size=ranks + 2,
        notes=[Note("note \ud800"), Note("widened \ud800", NoteKind.WIDENED, pids=(2**22,))],
        stacks_may_be_cut=False,
    )


def test_every_kind_of_field_round_trips(tmp_path: Path) -> None:
    snap = varied_snapshot()
    assert _through_json(snap) == snap
    save_snapshot(snap, tmp_path / "v.json.gz")
    back = load_snapshot(tmp_path / "v.json.gz")
    assert back == snap
    state = back.ranks[3].samples[0].state
    assert state is not None and math.copysign(1.0, state.cpu_seconds) == -1.0  # -0.0 stays -0.0
    assert back.ranks[3].samples[0].threads[0].thread_id == 2**64 - 1


def test_nan_and_infinity_in_columns_are_read_into_floats() -> None:
    snap = varied_snapshot(24)
    rank = snap.ranks[0]
    samples = tuple(
        dataclasses.replace(s, t=math.inf if i else s.t, state=dataclasses.replace(s.state, cpu_seconds=math.nan))
        for i, s in enumerate(rank.samples)
    )
    snap = dataclasses.replace(snap, ranks=(dataclasses.replace(rank, samples=samples), *snap.ranks[1:]))
    back = _through_json(snap)
    assert back.ranks[0].samples[1].t == math.inf
    assert math.isnan(back.ranks[0].samples[0].state.cpu_seconds)


def test_loaded_objects_are_shared() -> None:
    snap = synthetic_snapshot(200, "straggler")
    back = _through_json(snap)
    threads = _threads(back)
    # one stack object per distinct stack: the analysis compares stacks by identity
    assert len({id(th.frames) for th in threads}) == len({th.frames for th in threads})
    assert len({id(f) for th in threads for f in th.frames}) == len({f for th in threads for f in th.frames})
    # a waiting rank's samples share their threads, and ranks share environment pairs
    waiting = back.ranks[0]
    assert waiting.samples[0].threads is waiting.samples[2].threads
    assert back.ranks[0].process.env[0] is back.ranks[1].process.env[0]
    assert back.ranks[0].process.host is back.ranks[1].process.host
    assert back.ranks[0].process.cmdline is back.ranks[1].process.cmdline
    assert len({id(th) for th in threads}) < len(threads) / 2


def test_a_table_of_records_stores_each_distinct_record_once() -> None:
    snap = synthetic_snapshot(200, "straggler")
    data = snapshot_to_dict(snap)
    tables = data["tables"]
    distinct = {(th.thread_id, th.name, th.frames, th.native_id, th.active, th.owns_gil) for th in _threads(snap)}
    assert tables["ThreadStack"]["n"] == len(distinct)
    # stacks and flags once per combination; ids counting up as runs, in every row
    shared, columns = tables["ThreadStack"]["shared"]["columns"], tables["ThreadStack"]["columns"]
    assert {"active", "owns_gil"} <= set(shared)
    assert set(shared) | set(columns) == {"thread_id", "name", "frames", "native_id", "active", "owns_gil"}
    assert "runs" in columns["thread_id"]
    assert "locals" not in tables["ThreadStack"]["columns"]  # all default: left out
    assert tables["(str,str)[]"]["width"] == len(snap.ranks[0].process.env)  # environments
    assert data["snapshot"]["ranks"][5] == {"process": 5, "samples": 5}


# Measured on a 1000-rank synthetic straggler (3 samples, 4-12 threads a rank, 19
# environment variables): version 2 is 168 bytes a rank, 24.5 gzipped (level 6);
# version 1 was 3436 and 136. The bounds leave some room for the model to grow.
def test_bytes_per_rank() -> None:
    snap = synthetic_snapshot(1000, "straggler")
    raw, packed = snapshot_bytes(snap, compress=False), snapshot_bytes(snap, compress=True)
    assert len(raw) / 1000 < 200
    assert len(packed) / 1000 < 30
    v1 = json.dumps(snapshot_to_dict(snap, schema_version=1), separators=(",", ":")).encode()
    assert len(v1) > 15 * len(raw)


def test_only_versions_1_and_2_are_written() -> None:
    with pytest.raises(ValueError, match="1 or 2"):
        snapshot_to_dict(make_snapshot({0: ALL_REDUCE}), schema_version=3)


# -------------------------------------------------------------- version 1 files


def _verdict_of(name: str) -> Verdict:
    kind = name.split("_")[0]
    return {
        "mismatch": Verdict.COLLECTIVE_MISMATCH,
        "straggler": Verdict.STRAGGLER,
        "cleanup": Verdict.CLEANUP_DEADLOCK,
    }[kind]


def test_the_old_format_fixtures_are_version_1() -> None:
    assert len(V1_FIXTURES) >= 3
    for path in V1_FIXTURES:
        assert json.loads(gzip.decompress(path.read_bytes()))["schema_version"] == 1, path.name


@pytest.mark.parametrize("path", V1_FIXTURES, ids=lambda p: p.name)
def test_version_1_files_still_load(tmp_path: Path, path: Path) -> None:
    old = load_snapshot(path)
    assert analyse(old).verdict is _verdict_of(path.name)
    assert old == _through_json(old, version=1) == _through_json(old, version=2)
    save_snapshot(old, tmp_path / "new.json.gz")
    assert load_snapshot(tmp_path / "new.json.gz") == old


# ------------------------------------------------------------------ bad tables


def _good(snapshot: JobSnapshot | None = None) -> dict[str, Any]:
    """A version 2 bundle's JSON object (``rich_snapshot()``'s unless given another)."""
    return json.loads(json.dumps(snapshot_to_dict(snapshot or rich_snapshot())))


def _error(tmp_path: Path, data: dict[str, Any]) -> str:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BundleError) as info:
        load_snapshot(path)
    message = str(info.value)
    assert "\n" not in message and len(message) < 1000 and str(path) in message
    return message


def _at(data: Any, path: str) -> tuple[Any, Any]:
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    return node, int(last) if isinstance(node, list) else last


def _set(path: str, value: object):
    def mutate(data: dict[str, Any]) -> None:
        node, key = _at(data, path)
        if value is KeyError:
            del node[key]
        else:
            node[key] = copy.deepcopy(value)

    return mutate


T = "tables"
BAD_TABLES = [
    (
        _set(f"{T}.ThreadStack.columns.frames.6", 99),
        "at tables.ThreadStack.columns.frames[6]: stack index 99 out of range (table has 4)",
    ),
    (
        _set(f"{T}.ThreadStack.columns.name.1", 999),
        "at tables.ThreadStack.columns.name[1]: string index 999 out of range (table has 24)",
    ),
    (_set(f"{T}.ThreadStack.columns.name.1", -1), "name[1]: string index -1 out of range"),
    (
        _set(f"{T}.Sample.columns.threads.0", "0"),
        "at tables.Sample.columns.threads[0]: ThreadStack[] reference must be an integer, got a string",
    ),
    (_set(f"{T}.Sample.columns.state.3", 6), "at tables.Sample.columns.state[3]: ProcessState index 6 out"),
    (
        _set("snapshot.ranks.0.process", 6),
        "at snapshot.ranks[0].process: RankProcess index 6 out of range (table has 6)",
    ),
    (_set("snapshot.ranks.0.samples", True), "at snapshot.ranks[0].samples: Sample[] reference must be"),
    (
        _set(f"{T}.RankProcess.columns.pid", [1000, 1001, 1002, 1003, 2**22 + 1, 4242]),
        "at tables.RankProcess.columns.pid[4]: 4194305 is out of range (0 to 4194304)",
    ),
    (
        _set(f"{T}.RankProcess.columns.pid", {"runs": [1000, 1, 4, 3238, 0]}),
        "at tables.RankProcess.columns.pid.runs[4]: 0 is out of range (1 to",
    ),
    (
        _set(f"{T}.RankProcess.columns.pid", {"runs": [1000, 1, 4, 3238, 2]}),
        "at tables.RankProcess.columns.pid.runs: runs give 7 values for 6 rows",
    ),
    (
        _set(f"{T}.RankProcess.columns.pid", {"runs": [1000, 10**30, 5]}),
        "at tables.RankProcess.columns.pid.runs[1]: 1000000000000000000000000000000 is out of range",
    ),
    (
        _set(f"{T}.RankProcess.columns.pid", {"runs": [1000, 1, 5], "x": 1}),
        "at tables.RankProcess.columns.pid: expected a list, or an object with only the key 'runs'",
    ),
    (_set(f"{T}.RankProcess.columns.pid", {"runs": [1000, 1]}), "pid.runs: 2 numbers, not a first value"),
    (_set(f"{T}.RankProcess.columns.pid", "1000"), "at tables.RankProcess.columns.pid: expected a list, got a string"),
    (_set(f"{T}.RankProcess.columns.rank.4", 2**20), "columns.rank[4]: 1048576 is out of range"),
    (_set(f"{T}.RankProcess.columns.world_size.4", 2_000_000_000), "world_size[4]: 2000000000 is out of range"),
    (
        _set(f"{T}.RankProcess.columns.rank_source.3", "guessed"),
        "at tables.RankProcess.columns.rank_source[3]: unknown RankSource 'guessed'",
    ),
    (_set(f"{T}.RankProcess.columns.rank_source.3", ["env"]), "rank_source[3]: unknown RankSource ['env']"),
    (
        _set(f"{T}.CaptureError.columns.kind.0", "bogus"),
        "at tables.CaptureError.columns.kind[0]: unknown CaptureErrorKind 'bogus'",
    ),
    (
        _set(f"{T}.ThreadStack.columns.thread_id.0", 2**64),
        "at tables.ThreadStack.columns.thread_id[0]: integer 18446744073709551616 does not fit in 64 bits",
    ),
    (
        _set(f"{T}.ThreadStack.columns.thread_id.0", True),
        "at tables.ThreadStack.columns.thread_id[0]: expected int, got a boolean",
    ),
    (_set(f"{T}.ThreadStack.columns.thread_id.0", None), "thread_id[0]: expected int, got null"),
    (_set(f"{T}.ThreadStack.columns.active.2", "yes"), "columns.active[2]: expected bool, got a string"),
    (_set(f"{T}.Sample.columns.t.4", 10**400), "at tables.Sample.columns.t[4]: the number 1000"),
    (_set(f"{T}.Sample.columns.t.4", "soon"), "at tables.Sample.columns.t[4]: expected float, got a string"),
    (_set(f"{T}.Sample.columns.t.17", KeyError), "at tables.Sample.columns.t: 17 values for 18 rows"),
    (
        _set(f"{T}.ThreadStack.columns.thread_id", KeyError),
        "at tables.ThreadStack: missing column 'thread_id' (ThreadStack)",
    ),
    (_set(f"{T}.(str,str).columns.0", KeyError), "at tables.(str,str): missing column '0' ((str,str))"),
    (_set(f"{T}.Sample.n", "18"), "at tables.Sample.n: expected the number of rows, got a string"),
    (_set(f"{T}.Sample.n", 2**30), "at tables.Sample.n: 1073741824 rows: out of range (0 to 33554432)"),
    (_set(f"{T}.Sample", []), "at tables.Sample: expected an object (a table), got a list"),
    (_set(f"{T}.Sample.columns", [1]), "at tables.Sample.columns: expected an object, got a list"),
    (_set(T, None), "at tables: expected an object, got null"),
    (_set("strings.3", 5), "at strings[3]: expected a string, got the number 5"),
    (_set("strings", KeyError), "at strings: expected a list, got null"),
    (_set(f"{T}.(str,str)[].lengths.3", -1), "at tables.(str,str)[].lengths[3]: -1 is out of range"),
    (_set(f"{T}.(str,str)[].lengths.3", 1), "at tables.(str,str)[].items.runs: runs give 6 values for 7 rows"),
    (_set(f"{T}.(str,str)[].width", 1), "at tables.(str,str)[]: a table of tuples has 'lengths' or 'width'"),
    (
        _set(f"{T}.ThreadStack[].lengths.0", 10**6),
        "at tables.ThreadStack[].items.runs: runs give 7 values for 1,000,005 rows",
    ),
    (
        _set(f"{T}.ThreadStack[].lengths.0", 10**8),
        "at tables.ThreadStack[].lengths[0]: 100000000 is out of range (0 to 67108864)",
    ),
]


@pytest.mark.parametrize(("mutate", "expected"), BAD_TABLES)
def test_malformed_tables(tmp_path: Path, mutate, expected: str) -> None:
    data = _good()
    mutate(data)
    message = _error(tmp_path, data)
    assert expected in message, message


def _big() -> dict[str, Any]:
    return _good(synthetic_snapshot(200, "straggler"))


def test_shared_columns_are_checked(tmp_path: Path) -> None:
    data = _big()
    table = data["tables"]["ThreadStack"]
    m = table["shared"]["n"]
    table["shared_row"] = [m] * table["n"]
    assert f"at tables.ThreadStack.shared_row[0]: shared row index {m} out of range (table has {m})" in _error(
        tmp_path, data
    )
    data = _big()
    table = data["tables"]["ThreadStack"]
    table["shared"]["columns"]["active"] = [False, False, "x"] + [False] * (m - 3)
    assert "at tables.ThreadStack.shared.columns.active[2]: expected bool, got a string" in _error(tmp_path, data)
    data = _big()
    table = data["tables"]["ThreadStack"]
    table["columns"]["active"] = [False] * table["n"]
    assert "at tables.ThreadStack: column 'active' is both in columns and in shared" in _error(tmp_path, data)


def test_many_ranks_say_which_rank_is_wrong(tmp_path: Path) -> None:
    """Ranks are read a field at a time; a bad one is still named by its place."""
    data = _big()
    data["snapshot"]["ranks"][150]["process"] = 10**6
    assert "at snapshot.ranks[150].process: RankProcess index 1000000 out of range" in _error(tmp_path, data)
    data = _big()
    data["snapshot"]["ranks"][150]["gpus"] = [{"index": 0, "uuid": "GPU-0", "utilization_percent": 101}]
    assert "at snapshot.ranks[150].gpus[0].utilization_percent: 101 is out of range (0 to 100)" in _error(
        tmp_path, data
    )
    data = _big()
    data["snapshot"]["ranks"][150]["gpus"] = [{"index": 0, "uuid": "GPU-0"}]  # good, but other keys
    assert load_snapshot_of(tmp_path, data).ranks[150].gpus[0].uuid == "GPU-0"


def load_snapshot_of(tmp_path: Path, data: dict[str, Any]) -> JobSnapshot:
    path = tmp_path / "good.json"
    path.write_text(json.dumps(data))
    return load_snapshot(path)


def test_unknown_tables_columns_and_keys_are_ignored(tmp_path: Path) -> None:
    data = _good()
    data["tables"]["Bogus"] = {"n": 3}
    data["tables"]["ThreadStack"]["columns"]["colour"] = ["red"]
    data["tables"]["ThreadStack"]["note"] = "x"
    data["later"] = {}
    assert load_snapshot_of(tmp_path, data) == rich_snapshot()


def test_a_missing_table_is_empty(tmp_path: Path) -> None:
    data = _good()
    del data["tables"]["CaptureError"]
    assert "at tables.Sample.columns.error[13]: CaptureError index 0 out of range (table has 0)" in _error(
        tmp_path, data
    )


def test_bounds_are_inclusive(tmp_path: Path) -> None:
    data = _good()
    columns = data["tables"]["RankProcess"]["columns"]
    columns["pid"] = [2**22, 1, 2, 3, 4, 5]
    columns["rank"][0] = 2**20 - 1
    data["tables"]["ThreadStack"]["columns"]["thread_id"][0] = 2**64 - 1
    snap = load_snapshot_of(tmp_path, data)
    assert snap.ranks[0].process.pid == 2**22 and snap.ranks[0].process.rank == 2**20 - 1


# ----------------------------------------------------- caps on what sharing multiplies


def test_records_are_counted_each_time_they_are_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A few numbers can make every sample hold one thread a thousand times: the records
    the snapshot reaches are counted with their repeats, and capped."""
    data = _good()
    seq = data["tables"]["ThreadStack[]"]
    seq["lengths"], seq["items"] = [1000] + [1] * 6, {"runs": [0, 0, 999, 1, 1, 1, 5]}
    assert load_snapshot_of(tmp_path, data).ranks[0].samples[0].threads[999].thread_id == 1000
    monkeypatch.setattr(bundle.tables, "MAX_RECORDS", 2000)
    assert "the snapshot holds more than 2,000 records (threads, samples, ...) counted each time" in _error(
        tmp_path, data
    )


def test_frames_are_counted_each_time_a_stack_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _good()
    monkeypatch.setattr(bundle.tables, "MAX_THREAD_FRAMES", 50)
    assert "the threads of all samples hold more than 50 frames in all" in _error(tmp_path, data)
    monkeypatch.setattr(bundle.tables, "MAX_THREAD_FRAMES", 10**6)
    data["stacks"][0] = [0] * (bundle.MAX_STACK_DEPTH + 1)
    assert "at stacks[0]: a stack of 100,001 frames" in _error(tmp_path, data)


def test_rows_and_items_are_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Columns left out, or runs, make rows from nothing: the tables' rows are capped."""
    data = _good()
    data["tables"]["CaptureError"] = {
        "n": 490,
        "columns": {"kind": ["timeout"] * 490, "message": {"runs": [0, 0, 489]}},
    }
    monkeypatch.setattr(bundle.tables, "MAX_TABLE_ROWS", 500)
    assert "at tables.CaptureError: the tables hold more than 500 rows in all" in _error(tmp_path, data)
    monkeypatch.setattr(bundle.tables, "MAX_TABLE_ROWS", 2**24)
    monkeypatch.setattr(bundle.tables, "MAX_TABLE_ITEMS", 10)
    assert "the tables hold more than 10 items of tuples in all" in _error(tmp_path, _good())
