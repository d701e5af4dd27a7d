"""``build_tree`` at scale and its outliers: which branch is the odd one out, by the rule
in ``hangdoc.analysis.merge``'s docstring, on both sides of each of its clauses."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from support.factories import make_frame

from hangdoc.analysis.merge import build_tree, with_culprits
from hangdoc.model import ROOT, CallTree, Frame, Stack

TRUNK = ["train.py:<module>:60", "train.py:main:55"]
C10D = "torch/distributed/distributed_c10d.py"
AR = [*TRUNK, "train.py:step:30", f"{C10D}:all_reduce:2800"]
BAR = [*TRUNK, "train.py:evaluate:48", f"{C10D}:barrier:4100"]
POLL = [*TRUNK, "train.py:setup:20", f"{C10D}:_store_based_barrier:{{line}}"]


def stack(frames: list[str | Frame]) -> Stack:
    return tuple(make_frame(f) if isinstance(f, str) else f for f in frames)


def tree_of(stacks: dict[int, list[str | Frame]], culprits: Iterable[int] = ()) -> CallTree:
    return build_tree({rank: stack(frames) for rank, frames in stacks.items()}, tuple(culprits))


def marked(tree: CallTree) -> set[str]:
    """The functions that start an outlier branch (the top of each marked branch)."""
    parent = {kid: n.node_id for n in tree.nodes for kid in n.children}
    return {
        f.function for n in tree.outliers if parent[n] not in tree.outliers and (f := tree.node(n).frame) is not None
    }


def ranks_of(tree: CallTree, function: str) -> tuple[int, ...]:
    (node,) = [n for n in tree.nodes if n.frame is not None and n.frame.function == function]
    return node.ranks


# ------------------------------------------------------------------------- rule 1 and 2


def test_a_small_branch_elsewhere_is_an_outlier_and_the_majority_never_is() -> None:
    tree = tree_of({r: AR for r in range(9)} | {9: BAR})
    assert marked(tree) == {"evaluate"}
    assert ranks_of(tree, "step") == tuple(range(9))
    step = next(n for n in tree.nodes if n.frame is not None and n.frame.function == "step")
    assert step.node_id not in tree.outliers
    assert not tree.outliers & {n.node_id for n in tree.nodes if n.ranks == tuple(range(9))}


def test_the_majority_split_into_moments_of_one_wait_has_no_outlier() -> None:
    # 100 ranks polling the store, caught at three lines of the same loop: one place
    lines = {r: 4410 + 2 * (r % 3 == 1) + 5 * (r % 7 == 0) for r in range(100)}
    tree = tree_of({r: [*POLL[:-1], POLL[-1].format(line=line)] for r, line in lines.items()})
    assert len(tree.divergence) == 1 and len(tree.children(tree.divergence[0])) == 4
    assert tree.outliers == frozenset()


def test_native_frames_below_the_same_python_frame_are_one_place() -> None:
    waits = ["futex_wait", "pthread_cond_wait", "sched_yield"]
    stacks: dict[int, list[str | Frame]] = {
        r: [*AR, make_frame(f"libc.so.6:{waits[r % 3]}", native=True)] for r in range(30)
    }
    tree = tree_of(stacks)
    assert len(tree.children(tree.divergence[0])) == 3 and tree.outliers == frozenset()
    stacks[30] = [*BAR, make_frame("libc.so.6:futex_wait", native=True)]
    assert marked(tree_of(stacks)) == {"evaluate"}  # another Python place, whatever its C wait


def test_a_call_from_another_line_is_another_place() -> None:
    # rank 3 reached the same all_reduce from line 42 of main, the others from line 39
    wrapper = [*TRUNK[:1], "train.py:reduce_mean:25", f"{C10D}:all_reduce:3252"]
    stacks: dict[int, list[str | Frame]] = {r: [wrapper[0], "train.py:main:39", *wrapper[1:]] for r in range(3)}
    stacks[3] = [wrapper[0], "train.py:main:42", *wrapper[1:]]
    tree = tree_of(stacks)
    assert marked(tree) == {"main"}
    (top,) = [tree.node(n) for n in tree.outliers if tree.node(n).depth == 2]
    assert top.frame is not None and top.frame.line == 42 and top.ranks == (3,)


def test_an_outlier_branch_is_marked_whole_and_its_inner_splits_are_on_it() -> None:
    inner = [*BAR[:-1], "torch/distributed/distributed_c10d.py:broadcast:2900"]
    tree = tree_of({**{r: AR for r in range(10)}, 10: BAR, 11: BAR, 12: inner})
    evaluate = ranks_of(tree, "evaluate")
    assert evaluate == (10, 11, 12)
    on_it = {n.node_id for n in tree.nodes if n.ranks and set(n.ranks) <= {10, 11, 12}}
    assert tree.outliers == frozenset(on_it)
    assert marked(tree) == {"evaluate"}


# ----------------------------------------------------------------------------- rule 3


def test_the_culprit_branch_is_an_outlier_even_in_the_majority_place() -> None:
    # rank 5 is caught at another line of the polling loop: the same place, no outlier...
    stacks: dict[int, list[str | Frame]] = {r: [*POLL[:-1], POLL[-1].format(line=4410)] for r in range(5)}
    stacks[5] = [*POLL[:-1], POLL[-1].format(line=4415)]
    assert tree_of(stacks).outliers == frozenset()
    # ... unless the verdict names it
    tree = tree_of(stacks, culprits=[5])
    assert {tree.node(n).ranks for n in tree.outliers} == {(5,)}
    assert with_culprits(tree_of(stacks), [5]) == tree


def test_culprits_in_the_majority_branch_do_not_mark_it() -> None:
    tree = tree_of({r: AR for r in range(9)} | {9: BAR}, culprits=[0, 1])
    assert marked(tree) == {"evaluate"}


def test_a_tie_has_no_outlier_unless_one_side_holds_the_culprits() -> None:
    half = {r: AR for r in range(4)} | {r: BAR for r in range(4, 8)}
    assert tree_of(half).outliers == frozenset()
    assert marked(tree_of(half, culprits=range(4, 8))) == {"evaluate"}
    assert tree_of(half, culprits=[0, 7]).outliers == frozenset()  # culprits on both sides


# ------------------------------------------------------------------------------ cost


def test_trunk_nodes_share_one_rank_tuple() -> None:
    tree = tree_of({r: AR if r % 4 else BAR for r in range(1000)})
    module, main = tree.children(ROOT)[0], tree.children(tree.children(ROOT)[0].node_id)[0]
    assert module.ranks is tree.ranks and main.ranks is tree.ranks
    evaluate, step = tree.children(main.node_id)  # rank 0's branch first
    assert step.ranks is tree.children(step.node_id)[0].ranks
    assert evaluate.ranks == tuple(range(0, 1000, 4)) and len(step.ranks) == 750


def test_cost_grows_with_distinct_stacks_not_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    kinds = [stack(AR), stack(BAR), stack([*AR[:-1], f"{C10D}:broadcast:2900"])]
    # a fresh tuple per rank, of shared frames, as the analysis passes them
    stacks = {rank: tuple(kinds[rank % 3]) for rank in range(30_000)}
    hashed = 0
    real = Frame.__hash__

    def counting(self: Frame) -> int:
        nonlocal hashed
        hashed += 1
        return real(self)

    monkeypatch.setattr(Frame, "__hash__", counting)
    tree = build_tree(stacks)
    assert [len(ranks) for ranks, _ in tree.classes] == [10_000] * 3
    assert 0 < hashed <= 10 * sum(len(k) for k in kinds), hashed  # per distinct stack, not rank


def test_equal_stacks_of_different_frame_objects_are_one_class() -> None:
    a = stack(AR)
    b = tuple(Frame(f.function, f.filename, f.line, f.native, f.code) for f in a)
    assert a == b and all(x is not y for x, y in zip(a, b, strict=True))
    tree = build_tree({0: a, 1: b, 2: a, 3: stack(BAR)})
    assert tree.classes == (((0, 1, 2), a), ((3,), stack(BAR)))
    assert len(tree) == 1 + 2 + 2 + 2


def test_many_stacks_alike_at_both_ends_cost_no_comparison_per_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 1,000 stacks of one length, the same first and last frames, apart in the middle (a
    # forward caught at 1,000 lines): each rank is not compared with each of them
    ends = stack(AR)
    middles = [make_frame(f"model.py:forward:{line}") for line in range(1_000)]
    kinds = [(*ends[:-1], middle, ends[-1]) for middle in middles]
    stacks = {rank: tuple(kinds[rank % 1_000]) for rank in range(20_000)}
    compared = 0
    real = Frame.__eq__

    def counting(self: Frame, other: object) -> bool:
        nonlocal compared
        compared += 1
        return real(self, other)

    monkeypatch.setattr(Frame, "__eq__", counting)
    tree = build_tree(stacks)
    assert len(tree.classes) == 1_000 and {len(ranks) for ranks, _ in tree.classes} == {20}
    assert compared < 20_000, compared  # a few per distinct stack; it was one per rank and stack
