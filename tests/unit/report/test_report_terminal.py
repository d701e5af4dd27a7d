"""The terminal report: golden output at a fixed width, plus the facts it must show.

Regenerate the golden files after an intended change with
``HANGDOC_UPDATE_GOLDEN=1 python -m pytest tests/test_report_terminal.py`` and review the diff.
"""

from __future__ import annotations

import dataclasses
import os
import re
from io import StringIO

import pytest
from rich.console import Console
from support.factories import make_diagnosis, make_frame, make_op, make_rank, make_snapshot
from support.paths import TESTS

from hangdoc.analysis import merge
from hangdoc.analysis.merge import build_tree
from hangdoc.errors import printable
from hangdoc.model import (
    CaptureErrorKind,
    Confidence,
    Diagnosis,
    Evidence,
    Frame,
    JobSnapshot,
    Note,
    NoteKind,
    RankAnalysis,
    RankState,
    Unreachable,
    Verdict,
)
from hangdoc.report.terminal import render

GOLDEN = TESTS / "golden"
RUNPY = ["<frozen runpy>:_run_module_as_main:198", "<frozen runpy>:_run_code:88"]
TRUNK = [*RUNPY, "train.py:<module>:60", "train.py:main:55", "train.py:train_loop:35"]
WRAPPER = "torch/distributed/c10d_logger.py:wrapper:81"
STEP = make_frame("train.py:train_step:30", code="dist.all_reduce(loss)")
EVAL = make_frame("train.py:evaluate:48", code="dist.barrier()")
AR = [*TRUNK, STEP, WRAPPER, "torch/distributed/distributed_c10d.py:all_reduce:2800"]
BAR = [*TRUNK, EVAL, WRAPPER, "torch/distributed/distributed_c10d.py:barrier:4100"]
COLOR = re.compile(r"\x1b\[(?:\d+;)*(?:3\d|9\d)(?:;\d+)*m")  # a foreground colour code


def mismatch() -> tuple[Diagnosis, JobSnapshot]:
    snap = make_snapshot({0: AR, 1: AR, 2: AR, 3: BAR, 5: AR}, samples=5, interval=1.05,
                         world_size=6)  # fmt: skip
    ar, bar = make_op("all_reduce", STEP), make_op("barrier", EVAL)
    diagnosis = make_diagnosis(
        snap,
        verdict=Verdict.COLLECTIVE_MISMATCH,
        culprits=[3],
        summary="Rank 3 waits in barrier (train.py:48) while ranks [0-2,5] wait in all_reduce (train.py:30).",
        evidence=[
            Evidence("ranks [0-2,5] are in all_reduce called from train_step (train.py:30)"),
            Evidence("is in barrier called from evaluate (train.py:48)", rank=3),
        ],
        next_steps=[
            "Make every rank issue the same collectives in the same order.",
            "Rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL to have c10d check collective shapes.",
        ],
        ops={0: ar, 1: ar, 2: ar, 3: bar, 5: ar},
    )
    diagnosis = dataclasses.replace(
        diagnosis,
        confidence=Confidence.HIGH,
        basis=(
            "stacks of ranks 0-3,5 in 5 samples",
            "rank 3 named by its stack: the minority op",
            "no waiting rank's CPU, bytes or stack moved over 4.2 s",
        ),
    )
    return diagnosis, snap


FIND_EXCEPTION = "Find the exception rank 1 raised: its log, or TORCH_SHOW_CPP_STACKTRACES=1."


