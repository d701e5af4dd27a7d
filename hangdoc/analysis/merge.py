"""Merge the ranks' stacks into one call-prefix tree with equivalence classes (as LLNL STAT).

``build_tree`` builds the tree once per diagnosis from *distinct* stacks: identical stacks
are interned first, so the work and the memory grow with the number of different stacks,
not with the number of ranks. It returns the frozen ``hangdoc.model.CallTree``, with its
classes, divergence points and outliers already computed; every reporter reads that value.
networkx, used here for the traversals, stays inside ``hangdoc.analysis``.
"""

from __future__ import annotations

from collections.abc import Mapping

import networkx as nx

from ..model import ROOT, CallTree, Frame, Stack, TreeNode


def build_tree(stacks_by_rank: Mapping[int, Stack]) -> CallTree:
    """The merged call tree of ``stacks_by_rank`` (global rank -> stack, outermost first).

    Children are kept in insertion order, which follows rank order, so output is stable.
    """
    distinct: dict[Stack, list[int]] = {}  # interned: each distinct stack -> its ranks
    for rank in sorted(stacks_by_rank):
        distinct.setdefault(stacks_by_rank[rank], []).append(rank)

    graph = nx.DiGraph()
    graph.add_node(ROOT, frame=None, depth=0, ranks=sorted(stacks_by_rank))
    child_of: dict[tuple[int, Frame], int] = {}
    for stack, ranks in distinct.items():
        node = ROOT
        for depth, frame in enumerate(stack, start=1):
            child = child_of.get((node, frame))
            if child is None:
                child = child_of[(node, frame)] = len(graph)
                graph.add_node(child, frame=frame, depth=depth, ranks=[])
                graph.add_edge(node, child)
            graph.nodes[child]["ranks"].extend(ranks)
            node = child

    nodes = tuple(
        TreeNode(n, a["frame"], tuple(sorted(a["ranks"])), a["depth"], tuple(graph.successors(n)))
        for n, a in graph.nodes(data=True)
    )
    classes = sorted(
        ((tuple(ranks), stack) for stack, ranks in distinct.items()),
        key=lambda item: (-len(item[0]), item[0]),
    )
    divergence = tuple(n for n in nx.dfs_preorder_nodes(graph, ROOT) if graph.out_degree(n) > 1)
    return CallTree(nodes, tuple(classes), divergence, _outliers(graph, nodes, divergence))


def _outliers(
    graph: nx.DiGraph, nodes: tuple[TreeNode, ...], divergence: tuple[int, ...]
) -> frozenset[int]:
    """Nodes on branches that hold a minority of the ranks at a divergence point."""
    outliers: set[int] = set()
    for div in divergence:
        sizes = {kid: len(nodes[kid].ranks) for kid in nodes[div].children}
        biggest = max(sizes.values())
        if sum(1 for size in sizes.values() if size == biggest) > 1:
            continue  # a tie: no side is the outlier
        for kid, size in sizes.items():
            if size < biggest:
                outliers.update(nx.dfs_preorder_nodes(graph, kid))
    return frozenset(outliers)
