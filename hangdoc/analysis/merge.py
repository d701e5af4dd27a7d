"""Merge the ranks' stacks into one call-prefix tree with equivalence classes (as LLNL STAT).

The tree is built once per diagnosis from *distinct* stacks: identical stacks are interned
first, so memory grows with the number of different stacks, not with the number of ranks.
Every reporter reads this one tree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import networkx as nx

from ..model import Frame, Stack

ROOT = 0


@dataclass(frozen=True, slots=True)
class TreeNode:
    """A node of the merged tree: one frame reached by a set of ranks."""

    node_id: int
    frame: Frame | None  # None for the root
    ranks: tuple[int, ...]
    depth: int


class CallTree:
    """A prefix tree over ranks' stacks, backed by a ``networkx.DiGraph``.

    Node attributes: ``frame`` (``Frame`` or None at the root), ``ranks`` (sorted tuple of
    global ranks through this node), ``depth``. Children are kept in insertion order,
    which follows rank order, so output is stable.
    """

    def __init__(self, stacks_by_rank: Mapping[int, Stack]) -> None:
        self.graph = nx.DiGraph()
        self.graph.add_node(ROOT, frame=None, ranks=tuple(sorted(stacks_by_rank)), depth=0)
        # intern identical stacks: distinct stack -> ranks
        distinct: dict[Stack, list[int]] = {}
        for rank in sorted(stacks_by_rank):
            distinct.setdefault(stacks_by_rank[rank], []).append(rank)
        self.stack_ranks: dict[Stack, tuple[int, ...]] = {s: tuple(r) for s, r in distinct.items()}
        children: dict[tuple[int, Frame], int] = {}
        ranks_at: dict[int, list[int]] = {}
        next_id = 1
        for stack, ranks in self.stack_ranks.items():
            node = ROOT
            for depth, frame in enumerate(stack, start=1):
                child = children.get((node, frame))
                if child is None:
                    child = next_id
                    next_id += 1
                    children[(node, frame)] = child
                    self.graph.add_node(child, frame=frame, depth=depth)
                    self.graph.add_edge(node, child)
                    ranks_at[child] = []
                ranks_at[child].extend(ranks)
                node = child
        for node_id, through in ranks_at.items():
            self.graph.nodes[node_id]["ranks"] = tuple(sorted(through))

    # ------------------------------------------------------------------ reading

    def node(self, node_id: int) -> TreeNode:
        attrs = self.graph.nodes[node_id]
        return TreeNode(node_id, attrs["frame"], attrs["ranks"], attrs["depth"])

    def children(self, node_id: int) -> list[TreeNode]:
        return [self.node(c) for c in self.graph.successors(node_id)]

    @property
    def ranks(self) -> tuple[int, ...]:
        return self.graph.nodes[ROOT]["ranks"]

    def classes(self) -> list[tuple[tuple[int, ...], Stack]]:
        """Equivalence classes: (ranks, stack), largest class first, then by lowest rank."""
        return sorted(
            ((ranks, stack) for stack, ranks in self.stack_ranks.items()),
            key=lambda item: (-len(item[0]), item[0]),
        )

    def divergence_points(self) -> list[TreeNode]:
        """Nodes where ranks split into different branches (STAT's first places to look)."""
        return [
            self.node(n)
            for n in nx.dfs_preorder_nodes(self.graph, ROOT)
            if self.graph.out_degree(n) > 1
        ]

    def outlier_nodes(self) -> set[int]:
        """Nodes on branches that hold a minority of the ranks at a divergence point."""
        outliers: set[int] = set()
        for div in self.divergence_points():
            kids = self.children(div.node_id)
            biggest = max(len(k.ranks) for k in kids)
            if sum(1 for k in kids if len(k.ranks) == biggest) > 1:
                continue  # a tie: no side is the outlier
            for kid in kids:
                if len(kid.ranks) < biggest:
                    outliers.update(nx.dfs_preorder_nodes(self.graph, kid.node_id))
        return outliers

    def __len__(self) -> int:
        return self.graph.number_of_nodes()