def cleanup_without_tree() -> tuple[Diagnosis, JobSnapshot]:
    finally_stack = [*TRUNK, "train.py:train_step:33",
                     "torch/distributed/distributed_c10d.py:destroy_process_group:2100"]  # fmt: skip
    snap = make_snapshot(
        [make_rank(r, AR, host="node0") for r in (0, 2, 3)] + [make_rank(1, finally_stack)],
        world_size=8,
        unreachable=[Unreachable("node1:50051", "deadline exceeded after 5.0 s", (4, 5, 6, 7))],
        notes=[Note("window extended from 2.0 s to 4.0 s: counters were still moving", NoteKind.WINDOW)],
    )
    ar = make_op("all_reduce", STEP)
    destroy = make_op("destroy_process_group", "train.py:train_step:33", in_cleanup=True)
    diagnosis = make_diagnosis(
        snap,
        verdict=Verdict.CLEANUP_DEADLOCK,
        culprits=[1],
        summary="Rank 1 left the training loop and waits in destroy_process_group; "
        "ranks [0,2-3] wait for it in all_reduce.",
        evidence=[Evidence("is in destroy_process_group inside a finally block (train.py:33)", rank=1)],
        next_steps=[FIND_EXCEPTION],
        ops={0: ar, 2: ar, 3: ar, 1: destroy},
        details={1: "exception path: finally at train.py:33"},
        tree=False,
    )
    unknown = [RankAnalysis(r, None, "node1", RankState.UNKNOWN, None, None, None)
               for r in (4, 5, 6, 7)]  # fmt: skip
    return dataclasses.replace(diagnosis, ranks=(*diagnosis.ranks, *unknown)), snap


def rendered(diagnosis: Diagnosis, snapshot: JobSnapshot, width: int = 100, **kwargs: int) -> str:
    console = Console(file=StringIO(), width=width, color_system=None)
    render(diagnosis, snapshot, console, **kwargs)
    return console.file.getvalue()


