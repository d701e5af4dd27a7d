"""``build_tree``: the ranks' stacks merged into the frozen ``model.CallTree``."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import pytest
from support.factories import make_frame

from hangdoc.analysis.merge import build_tree
from hangdoc.model import ROOT, CallTree, Stack, TreeNode

TRUNK = ["train.py:<module>:60", "train.py:main:55"]
AR = [*TRUNK, "train.py:step:30", "torch/distributed/distributed_c10d.py:all_reduce:2800"]
BAR = [*TRUNK, "train.py:evaluate:48", "torch/distributed/distributed_c10d.py:barrier:4100"]
SAVE = [*TRUNK, "train.py:save:70", "torch/serialization.py:save:600"]


def stack(frames: list[str]) -> Stack:
    return tuple(make_frame(f) for f in frames)


def tree_of(stacks: dict[int, list[str]]) -> CallTree:
    return build_tree({rank: stack(frames) for rank, frames in stacks.items()})


def functions(tree: CallTree, node_ids: Iterable[int]) -> set[str]:
    return {f.function for n in node_ids if (f := tree.node(n).frame) is not None}


def test_the_tree_is_a_frozen_hashable_value() -> None:
    stacks = {0: AR, 1: AR, 2: BAR}
    tree = tree_of(stacks)
    assert tree == tree_of(stacks) and hash(tree) == hash(tree_of(stacks))
    assert tree != tree_of({0: AR, 1: BAR, 2: BAR})
    assert {tree: 1}[tree_of(stacks)] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        tree.nodes = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        tree.node(ROOT).ranks = ()  # type: ignore[misc]
    assert isinstance(tree.nodes, tuple) and all(isinstance(n, TreeNode) for n in tree.nodes)


def test_nodes_children_ranks_and_depth() -> None:
    tree = tree_of({2: BAR, 0: AR, 1: AR})
    root = tree.node(ROOT)
    assert root.frame is None and root.depth == 0 and root.ranks == (0, 1, 2) == tree.ranks
    assert [n.node_id for n in tree.nodes] == list(range(len(tree)))
    assert len(tree) == 1 + 2 + 2 + 2  # root, shared trunk, two branches of two
    (module,) = tree.children(ROOT)
    (main,) = tree.children(module.node_id)
    assert main.depth == 2 and main.ranks == (0, 1, 2)
    step, evaluate = tree.children(main.node_id)  # in rank order: rank 0's branch first
    assert step.frame is not None and step.frame.function == "step" and step.ranks == (0, 1)
    assert evaluate.frame is not None and evaluate.frame.function == "evaluate"
    assert evaluate.ranks == (2,) and evaluate.depth == 3
    assert tree.node(main.node_id).children == (step.node_id, evaluate.node_id)
    assert tree.children(tree.children(step.node_id)[0].node_id) == ()


def test_identical_stacks_are_interned() -> None:
    tree = tree_of({0: AR, 1: AR, 2: AR, 3: AR})
    assert len(tree) == 1 + len(AR)  # one path, however many ranks share it
    assert tree.classes == (((0, 1, 2, 3), stack(AR)),)
    assert tree.divergence_points() == () and tree.outliers == frozenset()


def test_classes_largest_first_then_lowest_rank() -> None:
    tree = tree_of({0: BAR, 1: AR, 2: AR, 3: SAVE, 4: AR, 5: BAR, 6: []})
    assert tree.classes == (
        ((1, 2, 4), stack(AR)),
        ((0, 5), stack(BAR)),
        ((3,), stack(SAVE)),
        ((6,), ()),
    )
    assert tree.ranks == tuple(range(7))


def test_divergence_points_and_outliers() -> None:
    tree = tree_of({0: AR, 1: AR, 2: AR, 3: BAR})
    (div,) = tree.divergence_points()
    assert div.frame is not None and div.frame.function == "main"
    assert functions(tree, tree.outliers) == {"evaluate", "barrier"}


def test_no_outlier_when_the_largest_branches_tie() -> None:
    tree = tree_of({0: AR, 1: BAR, 2: AR, 3: BAR, 4: SAVE})
    (div,) = tree.divergence_points()
    assert div.frame is not None and div.frame.function == "main"
    assert tree.outliers == frozenset()  # 2 against 2: no side is the odd one out


def test_divergence_points_in_depth_first_preorder() -> None:
    inner = [*AR[:-1], "torch/distributed/distributed_c10d.py:broadcast:2900"]
    tree = tree_of({0: AR, 1: AR, 2: AR, 3: inner, 4: BAR, 5: ["other.py:run:1"]})
    names = [n.frame.function if n.frame else "<root>" for n in tree.divergence_points()]
    assert names == ["<root>", "main", "step"]
    # at the root rank 5 is the minority, at main rank 4, under step rank 3
    assert functions(tree, tree.outliers) == {"run", "evaluate", "barrier", "broadcast"}


def test_an_empty_tree_is_just_the_root() -> None:
    tree = build_tree({})
    assert len(tree) == 1 and tree.ranks == () and tree.classes == ()
    assert tree.children(ROOT) == () and tree.divergence_points() == ()


def test_ten_thousand_ranks_with_three_stacks_make_a_small_tree() -> None:
    kinds = [stack(AR), stack(BAR), stack(SAVE)]
    tree = build_tree({rank: kinds[rank % 3] for rank in range(10_000)})
    assert len(tree) == 1 + 2 + 3 * 2  # the shared trunk once, three short branches
    assert [len(ranks) for ranks, _ in tree.classes] == [3334, 3333, 3333]
    assert tree.ranks == tuple(range(10_000))
    assert functions(tree, (n.node_id for n in tree.divergence_points())) == {"main"}
    assert functions(tree, tree.outliers) == {"evaluate", "barrier", "save"}
