"""First-format bundles read a rank at a time (``bundle.first``): the same snapshot, the
same report and the same sharing as the second format's, in memory that does not grow with
the text, and every file it does not take read whole, with the whole-text reader's errors."""

from __future__ import annotations

import copy
import gc
import json
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.json_places import containers as places
from support.paths import REPO, TESTS

from hangdoc.bundle import first, reader, snapshot_from_bytes, snapshot_to_dict
from hangdoc.cli import main
from hangdoc.errors import BundleError
from hangdoc.model import JobSnapshot

sys.path.insert(0, str(REPO / "bench"))
from synthetic import synthetic_snapshot  # noqa: E402

PATH = Path("bundle.json")
TIME_FIELDS = ("observed_seconds", "captured_at")


def first_bytes(snapshot: JobSnapshot) -> bytes:
    return json.dumps(snapshot_to_dict(snapshot, 1)).encode()


def streamed(raw: bytes) -> JobSnapshot | None:
    """What the rank-at-a-time reader makes of ``raw`` (None: it leaves the file to the whole-text reader)."""
    return first.read_first_format(raw, reader._load_tables)


def whole_text(raw: bytes, monkeypatch: pytest.MonkeyPatch) -> JobSnapshot | str:
    """What the whole-text reader makes of ``raw``: the snapshot, or its error."""
    with monkeypatch.context() as m:
        m.setattr(reader, "read_first_format", lambda raw, load: None)
        return loaded(raw)


def loaded(raw: bytes) -> JobSnapshot | str:
    try:
        return snapshot_from_bytes(raw, PATH)
    except BundleError as err:
        return str(err)


def sharing(snapshot: JobSnapshot) -> dict[str, tuple[int, int]]:
    """How many of each kind of value the snapshot holds, and how many distinct objects."""
    samples = [s for r in snapshot.ranks for s in r.samples]
    kinds = {
        "samples": samples,
        "thread tuples": [s.threads for s in samples],
        "threads": [t for s in samples for t in s.threads],
        "stacks": [t.frames for s in samples for t in s.threads],
        "states": [s.state for s in samples if s.state is not None],
        "environments": [r.process.env for r in snapshot.ranks],
        "pairs": [p for r in snapshot.ranks for p in r.process.env],
        "command lines": [r.process.cmdline for r in snapshot.ranks],
        "processes": [r.process for r in snapshot.ranks],
    }
    return {kind: (len(values), len(set(map(id, values)))) for kind, values in kinds.items()}


def report(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["analyze", str(path), "--json"]) == 0
    said: dict[str, Any] = json.loads(capsys.readouterr().out)
    for key in TIME_FIELDS:
        said.pop(key)
    return said


@pytest.mark.parametrize("scenario", ["collective_mismatch", "straggler", "rank_missing"])
def test_the_report_from_a_first_format_bundle_is_the_second_formats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scenario: str
) -> None:
    snapshot = synthetic_snapshot(64, scenario)
    old, new = tmp_path / "v1.json", tmp_path / "v2.json"
    old.write_bytes(first_bytes(snapshot))
    new.write_text(json.dumps(snapshot_to_dict(snapshot)))
    assert streamed(old.read_bytes()) == snapshot  # read a rank at a time, not whole
    assert report(old, capsys) == report(new, capsys)


@pytest.mark.parametrize("scenario", ["collective_mismatch", "straggler"])
def test_equal_records_are_shared_as_the_second_format_shares_them(scenario: str) -> None:
    snapshot = synthetic_snapshot(48, scenario)
    v1 = streamed(first_bytes(snapshot))
    v2 = snapshot_from_bytes(json.dumps(snapshot_to_dict(snapshot)).encode(), PATH)
    assert v1 == v2 == snapshot
    assert v1 is not None
    assert sharing(v1) == sharing(v2)
    waiting = v1.ranks[0]
    assert len({id(s.threads) for s in waiting.samples}) == 1  # one tuple: the views' shape key
    assert v1.ranks[0].process.cmdline is v1.ranks[1].process.cmdline


