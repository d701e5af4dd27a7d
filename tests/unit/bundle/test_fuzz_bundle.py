"""Property-based fuzzing of the snapshot reader: whatever a file holds, ``load_snapshot``
returns a ``JobSnapshot`` or raises ``BundleError``, nothing else; and whatever it returns,
the analysis and both reporters take without raising.

Inputs: random JSON values, mutations of the recorded snapshots in ``tests/snapshots``
(values replaced by odd ones, keys deleted, types changed, huge numbers, deep nesting) as
recorded (bundle version 1) and rewritten as version 2 (tables, with a synthetic
snapshot large enough for shared columns, runs and ranks read a field at a time), random
tables in a version 2 envelope, random bytes, and cut or corrupted gzip. Bounded in time:
a few hundred examples in all (about 15 s), no example database.
``HANGDOC_FUZZ_SCALE=20`` runs 20 times as many.
"""

from __future__ import annotations

import copy
import gzip
import json
import math
import os
import sys
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from support.json_places import containers as _containers
from support.paths import REPO, TESTS

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot, snapshot_to_dict
from hangdoc.bundle.layout import _table_name, _table_order
from hangdoc.errors import BundleError
from hangdoc.model import JobSnapshot
from hangdoc.report.json_report import render_json
from hangdoc.report.terminal import render

SNAPSHOTS = sorted((TESTS / "snapshots").glob("*.json.gz"))
RECORDED = {p.name: json.loads(gzip.decompress(p.read_bytes())) for p in SNAPSHOTS}
RAW = {p.name: p.read_bytes() for p in SNAPSHOTS}
sys.path.insert(0, str(REPO / "bench"))
from synthetic import synthetic_snapshot

# the same snapshots as version 2 bundles, and a synthetic one of 40 ranks
TABLES = {
    name: json.loads(json.dumps(snapshot_to_dict(load_snapshot(p))))
    for name, p in zip(RECORDED, SNAPSHOTS, strict=False)
}
TABLES["synthetic_straggler_40"] = json.loads(json.dumps(snapshot_to_dict(synthetic_snapshot(40, "straggler"))))
TABLE_NAMES = [_table_name(key) for key in _table_order()]

SCALE = int(os.environ.get("HANGDOC_FUZZ_SCALE", "1"))
FUZZ = settings(
    max_examples=120 * SCALE,
    deadline=10_000,  # ms per example: generous on a busy machine, but a hang still fails
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)

# values a mutation puts in place of another
ODD: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    2**63,
    2**64,
    -(2**63) - 1,
    10**30,
    2**22 + 1,
    2**20,
    2**20 + 1,
    2_000_000_000,
    1.5,
    -0.0,
    1e300,
    -1e300,
    math.nan,
    math.inf,
    -math.inf,
    "",
    "x" * 5000,
    "\x1b[2J\x1b]0;pwned\x07",
    "\u202e\r\x9b",
    "\ud800",
    "[bold red]x[/]",
    "²",
    "٣",
    "0",
    "-1",
    "nan",
    [],
    {},
    [[[[[[[[[[[]]]]]]]]]]],
    {"a": {"b": {"c": {}}}},
    [0] * 50,
    ["a", 1, None],
]
json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30) | st.sampled_from(ODD)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=30,
)


def _check(path: Path) -> None:
    """The property: load, and if it loads, analyse and report without raising."""
    try:
        snapshot = load_snapshot(path)
    except BundleError as err:
        message = str(err)
        assert "\n" not in message and len(message) < 5000
        return
    assert isinstance(snapshot, JobSnapshot)
    diagnosis = analyse(snapshot)
    text = render_json(diagnosis, snapshot)
    json.loads(text, parse_constant=_reject)  # strict JSON: no NaN or Infinity
    buffer = StringIO()
    render(diagnosis, snapshot, Console(file=buffer, width=100, color_system=None))
    out = buffer.getvalue()
    assert not any(ord(c) < 0x20 and c != "\n" or 0x7F <= ord(c) < 0xA0 or c == "\u202e" for c in out), (
        "a control character reached the terminal"
    )


def _reject(name: str) -> None:
    raise AssertionError(f"{name} in the JSON report")


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "fuzz.json"
    path.write_bytes(data)
    return path


def _dump(value: Any) -> bytes:
    return json.dumps(value).encode("utf-8", "backslashreplace")


@FUZZ
@given(value=json_values)
def test_random_json_values(tmp_path_factory: pytest.TempPathFactory, value: Any) -> None:
    _check(_write(tmp_path_factory.mktemp("fuzz"), _dump(value)))


