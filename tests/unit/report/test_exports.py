"""--speedscope and --folded: the ranks' sampled stacks, a class of ranks at a time, read
back (the folded lines parsed, the speedscope file checked against its format) and counted:
every class's counts add up to its ranks' samples times their threads."""

from __future__ import annotations

import json
import re
import stat
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.factories import make_diagnosis, make_frame, make_op, make_rank, make_snapshot
from support.paths import REPO

from hangdoc import __version__
from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot
from hangdoc.cli import main
from hangdoc.model import CaptureErrorKind, Diagnosis, Frame, JobSnapshot, Verdict
from hangdoc.rankranges import ranges_text
from hangdoc.report import exports
from hangdoc.report.exports import render_folded, render_speedscope, stack_export

sys.path.insert(0, str(REPO / "bench"))
from synthetic import synthetic_snapshot

CORPUS = REPO / "tests" / "snapshots" / "mismatch_ddp_uneven_epoch_end.json.gz"
SCHEMA = REPO / "tests" / "data" / "speedscope" / "file-format-schema.json"
TRUNK = ["train.py:<module>:60", "train.py:main:55"]
AR = [*TRUNK, "train.py:step:30", "torch/distributed/distributed_c10d.py:all_reduce:2800"]
BAR = [*TRUNK, "train.py:evaluate:48", "torch/distributed/distributed_c10d.py:barrier:4100"]
PIN = ["threading.py:_bootstrap:1002", "torch/utils/data/_utils/pin_memory.py:_pin_memory_loop:52"]
FOLDED_LINE = re.compile(r"^(\S(?:.*\S)?) ([1-9][0-9]*)$")  # no line may end in a space


def _mismatch(samples: int = 3) -> tuple[Diagnosis, JobSnapshot]:
    snap = make_snapshot({0: AR, 1: AR, 2: BAR, 3: AR}, threads={"pin_memory": PIN}, samples=samples)
    diag = make_diagnosis(
        snap,
        verdict=Verdict.COLLECTIVE_MISMATCH,
        culprits=[2],
        ops={r: make_op("barrier" if r == 2 else "all_reduce") for r in range(4)},
    )
    return diag, snap


def _folded(text: str) -> list[tuple[list[str], int]]:
    """The folded lines as (frames, count), each line checked against the format."""
    assert text.endswith("\n")
    out = []
    for line in text.splitlines():
        found = FOLDED_LINE.match(line)
        assert found, f"not a folded line: {line!r}"
        out.append((found.group(1).split(";"), int(found.group(2))))
    return out