def _normalised(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


@pytest.mark.parametrize("name", ["mismatch", "cleanup_without_tree"])
def test_golden(name: str) -> None:
    output = _normalised(rendered(*globals()[name]()))
    path = GOLDEN / f"terminal_{name}.txt"
    if os.environ.get("HANGDOC_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(output, encoding="utf-8")
    assert path.exists(), f"no golden file {path}: run with HANGDOC_UPDATE_GOLDEN=1"
    assert output == path.read_text(encoding="utf-8")


def _line_with(text: str, needle: str) -> str:
    lines = [line for line in text.splitlines() if needle in line]
    assert lines, f"{needle!r} not in output"
    return lines[0]


def test_header_names_verdict_culprits_and_summary() -> None:
    out = rendered(*mismatch())
    first = out.splitlines()[0]
    assert "collective_mismatch" in first and "culprit ranks [3]" in first
    assert "Rank 3 waits in barrier (train.py:48)" in out.splitlines()[1]
    assert "job 127.0.0.1:29500 · 5 of 6 rank processes found" in out


def test_header_shows_confidence_beside_the_verdict_and_the_basis_below() -> None:
    lines = _normalised(rendered(*mismatch())).splitlines()
    assert lines[0] == "verdict: collective_mismatch   culprit ranks [3]   confidence: high"
    assert lines[2:5] == [
        "basis: · stacks of ranks 0-3,5 in 5 samples",
        "       · rank 3 named by its stack: the minority op",
        "       · no waiting rank's CPU, bytes or stack moved over 4.2 s",
    ]
    assert lines[5].startswith("job 127.0.0.1:29500")


def test_no_basis_line_when_nothing_was_weighed() -> None:
    out = rendered(*cleanup_without_tree())
    assert "confidence: low   (partial evidence)" in out.splitlines()[0]
    assert not any(line.startswith("basis:") for line in out.splitlines())


def test_an_analysed_snapshot_shows_its_confidence() -> None:
    from hangdoc.analysis.analyse import analyse

    snap = make_snapshot({r: AR for r in range(4)})
    out = _normalised(rendered(analyse(snap), snap))
    assert out.splitlines()[0] == "verdict: nccl_timeout   no culprit ranks   confidence: high"
    assert "basis: · stacks of all 4 ranks in 3 samples agree\n       · every op read from a" in out


@pytest.mark.parametrize(("confidence", "code"), [
    (Confidence.HIGH, "\x1b[32mhigh"), (Confidence.MEDIUM, "\x1b[33mmedium"),
    (Confidence.LOW, "\x1b[1;33mlow"),
])  # fmt: skip
def test_confidence_is_coloured(confidence: Confidence, code: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    diagnosis, snap = mismatch()
    console = Console(file=StringIO(), width=100, force_terminal=True)
    render(dataclasses.replace(diagnosis, confidence=confidence), snap, console)
    assert code in console.file.getvalue()


def test_tree_marks_the_outlier_branch_and_compresses_ranks() -> None:
    out = rendered(*mismatch())
    outlier = _line_with(out, "evaluate (train.py:48)")
    assert outlier.split("evaluate")[0].endswith("[3] ")
    assert "◀ outlier, culprit" in outlier
    majority = _line_with(out, "train_step (train.py:30)")
    assert "[0-2,5]" in majority and "◀" not in majority
    assert "dist.all_reduce(loss)" in majority  # the source line of a user frame
    assert "torch.distributed.barrier (torch/distributed/distributed_c10d.py:4100)" in out
    assert "Merged stacks of 5 ranks [0-3,5], 2 distinct stacks" in out
    # the shared trunk is printed once, above the split
    assert out.count("train_loop (train.py:35)") == 1
    assert out.index("train_loop (train.py:35)") < out.index("train_step (train.py:30)")


def test_reporter_reads_the_tree_and_never_builds_one(monkeypatch: pytest.MonkeyPatch) -> None:
    diagnosis, snap = mismatch()

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the reporter built a CallTree")

    monkeypatch.setattr(merge, "build_tree", refuse)
    out = rendered(diagnosis, snap)
    assert "◀ outlier, culprit" in out


def test_tree_is_the_diagnosis_tree_not_the_groups() -> None:
    diagnosis, snap = mismatch()
    other = build_tree({0: tuple(make_frame(f) for f in ["x.py:only_in_tree:1"])})
    out = rendered(dataclasses.replace(diagnosis, tree=other), snap)
    assert "only_in_tree (x.py:1)" in out
    assert "dist.barrier()" not in out and "◀ outlier" not in out


def test_groups_are_rendered_when_there_is_no_tree() -> None:
    out = rendered(*cleanup_without_tree())
    assert "Stack groups" in out
    header = _line_with(out, "[1] group 1: ")
    assert "destroy_process_group (train.py:33)" in header and "◀ culprit" in header
    assert "[0,2-3] group 0: all_reduce (train.py:30)" in out
    assert "destroy_process_group (torch/distributed/distributed_c10d.py:2100)" in out


def test_rank_table_marks_culprits() -> None:
    out = rendered(*mismatch())
    row = _line_with(out, "3 *")
    assert "barrier" in row and "train.py:48" in row and "waiting" in row and "1003" in row
    assert "* culprit" in out
    assert "*" not in _line_with(out, "1000 ")


def test_sections() -> None:
    out = rendered(*cleanup_without_tree())
    assert "(partial evidence)" in out.splitlines()[0]
    assert "• rank 1 is in destroy_process_group inside a finally block" in out
    assert "1. Find the exception rank 1 raised" in out
    assert "✗ node1:50051: deadline exceeded after 5.0 s (ranks [4-7] unknown)" in out
    assert "• observed for 1.0 s over 3 samples" in out
    assert "• window extended from 2.0 s to 4.0 s" in out
    row = _line_with(out, "1 *")
    assert "destroy_process_group" in row and "exception path" in row
    assert "[cleanup]" in out  # wrapped into the next line of the op column


def test_notes_use_observed_seconds_and_sample_count() -> None:
    diagnosis, snap = mismatch()
    out = rendered(dataclasses.replace(diagnosis, observed_seconds=4.2), snap)
    assert "observed for 4.2 s over 5 samples" in out


def test_long_stretch_is_folded_keeping_both_ends() -> None:
    deep = [f"model.py:layer{i}:{i + 1}" for i in range(40)]
    snap = make_snapshot({0: ["train.py:main:1", "a.py:left:1", *deep],
                          1: ["train.py:main:1", "a.py:right:2"]})  # fmt: skip
    out = rendered(make_diagnosis(snap), snap, max_frames=6)
    assert "left (a.py:1)" in out  # head of the stretch
    assert "⋮ 36 frames" in out  # 41 frames, 1 head + 4 tail lines shown
    for i in range(36, 40):  # the frames next to the leaf stay
        assert f"layer{i} (model.py:{i + 1})" in out
    assert "layer20 " not in out
    assert "right (a.py:2)" in out
    assert len(out.splitlines()) < 30


def test_library_runs_are_folded_per_package() -> None:
    stack = [*RUNPY, "train.py:main:5"] + [f"torch/nn/modules/module.py:f{i}:{i}" for i in range(6)]
    snap = make_snapshot({0: stack})
    out = rendered(make_diagnosis(snap), snap)
    assert "runpy: _run_module_as_main › _run_code (<frozen runpy>:88)" in out
    assert "torch.nn.modules.f0 › …3 more… › f4 › f5 (torch/nn/modules/module.py:5)" in out


def test_many_ranks_merge_table_rows_and_truncate_rank_labels() -> None:
    stacks = {r: AR for r in range(0, 400, 2)} | {r: BAR for r in range(1, 400, 2)}
    snap = make_snapshot(stacks)
    ar, bar = make_op("all_reduce", STEP), make_op("barrier", EVAL)
    diagnosis = make_diagnosis(snap, ops={r: ar if r % 2 == 0 else bar for r in stacks})
    out = rendered(diagnosis, snap)
    assert len(out.splitlines()) < 50
    row = _line_with(out, "│ all_reduce")
    assert row.startswith("[0,2,4,6,8,10,12,14,16,18,…] │   200 │ node0 ")
    assert _line_with(out, "│ barrier").startswith("[1,3,5,7,9,11,13,15,17,19,…] │   200 │")
    tree = out.splitlines()  # in the tree, a long label sits above its frames
    at = tree.index(_line_with(out, "── [0,2,4,6,8,10,12,14,16,18,…] (200)"))
    assert "train_step (train.py:30)" in tree[at + 1]


def test_job_text_is_not_markup() -> None:
    snap = make_snapshot({0: ["[bold]evil.py:[red]f[/red]:3"], 1: ["train.py:main:1"]})
    out = rendered(make_diagnosis(snap, summary="[bold]not markup[/bold]"), snap)
    assert "[bold]not markup[/bold]" in out
    assert "[red]f[/red] ([bold]evil.py:3)" in out


def test_colour_by_severity_and_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    def coloured(diagnosis: Diagnosis, snap: JobSnapshot) -> str:
        console = Console(file=StringIO(), width=100, force_terminal=True)
        render(diagnosis, snap, console)
        return console.file.getvalue()

    monkeypatch.delenv("NO_COLOR", raising=False)
    diagnosis, snap = mismatch()
    hung = coloured(diagnosis, snap)
    assert "\x1b[1;31mcollective_mismatch" in hung  # bold red
    healthy = coloured(dataclasses.replace(diagnosis, verdict=Verdict.NOT_HUNG), snap)
    assert "\x1b[1;32mnot_hung" in healthy  # bold green
    monkeypatch.setenv("NO_COLOR", "1")
    plain = coloured(diagnosis, snap)
    assert COLOR.search(hung) and not COLOR.search(plain)
    assert "collective_mismatch" in plain


def test_nothing_captured_still_renders() -> None:
    snap = make_snapshot([], world_size=4, notes=[Note("no rank could be read")])
    diagnosis = make_diagnosis(snap, verdict=Verdict.UNKNOWN, summary="No rank could be read.")
    out = rendered(diagnosis, snap)
    assert out.splitlines()[0] == "verdict: unknown   no culprit ranks   confidence: low"
    assert "0 of 4 rank processes found" in out
    assert "• observed for 0.0 s over 0 samples" in out
    assert "• no rank could be read" in out


def test_unnumbered_and_unreadable_ranks_in_table() -> None:
    snap = make_snapshot([make_rank(0, AR), make_rank(None, (), pid=4242, error=CaptureErrorKind.PTRACE_DENIED)])
    out = rendered(make_diagnosis(snap), snap)
    row = _line_with(out, "4242")
    assert row.startswith("?") and "unreadable" in row


def test_folded_runs_name_the_function_the_job_called_past_its_decorator() -> None:
    logger = "torch/distributed/c10d_logger.py:_exception_logger.<locals>.wrapper:81"
    stack = ["train.py:main:5", logger, "torch/distributed/distributed_c10d.py:barrier:5356"]
    snap = make_snapshot({0: stack})
    out = rendered(make_diagnosis(snap), snap)
    assert "torch.distributed.barrier (torch/distributed/distributed_c10d.py:5356)" in out
    assert "wrapper" not in out


# ------------------------------------------------------- text from the job is inert


EVIL = "\x1b[2J\x1b]0;pwned\x07\rX\x7f\x9b31m\u202eexe.txt\u2066\u2028\ud800\t"
RAW_CONTROLS = set("\x1b\x07\r\x7f\x9b\u202e\u2066\u2028\ud800\t")
SGR = re.compile(r"\x1b\[[0-9;]*m")  # rich's own colours


def _evil_report() -> tuple[Diagnosis, JobSnapshot]:
    user = make_frame(f"/job/{EVIL}.py:{EVIL}:7", code=f"run()  # {EVIL}")
    lib = [
        f"torch/distributed/{EVIL}.py:{EVIL}:1",
        f"torch/distributed/x.py:w{EVIL}:2",
        "torch/distributed/distributed_c10d.py:barrier:3",
    ]
    native = make_frame(f"libc.so.6:{EVIL}", native=True)
    snap = make_snapshot(
        [make_rank(0, [*TRUNK, user, *lib], host=f"node{EVIL}"), make_rank(1, [*TRUNK, user, native], host="node1")],
        spec=f"pid:{EVIL}",
        notes=[Note(f"note {EVIL}")],
        unreachable=[Unreachable(f"node{EVIL}:7420", f"refused {EVIL}", (2,))],
    )
    snap = dataclasses.replace(snap, captured_at=EVIL)
    op = make_op(f"all_{EVIL}", user)
    diagnosis = make_diagnosis(
        snap,
        summary=f"summary {EVIL}",
        evidence=[Evidence(f"evidence {EVIL}")],
        next_steps=[f"step {EVIL}"],
        ops={0: op},
        details={1: f"detail {EVIL}"},
    )
    return dataclasses.replace(diagnosis, basis=(f"basis {EVIL}",)), snap


@pytest.mark.parametrize("tree", [True, False])
def test_control_characters_never_reach_the_terminal(tree: bool) -> None:
    diagnosis, snap = _evil_report()
    if not tree:
        diagnosis = dataclasses.replace(diagnosis, tree=None)
    out = rendered(diagnosis, snap, max_frames=40)
    assert not RAW_CONTROLS & set(out), repr(out)
    shown = "\\x1b[2J\\x1b]0;pwned\\x07\\rX\\x7f\\x9b31m\\u202eexe.txt\\u2066\\u2028\\ud800\\t"
    for where in ("summary ", "basis ", "evidence ", "step ", "note ", "refused "):  # not wrapped
        assert f"{where}{shown}" in out.replace("\n", ""), where
    assert f"job pid:{shown}" in out


def test_only_rich_colour_codes_reach_a_colour_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    console = Console(file=StringIO(), width=200, force_terminal=True)
    render(*_evil_report(), console)
    out = console.file.getvalue()
    assert SGR.search(out)
    assert not RAW_CONTROLS & set(SGR.sub("", out)), repr(SGR.sub("", out))


def test_markup_in_job_text_prints_literally() -> None:
    frame = "/job/[link=https:evil]x[blink].py:[bold red]x[/]:3"
    snap = make_snapshot({0: [*TRUNK, frame], 1: AR}, notes=[Note("[blink]note[/blink]")])
    diagnosis = make_diagnosis(
        snap, summary="[bold red]x[/]", evidence=[Evidence("[i]e[/i]")], details={0: "[reverse]d[/reverse]"}
    )
    out = rendered(diagnosis, snap)
    assert "[bold red]x[/] ([link=https:evil]x[blink].py:3)" in out
    for text in ("[bold red]x[/]", "[blink]note[/blink]", "[i]e[/i]", "[reverse]d[/reverse]"):
        assert text in out, text


@pytest.mark.parametrize("filename", ["< >", "<>", "<", "", "/"])
def test_odd_file_names_render(filename: str) -> None:
    frames = [make_frame("train.py:main:1"), Frame("f", filename, 1), Frame("g", filename, 2)]
    snap = make_snapshot({0: frames, 1: frames})
    out = rendered(make_diagnosis(snap), snap)
    assert "f (" in out or "f ›" in out


def test_printable() -> None:
    assert printable("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert printable("\t\n\r\x00\x7f\x9b") == "\\t\\n\\r\\x00\\x7f\\x9b"
    assert printable("\u202e\u2066\u200f\u2028\ud800") == "\\u202e\\u2066\\u200f\\u2028\\ud800"
    assert printable("ünïcode ✓ …  [bold]") == "ünïcode ✓ …  [bold]"