@FUZZ
@given(body=json_values, frames=json_values, stacks=json_values)
def test_random_values_inside_a_valid_envelope(
    tmp_path_factory: pytest.TempPathFactory, body: Any, frames: Any, stacks: Any
) -> None:
    data = {"kind": "hangdoc-snapshot", "schema_version": 1, "frames": frames, "stacks": stacks, "snapshot": body}
    _check(_write(tmp_path_factory.mktemp("fuzz"), _dump(data)))


@FUZZ
@given(
    strings=json_values, tables=st.dictionaries(st.sampled_from(TABLE_NAMES), json_values, max_size=4), body=json_values
)
def test_random_tables_inside_a_valid_v2_envelope(
    tmp_path_factory: pytest.TempPathFactory, strings: Any, tables: Any, body: Any
) -> None:
    data = {
        "kind": "hangdoc-snapshot",
        "schema_version": 2,
        "strings": strings,
        "frames": [],
        "stacks": [],
        "tables": tables,
        "snapshot": body,
    }
    _check(_write(tmp_path_factory.mktemp("fuzz"), _dump(data)))


@settings(FUZZ, max_examples=300 * SCALE)
@given(name=st.sampled_from(sorted(RECORDED)), data=st.data())
def test_mutated_recorded_snapshots(tmp_path_factory: pytest.TempPathFactory, name: str, data: st.DataObject) -> None:
    _mutate_and_check(tmp_path_factory, RECORDED[name], data)


@settings(FUZZ, max_examples=300 * SCALE)
@given(name=st.sampled_from(sorted(TABLES)), data=st.data())
def test_mutated_v2_snapshots(tmp_path_factory: pytest.TempPathFactory, name: str, data: st.DataObject) -> None:
    _mutate_and_check(tmp_path_factory, TABLES[name], data)


def _mutate_and_check(tmp_path_factory: pytest.TempPathFactory, recorded: dict[str, Any], data: st.DataObject) -> None:
    snapshot = copy.deepcopy(recorded)
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        places = _containers(snapshot)
        node, key = data.draw(st.sampled_from(places), label="where")
        action = data.draw(st.sampled_from(["replace", "delete", "random", "wrap", "duplicate"]), label="action")
        if action == "delete":
            del node[key]
        elif action == "replace":
            node[key] = copy.deepcopy(data.draw(st.sampled_from(ODD), label="value"))
        elif action == "random":  # a copy: ODD's lists must not change under later mutations
            node[key] = copy.deepcopy(data.draw(json_values, label="value"))
        elif action == "wrap":  # change its type: x -> [x] or {"x": x}
            node[key] = data.draw(st.sampled_from([[node[key]], {"x": node[key]}]), label="wrapped")
        elif isinstance(node, list):
            node.extend(copy.deepcopy(node[key]) for _ in range(3))
    _check(_write(tmp_path_factory.mktemp("fuzz"), _dump(snapshot)))


@FUZZ
@given(data=st.binary(max_size=2000))
def test_random_bytes(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    _check(_write(tmp_path_factory.mktemp("fuzz"), data))
    _check(_write(tmp_path_factory.mktemp("fuzz"), b"\x1f\x8b" + data))  # "gzip" by its magic


@FUZZ
@given(name=st.sampled_from(sorted(RAW)), data=st.data())
def test_cut_and_corrupted_gzip(tmp_path_factory: pytest.TempPathFactory, name: str, data: st.DataObject) -> None:
    raw = bytearray(RAW[name])
    cut = data.draw(st.integers(0, len(raw)), label="cut")
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255)), max_size=4), label="flips")
    for at, byte in flips:
        raw[at] = byte
    tail = data.draw(st.sampled_from([b"", b"\0\0\0", b"garbage", bytes(RAW[name])]), label="tail")
    _check(_write(tmp_path_factory.mktemp("fuzz"), bytes(raw[:cut]) + tail))


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_snapshots_pass_the_property(tmp_path: Path, name: str) -> None:
    _check(_write(tmp_path, RAW[name]))


def _with_env(name: str, key: str, value: str) -> dict[str, Any]:
    snapshot = copy.deepcopy(RECORDED[name])
    for rank in snapshot["snapshot"]["ranks"]:
        env = [pair for pair in rank["process"].get("env", []) if pair[0] != key]
        rank["process"]["env"] = sorted([*env, [key, value]])
    return snapshot


# Found by fuzzing: a snapshot loaded, then the analysis raised, because it read
# LOCAL_WORLD_SIZE & co. with str.isdigit() + int() (which fail on "²" and on 4300+ digits)
# and divided by a LOCAL_WORLD_SIZE of 0.
@pytest.mark.parametrize("value", ["0", "²", "1" * 5000])
def test_odd_local_world_size_is_analysed(tmp_path: Path, value: str) -> None:
    snapshot = _with_env("rank_missing_never_started.json.gz", "LOCAL_WORLD_SIZE", value)
    _check(_write(tmp_path, _dump(snapshot)))