def _by_class(text: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for frames, count in _folded(text):
        counts[frames[0]] += count
    return counts


def _samples(snap: JobSnapshot, ranks: set[int | None] | None = None) -> int:
    """Threads seen over the good samples of ``ranks`` (all ranks when None)."""
    return sum(len(s.threads) for r in snap.ranks if ranks is None or r.rank in ranks for s in r.good_samples)


def _check_speedscope(text: str) -> dict[str, Any]:
    """The file as speedscope reads it: frame indices in range, one weight per sample,
    each profile's span its weights' sum."""
    doc = json.loads(text)
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    assert doc["exporter"] == f"hangdoc {__version__}"
    frames = doc["shared"]["frames"]
    assert all(isinstance(f["name"], str) and f["name"] for f in frames)
    assert 0 <= doc["activeProfileIndex"] < max(len(doc["profiles"]), 1)
    for profile in doc["profiles"]:
        assert profile["type"] == "sampled" and profile["unit"] == "none"
        assert len(profile["samples"]) == len(profile["weights"])
        assert all(isinstance(w, int) and w > 0 for w in profile["weights"])
        assert profile["endValue"] - profile["startValue"] == sum(profile["weights"])
        for stack in profile["samples"]:
            assert stack and all(0 <= i < len(frames) for i in stack)
    return doc


def test_folded_lines_per_class_add_up_to_the_samples() -> None:
    diag, snap = _mismatch()
    lines = _folded(render_folded(diag, snap))
    assert _by_class(render_folded(diag, snap)) == {
        "ranks 0-1,3 (3 ranks): all_reduce": 3 * 3 * 2,  # ranks x samples x threads
        "rank 2: barrier": 3 * 2,
    }
    assert (
        [
            "ranks 0-1,3 (3 ranks): all_reduce",
            "thread MainThread",
            "<module> (train.py:60)",
            "main (train.py:55)",
            "step (train.py:30)",
            "all_reduce (torch/distributed/distributed_c10d.py:2800)",
        ],
        9,
    ) in lines
    pin = [
        "thread pin_memory",
        "_bootstrap (threading.py:1002)",
        "_pin_memory_loop (torch/utils/data/_utils/pin_memory.py:52)",
    ]
    assert (["rank 2: barrier", *pin], 3) in lines
    assert len(lines) == 4  # one line a distinct stack of a class


def test_speedscope_has_a_profile_a_class_and_shares_frames() -> None:
    diag, snap = _mismatch()
    doc = _check_speedscope(render_speedscope(diag, snap))
    names = [p["name"] for p in doc["profiles"]]
    assert names == ["ranks 0-1,3 (3 ranks): all_reduce", "rank 2: barrier"]
    assert doc["activeProfileIndex"] == 1  # the culprit's class opens first
    assert [sum(p["weights"]) for p in doc["profiles"]] == [18, 6]
    frames = doc["shared"]["frames"]
    named = [f["name"] for f in frames]
    assert len(named) == len(set(named))  # each frame once, shared by the profiles
    # a stack reads outermost first, under its thread
    barrier = doc["profiles"][1]
    stacks = [[named[i] for i in s] for s in barrier["samples"]]
    assert ["thread MainThread", "<module> (train.py:60)", "main (train.py:55)", "evaluate (train.py:48)",
            "barrier (torch/distributed/distributed_c10d.py:4100)"] in stacks  # fmt: skip
    where = frames[named.index("evaluate (train.py:48)")]
    assert where["file"] == "/job/train.py" and where["line"] == 48


def test_speedscope_matches_the_file_format_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    diag, snap = _mismatch()
    jsonschema.validate(json.loads(render_speedscope(diag, snap)), schema)
    recorded = load_snapshot(CORPUS)
    jsonschema.validate(json.loads(render_speedscope(analyse(recorded), recorded)), schema)


def test_stacks_that_move_are_weighted_by_how_often_they_were_seen() -> None:
    moving = make_rank(0, stacks=[AR, AR, BAR, AR])
    still = make_rank(1, AR, samples=4)
    snap = make_snapshot([moving, still])
    diag = make_diagnosis(snap, verdict=Verdict.NOT_HUNG)
    counts = {tuple(frames[2:]): count for frames, count in _folded(render_folded(diag, snap))}
    assert counts == {
        tuple(str(make_frame(f)) for f in AR): 3 + 4,
        tuple(str(make_frame(f)) for f in BAR): 1,
    }
    assert sum(counts.values()) == _samples(snap) == 8


def test_names_that_would_break_a_line_are_escaped() -> None:
    odd = Frame("evil;name\nnext ", "/job/a;b.py", 7)
    trailing = Frame("pad  ", "/job/t.py", None)
    snap = make_snapshot({0: [*TRUNK, odd], 1: [*TRUNK, trailing]}, thread_name="main;\r")
    diag = make_diagnosis(snap, verdict=Verdict.UNKNOWN)
    lines = _folded(render_folded(diag, snap))
    assert len(lines) == 2 and all(len(frames) == 2 + len(TRUNK) + 1 for frames, _ in lines)
    shown = {frames[-1] for frames, _ in lines}
    assert "evil:name\\nnext  (a:b.py:7)" in shown
    assert all(frames[1] == "thread main:\\r" for frames, _ in lines)
    doc = _check_speedscope(render_speedscope(diag, snap))
    assert any(f["name"] == "evil;name\\nnext  (a;b.py:7)" for f in doc["shared"]["frames"])


def test_bare_native_addresses_do_not_split_a_class() -> None:
    def native(address: str) -> Frame:
        return Frame(address, "/usr/lib/libc.so.6", None, native=True)

    snap = make_snapshot({0: [*AR, native("0x7f01")], 1: [*AR, native("0x7f99")]})
    diag = analyse(snap)  # the merged tree leaves bare addresses out: one class
    (frames, count), *more = _folded(render_folded(diag, snap))
    assert not more and count == 6 and not any("0x7f" in f for f in frames)


def test_processes_outside_the_tree_are_a_class_of_their_own() -> None:
    snap = make_snapshot([make_rank(0, AR), make_rank(None, BAR, pid=4242)])
    diag = make_diagnosis(snap, verdict=Verdict.UNKNOWN)
    assert _by_class(render_folded(diag, snap)) == {"rank 0": 3, "1 other process: not in the merged tree": 3}


def test_unreadable_ranks_and_a_diagnosis_without_classes() -> None:
    snap = make_snapshot([make_rank(0, AR), make_rank(1, AR, error=CaptureErrorKind.PTRACE_DENIED)])
    diag = make_diagnosis(snap, verdict=Verdict.UNKNOWN)
    assert _by_class(render_folded(diag, snap)) == {"rank 0": 3}
    empty = make_diagnosis(make_snapshot({}), verdict=Verdict.UNKNOWN, tree=False)
    assert render_folded(empty, make_snapshot({})) == ""
    assert _check_speedscope(render_speedscope(empty, make_snapshot({})))["profiles"] == []


def test_bounds_keep_every_class_and_its_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    # 6 ranks, each in its own stack (6 classes), each with 3 distinct side threads
    stacks = {r: [*TRUNK, f"train.py:step:{30 + r}"] for r in range(6)}
    side = {f"worker{i}": [f"threading.py:run:{900 + i}"] for i in range(3)}
    snap = make_snapshot(stacks, threads=side)
    diag = make_diagnosis(snap, verdict=Verdict.UNKNOWN)
    monkeypatch.setattr(exports, "MAX_CLASSES", 4)
    monkeypatch.setattr(exports, "MAX_STACKS", 5)
    export = stack_export(diag, snap)
    assert len(export.classes) == 4  # 3 apart, the 3 smaller together
    assert export.classes[-1].name == "ranks 3-5 (3 ranks): 3 smaller classes"
    assert sum(len([s for s in c.stacks if not s.left_out]) for c in export.classes) == 5
    assert all(c.stacks[0].left_out == 0 for c in export.classes)  # each keeps its top stack
    counts = _by_class(render_folded(diag, snap))
    assert counts == {c.name: 4 * 3 * len(c.ranks) for c in export.classes}
    assert any(frames[-1].endswith("other stacks)") for frames, _ in _folded(render_folded(diag, snap)))
    _check_speedscope(render_speedscope(diag, snap))


def test_a_recorded_snapshot_counts_every_sample() -> None:
    snap = load_snapshot(CORPUS)
    diag = analyse(snap)
    counts = _by_class(render_folded(diag, snap))
    assert len(counts) == len(diag.groups) >= 2
    for group in diag.groups:
        many = f"ranks {ranges_text(group.ranks)} ({len(group.ranks)} ranks)"
        who = f"rank {group.ranks[0]}" if len(group.ranks) == 1 else many
        (name,) = [n for n in counts if n.split(":")[0] == who]
        assert counts[name] == _samples(snap, set(group.ranks))
    assert sum(counts.values()) == _samples(snap)
    doc = _check_speedscope(render_speedscope(diag, snap))
    assert sorted(p["name"] for p in doc["profiles"]) == sorted(counts)
    assert sum(sum(p["weights"]) for p in doc["profiles"]) == _samples(snap)


def test_size_follows_the_distinct_stacks_not_the_ranks() -> None:
    sizes = {}
    for world in (240, 2_400):
        snap = synthetic_snapshot(world, "straggler")
        diag = analyse(snap)
        sizes[world] = (len(render_folded(diag, snap)), len(render_speedscope(diag, snap)))
        assert sum(_by_class(render_folded(diag, snap)).values()) == _samples(snap)
    for small, large in zip(sizes[240], sizes[2_400], strict=True):
        assert large < small * 1.2  # the same stacks: only rank ranges and counts grow


def test_cli_writes_speedscope_and_folded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    speedscope, folded = tmp_path / "s.json", tmp_path / "g.folded"
    assert main(["analyze", str(CORPUS), "--speedscope", str(speedscope), "--folded", str(folded)]) == 0
    assert "collective_mismatch" in capsys.readouterr().out
    for path in (speedscope, folded):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    snap = load_snapshot(CORPUS)
    assert sum(_by_class(folded.read_text()).values()) == _samples(snap)
    _check_speedscope(speedscope.read_text())


@pytest.mark.parametrize("option", ["--speedscope", "--folded"])
def test_cli_refuses_a_directory_before_the_work(
    option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", str(tmp_path / "no-such.json.gz"), option, str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert option in err and "no-such" not in err  # the path was refused before the bundle was read
