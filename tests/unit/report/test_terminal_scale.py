"""The terminal report at 10,000 and 100,000 ranks: under 400 lines, the verdict and the
culprits named, rank sets as ranges with counts, the common trunk folded, one table row per
class of ranks past 32 ranks, per-node notes and alike evidence summarised; and each of
these on both sides of its threshold, so that a small report stays as it was."""

from __future__ import annotations

import dataclasses
import sys
from io import StringIO

import pytest
from rich.console import Console
from support.factories import make_diagnosis, make_frame, make_op, make_snapshot
from support.paths import REPO

from hangdoc.analysis.analyse import analyse
from hangdoc.analysis.merge import build_tree
from hangdoc.model import (
    Diagnosis,
    DistOp,
    Evidence,
    Frame,
    JobSnapshot,
    Note,
    NoteKind,
    RankAnalysis,
    RankProcess,
    RankSnapshot,
    RankSource,
    RankState,
    Sample,
    Stack,
    ThreadStack,
    Unreachable,
    Verdict,
)
from hangdoc.report.terminal import render

sys.path.insert(0, str(REPO / "bench"))
from synthetic import expected, synthetic_snapshot

BAR = 400  # lines: issue 14's bar for a 100,000-rank report


def rendered(diagnosis: Diagnosis, snapshot: JobSnapshot, width: int = 100) -> list[str]:
    console = Console(file=StringIO(), width=width, color_system=None)
    render(diagnosis, snapshot, console)
    return [line.rstrip() for line in console.file.getvalue().splitlines()]


def line_with(lines: list[str], needle: str) -> str:
    found = [line for line in lines if needle in line]
    assert found, f"{needle!r} not in the report"
    return found[0]


# --------------------------------------------------- synthetic jobs, analysed in full


@pytest.fixture(scope="module")
def straggler_10k() -> list[str]:
    snap = synthetic_snapshot(10_000, "straggler")
    return rendered(analyse(snap), snap)


@pytest.mark.parametrize("world", [10_000, 100_000])
def test_a_synthetic_mismatch_report_fits_and_names_the_culprits(world: int) -> None:
    snap = synthetic_snapshot(world, "collective_mismatch")
    diagnosis = analyse(snap)
    verdict, culprits = expected(world, "collective_mismatch")
    assert (diagnosis.verdict, diagnosis.culprit_ranks) == (verdict, culprits)
    lines = rendered(diagnosis, snap)
    assert len(lines) < BAR
    first, last = culprits[0], culprits[-1]
    assert lines[0] == (f"verdict: collective_mismatch   culprit ranks [{first}-{last}]   confidence: high")
    healthy = f"0-{first - 1},{last + 1}-{world - 1}"
    count = f"{world - 8:,}"
    # the tree: the culprits' branch first, marked; the majority after it, with its count
    marked = [line for line in lines if "◀" in line]
    assert marked == [line_with(lines, f"├── [{first}-{last}] on_train_batch_end (train.py:131)")]
    assert marked[0].endswith("◀ outlier, culprit")
    assert line_with(lines, f"└── [{healthy}] ({count})")
    # the table: one row a class, culprits first
    header = next(i for i, line in enumerate(lines) if line.startswith("ranks "))
    assert lines[header].split() == ["ranks", "┃", "count", "┃", "hosts", "┃", "state", "┃", "op", "┃", "call", "site"]
    assert lines[header + 2].split("│") == [
        f"[{first}-{last}] *".ljust(len(f"[{healthy}]") + 1),
        f" {'8'.rjust(len(count))} ",
        f" node{first // 8:05d}".ljust(len(f" {world // 8 - 1:,} hosts ")),
        " waiting ",
        " barrier    ",
        " train.py:140",
    ]
    row = lines[header + 3]
    assert row.startswith(f"[{healthy}] │ {count} │ {world // 8 - 1:,} hosts │ waiting │ all_reduce")
    assert lines[header + 4] == f"{world:,} ranks in 2 classes · * culprit"
    assert line_with(lines, f"job 10.0.0.1:29500 · {world:,} of {world:,} rank processes found")