@pytest.mark.parametrize("path", sorted((TESTS / "snapshots").rglob("*.json.gz")), ids=lambda p: p.name)
def test_recorded_first_format_snapshots_are_read_a_rank_at_a_time(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hangdoc.bundle import read_input

    raw = read_input(path)
    if json.loads(raw)["schema_version"] != 1:
        pytest.skip("not a first-format bundle")
    assert streamed(raw) == whole_text(raw, monkeypatch)


@pytest.mark.parametrize("chunk", [1, 2, 7, 100, 4096])
def test_any_chunk_size_reads_the_same(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    """Chunk ends cut numbers, strings, keys and characters of several bytes."""
    data = snapshot_to_dict(synthetic_snapshot(24, "straggler"), 1)
    data["snapshot"]["ranks"][3]["process"]["env"].append(["NOTE", 'é ✓ 𝄞 \\ " \u2028'])
    data["snapshot"]["ranks"][5]["samples"][0]["threads"][0]["name"] = "Thread-ü"
    raw = json.dumps(data, ensure_ascii=False, indent=1).encode()
    want = whole_text(raw, monkeypatch)
    monkeypatch.setattr(first, "_CHUNK", chunk)
    assert streamed(raw) == want


def test_memory_does_not_grow_with_the_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the read holds beyond the snapshot it makes: a chunk of text and one rank's
    values, not the text parsed into dicts (the whole-text reader's ten times the text)."""
    raw = first_bytes(synthetic_snapshot(1200, "collective_mismatch"))
    monkeypatch.setattr(first, "_CHUNK", 64 * 2**10)

    def transient(read: Any) -> int:
        gc.collect()
        tracemalloc.start()
        try:
            kept = read()
            now, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert isinstance(kept, JobSnapshot)
        return peak - now

    ours = transient(lambda: streamed(raw))
    whole = transient(lambda: reader.snapshot_from_dict(json.loads(raw)))
    # measured: 0.34 MB here against 10.5 MB, for 4.4 MB of text
    assert ours < len(raw) / 4
    assert whole > 2 * len(raw) > 8 * ours


def mutated(raw: bytes, change: str) -> bytes:
    data = json.loads(raw)
    ranks = data["snapshot"]["ranks"]
    thread = ranks[30]["samples"][1]["threads"][2]
    if change == "stack index out of range":
        thread["frames"] = len(data["stacks"])
    elif change == "bool for an int":
        thread["thread_id"] = True
    elif change == "float for an int":
        thread["native_id"] = 7.0
    elif change == "int for a bool":
        thread["active"] = 1
    elif change == "pid out of range":
        ranks[20]["process"]["pid"] = 2**40
    elif change == "missing key":
        del ranks[25]["process"]["host"]
    elif change == "env pair of three":
        ranks[29]["process"]["env"][4].append("x")
    elif change == "env pair of a number":
        ranks[29]["process"]["env"][4][1] = 3
    elif change == "string in cmdline list":
        ranks[17]["process"]["cmdline"] = "python train.py"
    elif change == "unknown enum":
        ranks[18]["process"]["rank_source"] = "guessed"
    elif change == "ranks not a list":
        data["snapshot"]["ranks"] = {"0": ranks[0]}
    elif change == "rank not an object":
        ranks[33] = [1, 2]
    else:
        data = mutated_more(data, change)
    return json.dumps(data).encode()


def mutated_more(data: dict[str, Any], change: str) -> dict[str, Any]:
    ranks = data["snapshot"]["ranks"]
    if change == "world size too large":
        data["snapshot"]["world_size"] = 10**12
    elif change == "schema_version a bool":
        data["schema_version"] = True
    elif change == "a second sample's threads differ only by type":
        ranks[31]["samples"][2]["threads"][0]["thread_id"] = float(ranks[31]["samples"][2]["threads"][0]["thread_id"])
    elif change == "a thread moved, another differs only by type":
        threads = ranks[31]["samples"][2]["threads"]
        threads[0]["name"] = "moved"
        threads[1]["native_id"] = float(threads[1]["native_id"])
    elif change == "a thread moved, the others read before":
        ranks[31]["samples"][2]["threads"][0]["name"] = "moved"
    elif change == "a state differs only by type":
        ranks[32]["samples"][1]["state"]["num_threads"] = float(ranks[32]["samples"][1]["state"]["num_threads"])
    elif change == "snapshot before the frames":
        data = {"snapshot": data.pop("snapshot"), **data}
    elif change == "kind last":
        data = {**{k: v for k, v in data.items() if k != "kind"}, "kind": data["kind"]}
    elif change == "extra keys":
        ranks[9]["process"]["extra"] = [1, {"a": None}]
        data["snapshot"]["something"] = 1
    return data


CHANGES = [
    "stack index out of range",
    "bool for an int",
    "float for an int",
    "int for a bool",
    "pid out of range",
    "missing key",
    "env pair of three",
    "env pair of a number",
    "string in cmdline list",
    "unknown enum",
    "ranks not a list",
    "rank not an object",
    "world size too large",
    "schema_version a bool",
    "a second sample's threads differ only by type",
    "a thread moved, another differs only by type",
    "a thread moved, the others read before",
    "a state differs only by type",
    "snapshot before the frames",
    "kind last",
    "extra keys",
]
RAW40 = first_bytes(synthetic_snapshot(40, "collective_mismatch"))


@pytest.mark.parametrize("change", CHANGES)
def test_a_changed_file_reads_as_the_whole_text_reader_reads_it(monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    raw = mutated(RAW40, change)
    want = whole_text(raw, monkeypatch)
    assert loaded(raw) == want  # the same snapshot, or the same error at the same place
    got = streamed(raw)
    assert got is None or got == want


@pytest.mark.parametrize(
    "raw",
    [
        RAW40[: len(RAW40) // 2],  # cut in a rank
        RAW40[:-1],
        RAW40 + b" x",  # data after the object
        RAW40.replace(b'"spec"', b'"spec": 1, "spec"', 1),  # a key twice: the last one counts
        b"\xef\xbb\xbf" + RAW40,  # a byte order mark
        RAW40.replace(b"MainThread", b"Main\xffThread", 1),  # not UTF-8
        b"  \n" + RAW40 + b"\n\n",  # blanks around
        json.dumps(json.loads(RAW40), indent=2).encode(),
        json.dumps(json.loads(RAW40), separators=(",", ":")).encode(),
    ],
)
def test_odd_text_reads_as_the_whole_text_reader_reads_it(monkeypatch: pytest.MonkeyPatch, raw: bytes) -> None:
    assert loaded(raw) == whole_text(raw, monkeypatch)


def test_the_frame_cap_holds_for_records_read_once_and_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads written alike in a rank's samples are decoded once, and their frames still
    counted each time, against ``MAX_THREAD_FRAMES``."""
    monkeypatch.setattr("hangdoc.bundle.tables.MAX_THREAD_FRAMES", 2_000)
    err = whole_text(RAW40, monkeypatch)
    assert isinstance(err, str) and "frames in all" in err
    assert streamed(RAW40) is None
    assert loaded(RAW40) == err


ODD: list[Any] = [None, True, False, 0, -1, 1.0, 2**64, 1e300, "", "x", [], {}, [[]], {"a": 1}]
FUZZ = settings(
    max_examples=80,
    deadline=10_000,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
BASE = json.loads(first_bytes(synthetic_snapshot(24, "straggler")))


@FUZZ
@given(data=st.data())
def test_whatever_it_takes_the_whole_text_reader_reads_the_same(data: st.DataObject) -> None:
    """Values replaced by odd ones, or keys removed, in the snapshot part: what the
    rank-at-a-time reader returns, the whole-text reader returns too."""
    value = copy.deepcopy(BASE)
    spots = places(value["snapshot"])
    for _ in range(data.draw(st.integers(1, 3))):
        node, key = data.draw(st.sampled_from(spots))
        if isinstance(node, dict) and data.draw(st.booleans()):
            node.pop(key, None)
        elif key in node if isinstance(node, dict) else key < len(node):
            node[key] = data.draw(st.sampled_from(ODD))
    raw = json.dumps(value).encode()
    got = streamed(raw)
    if got is not None:
        assert got == reader.snapshot_from_dict(json.loads(raw))
