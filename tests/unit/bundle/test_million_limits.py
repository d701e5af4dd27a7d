"""The caps a million-rank bundle must pass (``hangdoc.bundle.limits``), each on both sides:
lowered to what a small bundle uses, it loads; one below, the bundle gets a one-line error.
The world-size range is checked at its real bound (2**20)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from support.paths import REPO

from hangdoc import bundle
from hangdoc.bundle import load_snapshot, snapshot_to_dict
from hangdoc.bundle.tables import _Tables
from hangdoc.errors import BundleError

sys.path.insert(0, str(REPO / "bench"))
from synthetic import synthetic_snapshot

_SNAPSHOT = synthetic_snapshot(64, "collective_mismatch")


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(data))
    return path


def _used(path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """What loading ``path`` counts against each cap, at the end."""
    seen: dict[str, int] = {}
    use, store = _Tables.use, _Tables.store

    def counting_use(self: _Tables, records: int, frames: int) -> None:
        use(self, records, frames)
        seen.update(records=self.records, frames=self.thread_frames)

    def counting_store(self: _Tables, rows: int, items: bool = False) -> None:
        store(self, rows, items)
        seen.update(rows=self.stored[0], items=self.stored[1])

    with monkeypatch.context() as m:
        m.setattr(_Tables, "use", counting_use)
        m.setattr(_Tables, "store", counting_store)
        load_snapshot(path)
    return seen


CAPS = [
    ("frames", "MAX_THREAD_FRAMES", "the threads of all samples hold more than {cap:,} frames in all"),
    ("records", "MAX_RECORDS", "the snapshot holds more than {cap:,} records (threads, samples, ...)"),
    ("rows", "MAX_TABLE_ROWS", "the tables hold more than {cap:,} rows in all"),
    ("items", "MAX_TABLE_ITEMS", "the tables hold more than {cap:,} items of tuples in all"),
]


@pytest.mark.parametrize(("what", "name", "message"), CAPS, ids=[c[1] for c in CAPS])
def test_a_bundle_at_a_cap_loads_and_one_past_it_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str, name: str, message: str
) -> None:
    path = _write(tmp_path, snapshot_to_dict(_SNAPSHOT, schema_version=2))
    used = _used(path, monkeypatch)[what]
    assert used > 0
    monkeypatch.setattr(bundle.tables, name, used)
    assert load_snapshot(path) == _SNAPSHOT
    monkeypatch.setattr(bundle.tables, name, used - 1)
    with pytest.raises(BundleError) as err:
        load_snapshot(path)
    assert message.format(cap=used - 1) in str(err.value) and "\n" not in str(err.value)


def test_first_format_frames_are_capped_at_the_same_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A version 1 bundle (read a rank at a time) counts the same frames as version 2."""
    v1 = _write(tmp_path, snapshot_to_dict(_SNAPSHOT, schema_version=1))
    used = _used(v1, monkeypatch)["frames"]
    assert used == sum(len(th.frames) for r in _SNAPSHOT.ranks for s in r.samples for th in s.threads)
    monkeypatch.setattr(bundle.tables, "MAX_THREAD_FRAMES", used)
    assert load_snapshot(v1) == _SNAPSHOT
    monkeypatch.setattr(bundle.tables, "MAX_THREAD_FRAMES", used - 1)
    with pytest.raises(BundleError, match=f"more than {used - 1:,} frames in all"):
        load_snapshot(v1)


def test_the_caps_hold_a_million_ranks() -> None:
    """The synthetic 1M-rank bundle (bench/synthetic.py) uses 232 million frames, 31 million
    records, 17.1 million rows and 30 million items (ten times the 100k one's, measured)."""
    assert bundle.MAX_WORLD_SIZE == 2**20 >= 1_000_000
    assert bundle.MAX_THREAD_FRAMES >= 4 * 232_000_000
    assert bundle.MAX_RECORDS >= 2 * 31_000_000
    assert bundle.MAX_TABLE_ROWS >= 1.9 * 17_100_000
    assert bundle.MAX_TABLE_ITEMS >= 2 * 30_000_000


@pytest.mark.parametrize("version", [1, 2])
def test_the_largest_world_size_and_rank_load(tmp_path: Path, version: int) -> None:
    data = snapshot_to_dict(_SNAPSHOT, schema_version=version)
    data["snapshot"]["world_size"] = 2**20
    snap = load_snapshot(_write(tmp_path, data))
    assert snap.world_size == 2**20
    data["snapshot"]["world_size"] = 2**20 + 1
    with pytest.raises(BundleError, match=r"world_size: 1048577 is out of range \(0 to 1048576\)$"):
        load_snapshot(_write(tmp_path, data))


def test_a_dict_passed_in_is_read_not_taken_apart(tmp_path: Path) -> None:
    """``snapshot_from_dict`` leaves its argument whole; a file's own parsed text is taken
    apart table by table as it is read (its columns go once their rows are made)."""
    data = snapshot_to_dict(_SNAPSHOT, schema_version=2)
    before = json.dumps(data)
    assert bundle.snapshot_from_dict(data) == _SNAPSHOT
    assert json.dumps(data) == before
    assert load_snapshot(_write(tmp_path, data)) == _SNAPSHOT
