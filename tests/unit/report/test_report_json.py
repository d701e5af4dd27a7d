"""The --json report: required keys, their types, and values scripts rely on."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
from support.factories import make_diagnosis, make_frame, make_op, make_rank, make_snapshot
from support.paths import REPO

from hangdoc import SCHEMA_VERSION, __version__
from hangdoc.model import (
    Confidence,
    Diagnosis,
    Evidence,
    JobSnapshot,
    Note,
    NoteKind,
    OpKind,
    RankAnalysis,
    RankSource,
    RankState,
    Unreachable,
    Verdict,
)
from hangdoc.report.json_report import (
    dumps,
    error_to_dict,
    render_json,
    to_json_dict,
    undiagnosed_to_json_dict,
)

TRUNK = ["train.py:<module>:60", "train.py:main:55"]
AR = [*TRUNK, "train.py:step:30", "torch/distributed/distributed_c10d.py:all_reduce:2800"]
BAR = [*TRUNK, "train.py:evaluate:48", "torch/distributed/distributed_c10d.py:barrier:4100"]

REQUIRED = {
    "verdict": str, "culprit_ranks": list, "summary": str, "confidence": str, "basis": list,
    "evidence": list,
    "next_steps": list, "ranks": list, "groups": list, "unreachable": list,
    "hangdoc_version": str, "schema_version": int, "spec": str, "world_size": int,
    "observed_seconds": float, "partial": bool, "captured_at": str, "notes": list,
}  # fmt: skip
RANK_KEYS = {"rank", "pid", "host", "state", "op", "thread", "group", "detail",
             "rank_source", "rank_evidence"}  # fmt: skip
OP_KEYS = {"kind", "name", "call_site", "function", "via", "peer", "in_cleanup", "cleanup_site"}


WORKERS = Note(
    "not counted as ranks (DataLoader/compile/multiprocessing workers)",
    NoteKind.NOT_RANKS,
    node="node1",
    pids=(4242, 4243),
    listed="pid 4242 (child of rank 4 (pid 1004)), 4243 (child of rank 4 (pid 1004))",
)


def scenario() -> tuple[Diagnosis, JobSnapshot]:
    ranks = [make_rank(r, AR) for r in (0, 1, 2, 5)] + [
        make_rank(3, BAR, rank_source=RankSource.INFERRED, rank_evidence="spawn index 3"),
        make_rank(4, BAR, host="node1"),
    ]
    snap = make_snapshot(
        ranks,
        world_size=8,
        unreachable=[Unreachable("node2:50051", "connection refused", (7, 6))],
        notes=[Note("window extended to 4.0 s"), WORKERS],
    )
    ar = make_op("all_reduce", "train.py:step:30")
    bar = make_op("barrier", "train.py:evaluate:48", in_cleanup=True,
                  cleanup_frame="train.py:main:55")  # fmt: skip
    diagnosis = make_diagnosis(
        snap,
        verdict=Verdict.COLLECTIVE_MISMATCH,
        culprits=[4, 3],
        summary="Ranks [3-4] wait in barrier while [0-2,5] wait in all_reduce — “mismatch”.",
        evidence=[Evidence("ranks [0-2,5] in all_reduce (train.py:30)"), Evidence("is in barrier (train.py:48)", 4)],
        next_steps=["export TORCH_DISTRIBUTED_DEBUG=DETAIL"],
        ops={0: ar, 1: ar, 2: ar, 5: ar, 3: bar, 4: bar},
        details={4: "in barrier (train.py:48), thread 'MainThread'"},
        observed_seconds=4.2,
    )
    return diagnosis, snap


def test_required_keys_and_types() -> None:
    data = to_json_dict(*scenario())
    for key, kind in REQUIRED.items():
        assert isinstance(data[key], kind), key
    assert data["verdict"] == "collective_mismatch"
    assert data["hangdoc_version"] == __version__
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["world_size"] == 8 and data["observed_seconds"] == 4.2
    assert data["partial"] is True  # the snapshot has an unreachable node
    # notes and evidence are written as their words: the node and pids a note lists, the
    # rank evidence is said of, in the words as they always were
    assert data["notes"] == [
        "window extended to 4.0 s",
        "node1: not counted as ranks (DataLoader/compile/multiprocessing workers): "
        "pid 4242 (child of rank 4 (pid 1004)), 4243 (child of rank 4 (pid 1004))",
    ]
    assert data["evidence"] == ["ranks [0-2,5] in all_reduce (train.py:30)", "rank 4 is in barrier (train.py:48)"]
    assert data["captured_at"] == "2025-01-01T12:00:00Z"


def test_confidence_and_basis_follow_the_summary() -> None:
    diagnosis, snap = scenario()
    basis = ("stacks of ranks 0-5 in 3 samples", "1 of 2 nodes did not answer: ranks 6-7 unknown")
    weighed = dataclasses.replace(diagnosis, confidence=Confidence.MEDIUM, basis=basis)
    data = to_json_dict(weighed, snap)
    assert list(data)[:6] == ["verdict", "culprit_ranks", "summary", "confidence", "basis",
                              "evidence"]  # fmt: skip
    assert data["confidence"] == "medium"
    assert data["basis"] == list(basis)
    # a diagnosis nobody weighed (built by hand) claims no certainty
    assert to_json_dict(diagnosis, snap)["confidence"] == "low"
    assert to_json_dict(diagnosis, snap)["basis"] == []


@pytest.mark.parametrize("confidence", list(Confidence))
def test_every_confidence_serialises(confidence: Confidence) -> None:
    diagnosis, snap = scenario()
    text = render_json(dataclasses.replace(diagnosis, confidence=confidence), snap)
    assert json.loads(text)["confidence"] == confidence.value


def test_analysed_report_carries_the_judgement() -> None:
    from hangdoc.analysis.analyse import analyse

    snap = make_snapshot({r: AR for r in range(4)})
    data = to_json_dict(analyse(snap), snap)
    assert data["verdict"] == "nccl_timeout" and data["confidence"] == "high"
    assert data["basis"][0] == "stacks of all 4 ranks in 3 samples agree"


def test_old_saved_snapshot_is_weighed_on_replay(capsys: pytest.CaptureFixture[str]) -> None:
    from hangdoc.cli import main

    # recorded before confidence existed: nothing of it is stored, analysis recomputes it
    path = REPO / "tests" / "snapshots" / "nccl_timeout_teacher_broadcast.json.gz"
    assert main(["analyze", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "nccl_timeout" and data["confidence"] == "high"
    assert "stacks of all 4 ranks in 5 samples agree" in data["basis"]


def test_culprit_ranks_sorted_even_if_diagnosis_is_not() -> None:
    diagnosis, snap = scenario()
    diagnosis = dataclasses.replace(diagnosis, culprit_ranks=(4, 3))
    assert to_json_dict(diagnosis, snap)["culprit_ranks"] == [3, 4]


def test_ranks() -> None:
    ranks = to_json_dict(*scenario())["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 5, 3, 4]
    for entry in ranks:
        assert set(entry) == RANK_KEYS
        assert entry["state"] in {s.value for s in RankState}
    by_rank = {r["rank"]: r for r in ranks}
    assert by_rank[0]["op"] == {
        "kind": "collective", "name": "all_reduce", "call_site": "train.py:30",
        "function": "step", "via": "c10d call", "peer": None, "group": None,
        "in_cleanup": False, "cleanup_site": None,
    }  # fmt: skip
    assert by_rank[3]["op"]["in_cleanup"] is True
    assert by_rank[3]["op"]["cleanup_site"] == "main (train.py:55)"
    assert by_rank[0]["pid"] == 1000 and by_rank[4]["host"] == "node1"
    assert by_rank[0]["group"] == 0 and by_rank[3]["group"] == 1
    assert by_rank[0]["thread"] == "MainThread"
    assert by_rank[4]["detail"] == "in barrier (train.py:48), thread 'MainThread'"
    assert (by_rank[0]["rank_source"], by_rank[0]["rank_evidence"]) == ("env", "RANK=0")
    assert (by_rank[3]["rank_source"], by_rank[3]["rank_evidence"]) == (
        "inferred",
        "spawn index 3",
    )


def test_rank_without_op_or_process() -> None:
    diagnosis, snap = scenario()
    missing = RankAnalysis(6, None, "", RankState.MISSING, None, None, None, "no process")
    diagnosis = dataclasses.replace(diagnosis, ranks=(*diagnosis.ranks, missing))
    entry = to_json_dict(diagnosis, snap)["ranks"][-1]
    assert entry["op"] is None and entry["pid"] is None and entry["group"] is None
    assert entry["state"] == "missing"
    assert entry["rank_source"] is None and entry["rank_evidence"] == ""


def test_process_found_by_host_and_pid() -> None:
    # two hosts may reuse a pid: the entry must describe its own host's process
    snap = make_snapshot(
        [make_rank(0, AR, pid=77), make_rank(1, AR, pid=77, host="node1",
                                             rank_source=RankSource.INFERRED, rank_evidence="x")]
    )  # fmt: skip
    ranks = to_json_dict(make_diagnosis(snap), snap)["ranks"]
    assert [(r["host"], r["rank_source"]) for r in ranks] == [
        ("node0", "env"),
        ("node1", "inferred"),
    ]


def test_groups() -> None:
    groups = to_json_dict(*scenario())["groups"]
    assert [g["id"] for g in groups] == [0, 1]
    assert groups[0]["ranks"] == [0, 1, 2, 5]
    assert groups[0]["ranks_compact"] == "[0-2,5]"
    assert groups[1]["ranks_compact"] == "[3-4]"
    assert groups[0]["op"]["name"] == "all_reduce"
    stack = groups[0]["stack"]
    assert [f["function"] for f in stack] == ["<module>", "main", "step", "all_reduce"]
    assert stack[-1] == {
        "function": "all_reduce",
        "file": make_frame(AR[-1]).filename,
        "line": 2800,
        "native": False,
        "code": None,
    }


def test_unreachable() -> None:
    assert to_json_dict(*scenario())["unreachable"] == [
        {"target": "node2:50051", "reason": "connection refused", "ranks": [6, 7]}
    ]


@pytest.mark.parametrize("verdict", list(Verdict))
def test_every_verdict_serialises(verdict: Verdict) -> None:
    diagnosis, snap = scenario()
    diagnosis = dataclasses.replace(diagnosis, verdict=verdict)
    assert json.loads(render_json(diagnosis, snap))["verdict"] == verdict.value


def test_render_json_text() -> None:
    diagnosis, snap = scenario()
    text = render_json(diagnosis, snap)
    assert json.loads(text) == to_json_dict(diagnosis, snap)
    assert "“mismatch”" in text  # not \u escapes
    assert text.startswith('{\n  "verdict": "collective_mismatch",\n  "culprit_ranks": [\n    3,')
    assert list(json.loads(text))[:3] == ["verdict", "culprit_ranks", "summary"]


def test_render_json_writes_a_rank_a_line() -> None:
    diagnosis, snap = scenario()
    text = render_json(diagnosis, snap)
    lines = text.splitlines()
    start = lines.index('  "ranks": [')
    entries = lines[start + 1 : start + 1 + len(diagnosis.ranks)]
    assert [json.loads(e.strip().rstrip(",")) for e in entries] == to_json_dict(diagnosis, snap)["ranks"]
    assert all(e.startswith('    {"rank": ') for e in entries)
    assert lines[start + 1 + len(diagnosis.ranks)] == "  ],"


def test_dumps_layout() -> None:
    value = {"a": [1, {"b": [1, 2]}], "c": {"d": {"e": math.nan}}, "x": [], 1: {}, "k": "\u202e"}
    assert dumps(value) == (
        '{\n  "a": [\n    1,\n    {"b": [1, 2]}\n  ],\n  "c": {\n    "d": {"e": null}\n  },\n'
        '  "x": [],\n  "1": {},\n  "k": "\\u202e"\n}'
    )


def test_missing_ranks_find_their_process_by_rank() -> None:
    # an entry without a pid (a rank the analysis names) describes the process of its rank
    diagnosis, snap = scenario()
    moved = RankAnalysis(1, None, "", RankState.UNKNOWN, None, None, None, "its node did not answer")
    diagnosis = dataclasses.replace(diagnosis, ranks=(moved,))
    (entry,) = to_json_dict(diagnosis, snap)["ranks"]
    assert entry["rank_source"] == "env" and entry["rank_evidence"]


def test_p2p_peer() -> None:
    snap = make_snapshot({0: AR, 1: AR})
    send = make_op("send", "train.py:pipe:12", peer=1)
    data = to_json_dict(make_diagnosis(snap, ops={0: send}), snap)
    assert data["ranks"][0]["op"]["kind"] == OpKind.P2P.value
    assert data["ranks"][0]["op"]["peer"] == 1
    assert data["ranks"][1]["op"] is None


SCHEMA_DOC = REPO / "docs" / "json-schema.md"


def _keys(value: object) -> set[str]:
    if isinstance(value, dict):
        return set(value).union(*(_keys(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_keys(v) for v in value))
    return set()


def test_every_key_is_documented() -> None:
    doc = SCHEMA_DOC.read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(\w+)` \|", doc, flags=re.MULTILINE))
    diagnosis, snap = scenario()
    send = make_op("send", "train.py:pipe:12", peer=1)
    diagnosis = make_diagnosis(snap, ops={0: send}, details={0: "x"})
    assert _keys(to_json_dict(diagnosis, snap)) - documented == set()


def test_documented_example_matches_the_report_shape() -> None:
    doc = SCHEMA_DOC.read_text(encoding="utf-8")
    example = json.loads(doc.split("```json\n", 1)[1].split("```", 1)[0])
    report = to_json_dict(*scenario())
    assert list(example) == list(report)
    assert set(example["ranks"][0]) == set(report["ranks"][0])
    assert set(example["groups"][0]) == set(report["groups"][0])
    assert example["schema_version"] == SCHEMA_VERSION


# ------------------------------------------------------------- strict, printable JSON


def _strict(text: str) -> object:
    def reject(name: str) -> None:
        raise AssertionError(f"{name} in strict JSON")

    return json.loads(text, parse_constant=reject)


def test_non_finite_floats_are_null() -> None:
    diagnosis, snap = scenario()
    for value in (math.nan, math.inf, -math.inf):
        data = _strict(render_json(dataclasses.replace(diagnosis, observed_seconds=value), snap))
        assert data["observed_seconds"] is None


def test_snapshot_with_nan_and_inf_gives_strict_json() -> None:
    from hangdoc.analysis.analyse import analyse

    ranks = [make_rank(r, AR, cpu_start=math.inf, interval=math.nan) for r in (0, 1)]
    snap = dataclasses.replace(make_snapshot(ranks), window_seconds=math.nan)
    data = _strict(render_json(analyse(snap), snap))
    assert data["observed_seconds"] is None or math.isfinite(data["observed_seconds"])


def test_dumps_maps_nested_non_finite_floats() -> None:
    assert dumps({"a": [1.5, math.nan, {"b": -math.inf}], "c": (math.inf,)}, indent=None) == (
        '{"a": [1.5, null, {"b": null}], "c": [null]}'
    )


EVIL = "\x1b[2J\x1b]0;t\x07\r\x7f\x9b\u202e\u2028\ud800 ünï ✓"


def test_strings_stay_raw_but_the_text_is_escaped() -> None:
    snap = make_snapshot({0: [*TRUNK, f"train.py:{EVIL}:3"], 1: AR}, notes=[Note(EVIL)])
    diagnosis = make_diagnosis(snap, summary=EVIL)
    text = render_json(diagnosis, snap)
    assert not set(text) & set("\x1b\x07\r\x7f\x9b\u202e\u2028\ud800"), repr(text)
    assert "ünï ✓" in text  # other non-ASCII is kept as is
    assert "\\u001b[2J" in text and "\\u009b" in text and "\\u202e" in text and "\\ud800" in text
    text.encode("utf-8")  # no lone surrogate left
    data = _strict(text)
    assert data["summary"] == EVIL and data["notes"] == [EVIL]
    assert data["groups"][0]["stack"][-1]["function"] == EVIL


def test_error_object_shape() -> None:
    obj = error_to_dict("JobNotFound", "no rank process of 127.0.0.1:1", "Check the spec.", 3)
    assert obj == {
        "error": {"kind": "JobNotFound", "message": "no rank process of 127.0.0.1:1",
                  "help": "Check the spec.", "exit_code": 3},
        "hangdoc_version": __version__,
        "schema_version": SCHEMA_VERSION,
    }  # fmt: skip
    assert _strict(dumps(obj)) == obj


# ------------------------------------------------------- a stop that was not diagnosed


def undiagnosed(help: str = "Start hangdoc where it can see the ranks.") -> dict[str, object]:
    return undiagnosed_to_json_dict("pid:1", "no rank process of pid:1", help,
                                    noticed="no output for 2.0 s; stall timeout 1.0 s (--stall-after)",
                                    captured_at="2026-11-22T00:00:00+00:00")  # fmt: skip


def test_undiagnosed_report_has_the_keys_of_a_report_in_their_order() -> None:
    report = undiagnosed()
    assert list(report) == list(to_json_dict(*scenario()))
    for key, kind in REQUIRED.items():
        if key != "world_size":  # null: nobody knows it
            assert isinstance(report[key], kind), key
    assert _strict(dumps(report)) == report


def test_undiagnosed_report_values() -> None:
    assert undiagnosed() == {
        "verdict": "unknown",
        "culprit_ranks": [],
        "summary": "the job stopped making progress but could not be diagnosed: "
                   "no rank process of pid:1",
        "confidence": "low",
        "basis": ["the diagnosis failed: no stack backs a verdict"],
        "evidence": ["no output for 2.0 s; stall timeout 1.0 s (--stall-after)",
                     "no rank process of pid:1"],
        "next_steps": ["Start hangdoc where it can see the ranks."],
        "ranks": [], "groups": [], "unreachable": [],
        "spec": "pid:1",
        "world_size": None,
        "observed_seconds": 0.0,
        "partial": True,
        "scope": {"world_size": None, "whole": False, "seen": [], "not_seen": [], "absent": []},
        "root_cause": None,
        "other_processes": [],
        "captured_at": "2026-11-22T00:00:00+00:00",
        "notes": ["diagnosis failed: no rank process of pid:1"],
        "hangdoc_version": __version__,
        "schema_version": SCHEMA_VERSION,
    }  # fmt: skip
    assert undiagnosed(help="")["next_steps"] == []
