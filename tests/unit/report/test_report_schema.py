"""The JSON Schema hangdoc ships (hangdoc/report/report.schema.json) holds on every report.

Checked against every recording of the corpus, through ``hangdoc.analyze`` (the path of
``hangdoc analyze --json``); its keys are those ``to_json_dict`` writes, both ways; its
enums are the model's. tests/conftest.py also checks every report the tests make.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from support import report_schema
from support.factories import make_rank, make_snapshot
from support.paths import REPO, TESTS

import hangdoc
from hangdoc import SCHEMA_VERSION
from hangdoc.analysis.analyse import analyse
from hangdoc.api import SCHEMA_PATH
from hangdoc.capture.read.ncclras import read_ras_report
from hangdoc.model import (
    Confidence,
    GpuState,
    JobSnapshot,
    LinkKind,
    OpKind,
    RankSource,
    RankState,
    Unreachable,
    Verdict,
)
from hangdoc.report.json_report import error_to_dict, to_json_dict, undiagnosed_to_json_dict
from hangdoc.watch.incident import trigger_dict
from hangdoc.watch.stall import Signal, Trigger

SCHEMA = report_schema.schema()
DEFS = SCHEMA["$defs"]
DUMPS = TESTS / "data" / "dumps"
# kept to show what analyze refuses (tests/data/dumps/condensed/README.md: "not read")
NOT_READ = {"sglang_27489_arrow_fingerprint.txt"}
# every recording of a real job the tests keep: saved snapshots, the dumps a user takes by
# hand (py-spy, ray stack, pasted stacks), torch flight recorder dumps
CORPUS = sorted(
    [
        *(TESTS / "snapshots").rglob("*.json.gz"),
        *(TESTS / "data").glob("*.json.gz"),
        *(TESTS / "data" / "bundles_v1").glob("*.json.gz"),
        *(p for p in DUMPS.rglob("*") if p.suffix in (".txt", ".json") and p.name not in NOT_READ),
        *(p for p in (TESTS / "data" / "flight").iterdir() if p.is_dir()),
    ]
)
AR = ["train.py:main:10", "train.py:step:40", "torch/distributed/distributed_c10d.py:all_reduce:2800"]
SLEEPING = ["train.py:main:10", "train.py:load:77", "time.py:sleep"]


def _enum(definition: str, key: str) -> list[Any]:
    return list(DEFS[definition]["properties"][key]["enum"])


def test_the_schema_is_draft_2020_12_and_ships_where_the_api_says() -> None:
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA_PATH == REPO / "hangdoc" / "report" / "report.schema.json"
    assert hangdoc.report_schema() == SCHEMA


def test_the_enums_are_the_models() -> None:
    assert _enum("report", "verdict") == [v.value for v in Verdict]
    assert _enum("report", "confidence") == [c.value for c in Confidence]
    assert _enum("rank", "state") == [s.value for s in RankState]
    assert _enum("rank", "rank_source") == [s.value for s in RankSource] + [None]
    assert _enum("op", "kind") == [k.value for k in OpKind]
    assert _enum("wait_link", "waits") == [k.value for k in LinkKind] + [None]
    assert _enum("watch", "signal") == [s.value for s in Signal]
    assert DEFS["report"]["properties"]["schema_version"] == {"const": SCHEMA_VERSION}
    assert DEFS["error"]["properties"]["schema_version"] == {"const": SCHEMA_VERSION}


def test_every_object_is_closed() -> None:
    # a key the schema does not name is drift: each object says so, except the one map
    _, maps = report_schema.schema_paths()
    assert maps == {"nccl_ras.communicators[].launched"}
    for name, definition in DEFS.items():
        if definition.get("type") == "object":
            assert definition["additionalProperties"] is False, name


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: str(p.relative_to(TESTS)))
def test_every_corpus_recording_gives_a_report_the_schema_holds(path: Path) -> None:
    report = hangdoc.analyze(path)
    # what a consumer reads: the text, parsed back
    report_schema.check_output(json.loads(report.to_json()), str(path.relative_to(TESTS)))


def _rich_snapshot() -> JobSnapshot:
    """GPUs on every rank, NCCL's RAS report with a rank's error, a node that did not
    answer: the keys only such a capture has."""
    snap = make_snapshot(
        [make_rank(r, AR) for r in range(3)] + [make_rank(3, SLEEPING)],
        world_size=6,
        unreachable=[Unreachable("node2:7420", "connection refused", (4, 5))],
    )
    ras = read_ras_report((TESTS / "data" / "gpu" / "ncclras_2.28.9_dead_rank.json").read_text(), source="node0")
    first = ras.communicators[0]
    failed = dataclasses.replace(first.ranks[0], async_error=3, abort_flag=True)
    first = dataclasses.replace(first, ranks=(failed, *first.ranks[1:]))
    ras = dataclasses.replace(ras, communicators=(first, *ras.communicators[1:]))
    ranks = tuple(
        dataclasses.replace(
            r, gpus=(GpuState(index=r.rank or 0, uuid=f"GPU-{r.rank}", name="H100", xids=(79,), ecc_uncorrected=0),)
        )
        for r in snap.ranks
    )
    return dataclasses.replace(snap, ranks=ranks, ras=ras)


def _watch() -> dict[str, Any]:
    trigger = Trigger(Signal.HEARTBEAT, 61.5, 60.0, "--stall-after", 5.0, 12, 11, "2026-01-01T00:00:00Z", ("rank 0",))
    return trigger_dict(trigger, "confirmed by diagnosis: straggler", 2.25)


def _reports() -> list[dict[str, Any]]:
    """A report of each shape: corpus recordings with and without a root cause, the rich
    capture, a watch's report and a failed diagnosis's."""
    reports = []
    for name in ("snapshots/beyond/straggler_cross_process_flock_cycle.json.gz", "data/demo_mismatch.json.gz"):
        reports.append(hangdoc.analyze(TESTS / name).to_dict())
    rich = _rich_snapshot()
    reports.append({**to_json_dict(analyse(rich), rich), "watch": _watch()})
    undiagnosed = undiagnosed_to_json_dict("pid:1", "no ranks", "", noticed="silent", captured_at="")
    reports.append({**undiagnosed, "watch": _watch()})
    return reports


def test_the_schema_names_every_key_of_the_report_and_no_other() -> None:
    named, maps = report_schema.schema_paths()
    made = {p for report in _reports() for p in report_schema.key_paths(report, frozenset(maps))}
    assert made - named == set(), "keys to_json_dict writes that the schema lacks"
    assert named - made == set(), "keys the schema names that no report has"


def test_every_shape_holds_the_schema() -> None:
    for report in _reports():
        report_schema.check_output(report)
    report_schema.check_output(error_to_dict("JobNotFound", "no rank process", "Check the spec.", 3))


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda r: r.update(verdict="hung"), "$.verdict"),
        (lambda r: r.update(extra=1), "$"),
        (lambda r: r.pop("scope"), "$"),
        (lambda r: r["ranks"][0].update(state="sleeping"), "$.ranks[0].state"),
        (lambda r: r["ranks"][0].update(op={**r["ranks"][0]["op"], "kind": "collectiv"}), "$.ranks[0].op.kind"),
        (lambda r: r["groups"][0]["stack"][0].update(line="12"), "$.groups[0].stack[0].line"),
        (lambda r: r.update(schema_version=SCHEMA_VERSION + 1), "$.schema_version"),
        (lambda r: r["scope"].update(seen=[[0]]), "$.scope.seen[0]"),
    ],
)
def test_drift_is_caught_where_it_is(change: Any, where: str) -> None:
    report = hangdoc.analyze(TESTS / "data" / "demo_mismatch.json.gz").to_dict()
    change(report)
    with pytest.raises(report_schema.SchemaBroken) as broken:
        report_schema.check_output(report)
    assert f" at {where}: " in str(broken.value)


def test_an_error_object_is_not_a_report() -> None:
    error = error_to_dict("UsageError", "bad", "", 2)
    report_schema.check_output(error)
    with pytest.raises(report_schema.SchemaBroken):
        report_schema.check_report(error)
    with pytest.raises(report_schema.SchemaBroken, match="exit_code"):
        report_schema.check_error({**error, "error": {**error["error"], "exit_code": "2"}})


def test_every_report_the_tests_make_is_checked() -> None:
    # tests/conftest.py wraps the makers for the session: a report that breaks the schema
    # fails the test that made it, and the session
    from hangdoc.report import json_report

    for name in ("_report", "undiagnosed_to_json_dict", "error_to_dict"):
        assert getattr(getattr(json_report, name), "__wrapped__", None) is not None, name
    assert json_report.to_json_dict.__globals__["_report"] is json_report._report