def test_the_trunk_every_rank_shares_is_folded(straggler_10k: list[str]) -> None:
    lines = straggler_10k
    start = lines.index("Merged stacks of 10,000 ranks [0-9999], 2 distinct stacks")
    # 24 frames above the split in 6 lines: <module>, main, run, 17 lightning frames,
    # 3 torch frames, lightning's closure; the first and the two above the split are kept
    assert lines[start + 1 : start + 5] == [
        "└── <module> (train.py:212)",
        "    … 19 frames in common …",
        "    torch.optim.AdamW.step (torch/optim/adamw.py:220)",
        "    closure (lightning/pytorch/loops/optimization/automatic.py:146)",
    ]
    assert lines[start + 5].startswith("    ├── [5000] training_step (train.py:84)")
    assert lines[start + 5].endswith("◀ outlier, culprit")
    assert len(lines) < BAR


def test_the_straggler_has_a_class_row_and_its_detail_below(straggler_10k: list[str]) -> None:
    lines = straggler_10k
    assert line_with(lines, "[5000] *").split("│")[1:4] == ["     1 ", " node00625   ", " busy    "]
    assert line_with(lines, "[0-4999,5001-9999] │").startswith(
        "[0-4999,5001-9999] │ 9,999 │ 1,250 hosts │ waiting │ all_reduce │ train.py:64"
    )
    assert line_with(lines, "[5000] *: computing (240% of a core), not in any collective")


# ------------------------------------------ a 100,000-rank job to check by hand

WORLD = 100_000
PER_NODE = 8
CULPRITS = tuple(range(50_000, 50_008))  # node 6250
WAITS = [f"wait_{k}" for k in range(10)]  # the native frame a healthy rank spins in: rank % 10
TRUNK = [
    "<frozen runpy>:_run_module_as_main:198",
    "<frozen runpy>:_run_code:88",
    "train.py:<module>:60",
    "train.py:main:55",
    *(f"train.py:level{i}:{10 + i}" for i in range(8)),
    "train.py:train_loop:35",
]
STEP = make_frame("train.py:train_step:30", code="dist.all_reduce(loss)")
EVAL = make_frame("train.py:evaluate:48", code="dist.barrier()")
C10D = "torch/distributed/distributed_c10d.py"
AR = [*TRUNK, STEP, f"{C10D}:all_reduce:2800"]
BARRIER = [*TRUNK, EVAL, f"{C10D}:barrier:4100"]


def _stack(frames: list[str | Frame]) -> Stack:
    return tuple(make_frame(f) if isinstance(f, str) else f for f in frames)


def _job() -> tuple[Diagnosis, JobSnapshot]:
    """99,992 ranks in all_reduce, spinning in one of 10 native frames (``wait_<rank % 10>``),
    the 8 ranks of node 6250 in a barrier; one note per node listing its 2 workers."""
    healthy = [_stack([*AR, make_frame(f"libnccl.so:{w}", native=True)]) for w in WAITS]
    barrier = _stack(BARRIER)
    stacks = {r: barrier if r in CULPRITS else healthy[r % 10] for r in range(WORLD)}
    samples = {id(s): (Sample(t=0.0, threads=(ThreadStack(1, "MainThread", s, 1),)),) for s in [*healthy, barrier]}
    ranks = tuple(
        RankSnapshot(
            RankProcess(40_000 + r % PER_NODE, f"node{r // PER_NODE:05d}", r, RankSource.ENV), samples[id(stacks[r])]
        )
        for r in range(WORLD)
    )
    notes = [
        Note(
            WORKERS,
            NoteKind.NOT_RANKS,
            node=f"node{n:05d}",
            pids=(60_000 + n, 60_001 + n),
            listed=f"pid {60_000 + n} (child of rank {8 * n} (pid 40000)), {60_001 + n} (child of "
            f"rank {8 * n + 1} (pid 40001))",
        )
        for n in range(WORLD // PER_NODE)
    ]
    snap = JobSnapshot(
        spec="10.0.0.1:29500",
        ranks=ranks,
        world_size=WORLD,
        window_seconds=1.0,
        captured_at="2025-06-01T12:00:00Z",
        hangdoc_version="test",
        notes=(Note("window extended from 2.0 s to 4.0 s", NoteKind.WINDOW), *notes),
    )
    ar, bar = make_op("all_reduce", STEP), make_op("barrier", EVAL)

    def analysed(r: int, op: DistOp) -> RankAnalysis:
        return RankAnalysis(
            r, 40_000 + r % PER_NODE, f"node{r // PER_NODE:05d}", RankState.WAITING, op, "MainThread", None, ""
        )

    diagnosis = Diagnosis(
        verdict=Verdict.COLLECTIVE_MISMATCH,
        culprit_ranks=CULPRITS,
        summary="ranks 50000-50007 are in barrier (train.py:48) while ranks "
        "0-49999,50008-99999 are in all_reduce (train.py:30)",
        evidence=tuple(Evidence("is in barrier (train.py:48)", r) for r in CULPRITS),
        next_steps=("Make every rank issue the same collectives in the same order.",),
        ranks=tuple(analysed(r, bar if r in CULPRITS else ar) for r in range(WORLD)),
        groups=(),
        observed_seconds=1.0,
        tree=build_tree(stacks),
    )
    return diagnosis, snap


@pytest.fixture(scope="module")
def by_hand() -> list[str]:
    return rendered(*_job())


def test_the_hand_checked_report_fits(by_hand: list[str]) -> None:
    assert len(by_hand) < 60  # a screen: it was one table row and one note per node
    assert by_hand[0] == "verdict: collective_mismatch   culprit ranks [50000-50007]   confidence: low"


def test_the_hand_checked_tree(by_hand: list[str]) -> None:
    start = by_hand.index("Merged stacks of 100,000 ranks [0-99999], 11 distinct stacks")
    tree = by_hand[start + 1 : by_hand.index("", start)]
    # 13 trunk frames in 12 lines (the two runpy frames are one): the first line, then the
    # two above the split; hidden: <module>, main, level0-level6 (9 frames)
    assert tree[:4] == [
        "└── runpy: _run_module_as_main › _run_code (<frozen runpy>:88)",
        "    … 9 frames in common …",
        "    level7 (train.py:17)",
        "    train_loop (train.py:35)",
    ]
    assert tree[4] == "    ├── [50000-50007] evaluate (train.py:48)  dist.barrier()  ◀ outlier, culprit"
    assert tree[5] == "    │                 barrier (torch/distributed/distributed_c10d.py:4100)"
    assert tree[6] == "    └── [0-49999,50008-99999] (99,992)"
    assert tree[7].startswith("        train_step (train.py:30)  dist.all_reduce(loss)")
    # ten native waits under one Python frame: one place, so no outlier among them; past 8
    # branches, the 7 largest stay (wait_8 and wait_9 hold 10,000 ranks, the others 9,999:
    # wait_0 to wait_4 by lowest rank) and wait_5 to wait_7 fold into one line
    branches = [line for line in tree[8:] if "── " in line]
    shown = [line.split("] (")[0].split("── [")[1] for line in branches[:7]]
    assert shown == [
        "0,10,20,30,40,50,60,70,…",
        "1,11,21,31,41,51,61,71,…",
        "2,12,22,32,42,52,62,72,…",
        "3,13,23,33,43,53,63,73,…",
        "4,14,24,34,44,54,64,74,…",
        "8,18,28,38,48,58,68,78,…",
        "9,19,29,39,49,59,69,79,…",
    ]
    assert [line.split("(")[1].split(")")[0] for line in branches[:7]] == ["9,999"] * 5 + ["10,000"] * 2
    assert branches[7] == ("        └── … 3 more branches: ranks [5-7,15-17,25-27,35-37,…] (29,997) (all in --html)")
    assert not any("◀" in line for line in tree[6:])


def test_the_hand_checked_table_notes_and_evidence(by_hand: list[str]) -> None:
    assert line_with(by_hand, "[50000-50007] *  ").split("│") == [
        "[50000-50007] *       ",
        "      8 ",
        " node06250    ",
        " waiting ",
        " barrier    ",
        " train.py:48",
    ]
    assert line_with(by_hand, "[0-49999,50008-99999] │") == (
        "[0-49999,50008-99999] │ 99,992 │ 12,499 hosts │ waiting │ all_reduce │ train.py:30"
    )
    assert "100,000 ranks in 2 classes · * culprit" in by_hand
    assert "• rank 50000 is in barrier (train.py:48) (the same for 7 more ranks: 50001-50007)" in by_hand
    notes = " ".join(by_hand[by_hand.index("Notes") + 1 :])
    assert notes == (
        "• observed for 1.0 s over 1 sample • window extended from 2.0 s to 4.0 s • not counted "
        "as ranks (DataLoader/compile/multiprocessing workers): 25,000 processes on 12,500 "
        "nodes (node00000, node00001, …); --json lists every pid"
    )


# ----------------------------------------------------- both sides of each threshold

AR4 = ["train.py:main:5", f"{C10D}:all_reduce:2800"]


@pytest.mark.parametrize(("world", "per_rank"), [(32, True), (33, False)])
def test_one_row_a_rank_up_to_32_ranks_then_one_a_class(world: int, per_rank: bool) -> None:
    snap = make_snapshot({r: AR4 for r in range(world)})
    op = make_op("all_reduce", "train.py:main:5")
    lines = rendered(make_diagnosis(snap, ops={r: op for r in range(world)}), snap)
    table = lines[lines.index(line_with(lines, "┃")) :]
    if per_rank:
        assert table[0].startswith("rank ┃ host") and table[2].startswith("0 ")
        assert table[world + 1].startswith(f"{world - 1} ")
    else:
        assert table[0].startswith("ranks  ┃ count ┃ hosts")
        assert table[2] == "[0-32] │    33 │ node0 │ waiting │ all_reduce │ train.py:5"
        assert table[3] == "33 ranks in 1 classes"


WORKERS = "not counted as ranks (DataLoader/compile/multiprocessing workers)"


def said_notes(notes: list[Note]) -> list[str]:
    """The report's notes of ``notes`` (past the line on the window), at width 200."""
    snap = make_snapshot({0: AR4}, notes=notes)
    lines = rendered(make_diagnosis(snap), snap, width=200)
    return lines[lines.index("Notes") + 2 :]


@pytest.mark.parametrize(("nodes", "merged"), [(4, False), (5, True)])
def test_per_node_notes_merge_from_five_nodes(nodes: int, merged: bool) -> None:
    notes = [
        Note(
            WORKERS,
            NoteKind.NOT_RANKS,
            node=f"node{n}",
            pids=(900 + n,),
            listed=f"pid {900 + n} (child of rank {n} (pid {100 + n}))",
        )
        for n in range(nodes)
    ]
    said = said_notes(notes)
    if merged:
        assert said == [f"• {WORKERS}: 5 processes on 5 nodes (node0, node1, …); --json lists every pid"]
    else:
        assert said == [f"• {note.words()}" for note in notes]
        assert said[0] == f"• node0: {WORKERS}: pid 900 (child of rank 0 (pid 100))"


@pytest.mark.parametrize(("nodes", "merged"), [(4, False), (5, True)])
def test_processes_of_alike_notes_are_counted_from_their_pids(nodes: int, merged: bool) -> None:
    """Each node lists 2 processes (its words cut to the first and a count): the line for
    them all counts the pids the notes carry, never the words."""
    notes = [
        Note(
            WORKERS,
            NoteKind.NOT_RANKS,
            node=f"node{n}",
            pids=(900 + 2 * n, 901 + 2 * n),
            listed=f"pid {900 + 2 * n} (child of rank {n} (pid {100 + n})) and 1 more",
        )
        for n in range(nodes)
    ]
    said = said_notes(notes)
    if merged:
        assert said == [f"• {WORKERS}: 10 processes on 5 nodes (node0, node1, …); --json lists every pid"]
    else:
        assert said == [f"• node{n}: {WORKERS}: pid {900 + 2 * n} (child of rank {n} (pid {100 + n})) and 1 more"
                        for n in range(4)]  # fmt: skip


def test_notes_without_a_list_are_alike_by_their_kind_or_else_by_their_words() -> None:
    empty = [
        Note(
            f"no process has MASTER_ADDR=10.0.0.1 on node{n}:7420 (no rank there)",
            NoteKind.NO_RANK_THERE,
            f"node{n}:7420",
        )
        for n in range(5)
    ]
    assert said_notes(empty) == [
        "• no process has MASTER_ADDR=10.0.0.1 on node0:7420 (no rank there) "
        "(and alike on 4 more of 5 nodes (node0:7420, node1:7420, …))"
    ]
    assert len(said_notes(empty[:4])) == 4
    # a note of no kind is alike only where its words are the same
    same = [Note("ranks disagree on the world size: 4, 8", node=f"node{n}") for n in range(5)]
    assert said_notes(same) == [
        "• ranks disagree on the world size: 4, 8 (and alike on 4 more of 5 nodes (node0, node1, …))"
    ]
    other = [Note(f"ranks disagree on the world size: {n}, 8", node=f"node{n}") for n in range(5)]
    assert said_notes(other) == [f"• node{n}: ranks disagree on the world size: {n}, 8" for n in range(5)]
    # notes of no node (the job's own) are said as they are, however many
    assert (
        said_notes([Note("window extended from 2.0 s to 4.0 s", NoteKind.WINDOW)] * 5)
        == ["• window extended from 2.0 s to 4.0 s"] * 5
    )


@pytest.mark.parametrize(("alike", "merged"), [(4, False), (5, True)])
def test_evidence_said_of_one_rank_each_merges_from_five(alike: int, merged: bool) -> None:
    said = [Evidence("is on a cleanup path: teardown (ddp.py:432)", r) for r in range(alike)]
    snap = make_snapshot({0: AR4})
    diagnosis = make_diagnosis(snap, evidence=[Evidence("ranks 10-20 wait in all_reduce"), *said])
    lines = rendered(diagnosis, snap, width=200)
    bullets = lines[lines.index("Evidence") + 1 : lines.index("", lines.index("Evidence"))]
    if merged:
        assert bullets == [
            "• ranks 10-20 wait in all_reduce",
            ("• rank 0 is on a cleanup path: teardown (ddp.py:432) (the same for 4 more ranks: 1-4)"),
        ]
    else:
        assert bullets == ["• ranks 10-20 wait in all_reduce", *(f"• {s.words()}" for s in said)]
        assert bullets[1] == "• rank 0 is on a cleanup path: teardown (ddp.py:432)"


def test_evidence_is_cut_at_24_bullets() -> None:
    snap = make_snapshot({0: AR4})
    diagnosis = make_diagnosis(snap, evidence=[Evidence(f"fact {i}") for i in range(30)])
    lines = rendered(diagnosis, snap)
    bullets = lines[lines.index("Evidence") + 1 : lines.index("", lines.index("Evidence"))]
    assert len(bullets) == 24 and bullets[-1] == "• … and 7 more (--json lists them all)"


@pytest.mark.parametrize(("agents", "grouped"), [(8, False), (9, True)])
def test_unreachable_agents_group_by_reason_past_eight(agents: int, grouped: bool) -> None:
    down = [
        Unreachable(f"node{n}:7420", "deadline exceeded after 5.0 s", tuple(range(8 * n, 8 * n + 8)))
        for n in range(1, agents + 1)
    ]
    snap = make_snapshot({r: AR4 for r in range(8)}, unreachable=down, world_size=8 * (agents + 1))
    lines = rendered(make_diagnosis(snap), snap, width=200)
    listed = [line for line in lines if line.startswith("✗ ")]
    if grouped:
        assert listed == [
            ("✗ 9 agents (node1:7420, node2:7420, …): deadline exceeded after 5.0 s (ranks [8-79] (72) unknown)")
        ]
    else:
        assert listed[0] == "✗ node1:7420: deadline exceeded after 5.0 s (ranks [8-15] unknown)"
        assert len(listed) == 8


def test_a_long_rank_list_in_a_sentence_is_cut_with_its_count() -> None:
    scattered = ",".join(str(r) for r in range(0, 2000, 2))
    snap = make_snapshot({0: AR4})
    diagnosis = make_diagnosis(snap, summary=f"ranks {scattered} wait in all_reduce")
    lines = rendered(diagnosis, snap)
    assert lines[1].startswith("ranks 0,2,4,6,8,")
    assert lines[1].endswith(",… (1,000 ranks) wait in all_reduce")
    assert len(lines[1]) < 100


@pytest.mark.parametrize(
    "text",
    [
        "ranks " + ",".join(map(str, range(0, 80, 2))) + "x wait",  # no list: no part of it is cut
        "ranks_" + ",".join(map(str, range(0, 80, 2))) + " wait",
        "ranks " + ",".join(map(str, range(0, 80, 2))) + ".5 wait",
        "read 1,234,567,890,123,456,789,012,345,678,901,234,567,890,123,456,789 bytes",  # not rising
    ],
)
def test_what_is_no_whole_rank_list_is_never_cut(text: str) -> None:
    assert _summary(text) == text


def test_a_rank_list_is_cut_between_whole_items_and_counted_whole() -> None:
    ranges = ",".join(f"{r}-{r + 1}" for r in range(100_000, 100_300, 3))
    said = _summary(f"ranks {ranges}.")
    head, tail = said.removeprefix("ranks ").split(",…")
    assert tail == " (200 ranks)." and len(head) <= 60
    assert ranges.startswith(head + ",")  # cut at a comma, after a whole range


def _summary(text: str) -> str:
    snap = make_snapshot({0: AR4})
    return rendered(make_diagnosis(snap, summary=text), snap, width=1000)[1]


def test_a_small_tree_keeps_every_line_and_marks_the_outlier_once() -> None:
    # 5 trunk lines: shown whole; the outlier's own split is marked at its top only
    trunk = ["train.py:a:1", "train.py:b:2", "train.py:c:3", "train.py:d:4", "train.py:e:5"]
    inner = [*trunk, "train.py:save:9", f"{C10D}:broadcast:2900"]
    outer = [*trunk, "train.py:save:9", f"{C10D}:barrier:4100"]
    snap = make_snapshot({0: [*trunk, *AR4], 1: [*trunk, *AR4], 2: [*trunk, *AR4], 3: inner, 4: outer})
    lines = rendered(make_diagnosis(snap), snap)
    assert [line.strip(" └─") for line in lines[lines.index(line_with(lines, "Merged")) + 1 :][:5]] == [
        "a (train.py:1)",
        "b (train.py:2)",
        "c (train.py:3)",
        "d (train.py:4)",
        "e (train.py:5)",
    ]
    marked = [line for line in lines if "◀" in line]
    assert len(marked) == 1 and "[3-4] save (train.py:9)" in marked[0]


def test_the_majority_is_never_marked_even_when_split() -> None:
    # the 30 healthy ranks spin in 3 native frames under all_reduce: not odd ones out
    stacks = {r: [*AR4, make_frame(f"libc.so.6:wait{r % 3}", native=True)] for r in range(30)}
    stacks[30] = ["train.py:main:5", f"{C10D}:barrier:4100"]
    snap = make_snapshot(stacks)
    lines = rendered(dataclasses.replace(make_diagnosis(snap), culprit_ranks=(30,)), snap)
    marked = [line for line in lines if "◀" in line]
    assert len(marked) == 1 and "[30] barrier" in marked[0] and marked[0].endswith("culprit")


def test_a_tree_of_thousands_of_distinct_stacks_still_fits() -> None:
    # 6,000 ranks in 50 groups of 120, each split 40 ways below (2,000 distinct stacks), and
    # 6,000 more in group 0's first way: the majority; rank 0 alone at another line
    stacks = {
        r: [
            *TRUNK,
            f"train.py:group{r % 50}:{1 + (r == 0)}",
            f"train.py:inner{(r // 50) % 40}:3",
            f"{C10D}:all_reduce:2800",
        ]
        for r in range(6_000)
    }
    stacks.update(
        {r: [*TRUNK, "train.py:group0:1", "train.py:inner0:3", f"{C10D}:all_reduce:2800"] for r in range(6_000, 12_000)}
    )
    snap = make_snapshot({r: ["train.py:main:1"] for r in range(2)})  # the tree is what is read
    tree = build_tree({r: _stack(s) for r, s in stacks.items()})
    diagnosis = dataclasses.replace(make_diagnosis(snap), tree=tree)
    lines = rendered(diagnosis, snap)
    assert len(lines) < 200
    # 8 outlier branches at each split, the others on one line; the majority always shown
    assert sum("◀ outlier" in line for line in lines) == 16
    assert line_with(lines, "├── … 42 more outlier branches: ranks [8-49,58-99,108-149,…] (5,040)")
    assert line_with(lines, "└── [50,100,150,200,250,300,…] (6,119)")
    assert line_with(lines, "├── … 31 more outlier branches: ranks [450,500,550,600,650,700,…] (93)")
    assert line_with(lines, "└── [2000,4000,6000-11999] (6,002)")
