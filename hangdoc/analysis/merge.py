"""Merge the ranks' stacks into one call-prefix tree with equivalence classes (as LLNL STAT).

``build_tree`` builds the tree once per diagnosis from *distinct* stacks, and every reporter
reads the frozen ``hangdoc.model.CallTree`` it returns, its classes, divergence points and
outliers already computed. networkx, used here for the traversals (over distinct call
prefixes, never over ranks), stays inside ``hangdoc.analysis``.

Cost. The work grows with the number of distinct stacks and their frames, not with the
number of ranks: ranks are grouped by stack first, by a cheap key (the stack's length and
its first and last frame objects, which the loader interns) and a tuple comparison that
stops at the first frame which is not the same object, so no frame is hashed per rank.
Rank sets stay sorted tuples, and one tuple is shared by every node of an unbranched
stretch (the trunk above the first divergence holds one tuple of every rank, not one per
frame); merging them at a divergence is one sort of already sorted runs.

Outliers. At a divergence point the *majority branch* is the child holding the most ranks
(there is none when two children tie for the most). Another child there is an *outlier*
when it is a minority branch whose ranks are somewhere else than the majority's, or which
holds a culprit:

1. the majority branch is never an outlier (however its ranks are split further down);
2. a minority branch is an outlier when one of its ranks' stacks ends in another *place*
   than every stack of the majority branch. A stack's place is its path down to its
   innermost Python frame, lines included (a call from another line is another place:
   ``f:39 -> all_reduce`` and ``f:42 -> all_reduce`` are a mismatch), except the line of that
   innermost frame, and without the native frames below it. Ranks that stand in the same
   function as the majority's, caught at another line of it (a polling loop, a forward
   sampled mid-way) or in another native frame under it (how a wait spins), are the
   majority's own, seen a moment apart, not odd ones out;
3. a branch holding a culprit rank (``culprits``, when the verdict is known) is an outlier
   unless it is the majority branch or every branch there holds culprits; without culprits
   a tie for the most ranks has no outlier (no side is the odd one out);
4. every node below an outlier branch is on it (``CallTree.outliers`` holds them all; the
   reports mark the top of the branch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from itertools import chain

import networkx as nx

from ..model import ROOT, CallTree, Frame, Stack, TreeNode


def build_tree(stacks_by_rank: Mapping[int, Stack], culprits: Collection[int] = ()) -> CallTree:
    """The merged call tree of ``stacks_by_rank`` (global rank -> stack, outermost first).

    Children are kept in the order of their lowest rank, so output is stable. ``culprits``,
    where given, make the branches holding them outliers (see the module's rule).
    """
    distinct = _distinct(stacks_by_rank)
    frames: list[Frame | None] = [None]
    depth = [0]
    children: list[list[int]] = [[]]
    ends: list[list[tuple[int, ...]]] = [[]]  # the rank sets of the classes ending at a node
    child_of: dict[tuple[int, Frame], int] = {}
    for stack, ranks in distinct:
        node = ROOT
        for level, frame in enumerate(stack, start=1):
            child = child_of.get((node, frame))
            if child is None:
                child = child_of[(node, frame)] = len(frames)
                frames.append(frame)
                depth.append(level)
                children.append([])
                ends.append([])
                children[node].append(child)
            node = child
        ends[node].append(ranks)

    # rank sets bottom-up (a child's id is above its parent's): a node with one source
    # shares its tuple, so an unbranched stretch holds one tuple, not one per frame
    ranks_of: list[tuple[int, ...]] = [()] * len(frames)
    for node in range(len(frames) - 1, -1, -1):
        parts = ends[node] + [ranks_of[kid] for kid in children[node]]
        if len(parts) == 1:
            ranks_of[node] = parts[0]
        elif parts:
            ranks_of[node] = tuple(sorted(chain.from_iterable(parts)))  # sorted runs: one merge
    nodes = tuple(TreeNode(n, frames[n], ranks_of[n], depth[n], tuple(children[n])) for n in range(len(frames)))
    classes = tuple(sorted(((ranks, stack) for stack, ranks in distinct),
                           key=lambda item: (-len(item[0]), item[0][0])))  # fmt: skip
    graph = _graph(nodes)
    divergence = _divergence(nodes, graph)
    return CallTree(nodes, classes, divergence, _outliers(nodes, divergence, culprits, graph))


def with_culprits(tree: CallTree, culprits: Collection[int]) -> CallTree:
    """``tree`` with its outliers found again knowing the verdict's ``culprits`` (rule 3)."""
    return dataclasses.replace(tree, outliers=_outliers(tree.nodes, tree.divergence, culprits))


def _distinct(stacks_by_rank: Mapping[int, Stack]) -> list[tuple[Stack, tuple[int, ...]]]:
    """Each distinct stack with its sorted ranks, in the order of their lowest rank.

    Stacks are bucketed by length and the identity of their first and last frames, then
    compared with ``==``, which for the same frame objects never calls ``Frame.__eq__``. A
    bucket of more than ``_CROWDED`` stacks (alike at both ends, apart in the middle) is
    keyed by the identity of every frame instead, so no rank is compared with many stacks.
    Equal stacks built from different (equal) frame objects meet in the final merge.
    """
    buckets: dict[tuple[int, int, int], list[tuple[Stack, list[int]]]] = {}
    crowded: dict[tuple[int, int, int], dict[tuple[int, ...], tuple[Stack, list[int]]]] = {}
    get = buckets.get
    for rank, stack in stacks_by_rank.items():
        key = (len(stack), id(stack[0]), id(stack[-1])) if stack else (0, 0, 0)
        entries = get(key)
        if entries is None:
            if key in crowded:
                by_ids = crowded[key]
                ids = tuple(map(id, stack))
                if ids in by_ids:
                    by_ids[ids][1].append(rank)
                else:
                    by_ids[ids] = (stack, [rank])
            else:
                buckets[key] = [(stack, [rank])]
            continue
        for seen, ranks in entries:
            if seen == stack:
                ranks.append(rank)
                break
        else:
            entries.append((stack, [rank]))
            if len(entries) > _CROWDED:
                crowded[key] = {tuple(map(id, seen)): (seen, ranks) for seen, ranks in entries}
                del buckets[key]
    by_stack: dict[Stack, list[int]] = {}
    found = chain(
        chain.from_iterable(buckets.values()), chain.from_iterable(by_ids.values() for by_ids in crowded.values())
    )
    for stack, ranks in found:  # one hash of each distinct stack object, not of each rank
        by_stack.setdefault(stack, []).extend(ranks)
    out = [(stack, tuple(sorted(ranks))) for stack, ranks in by_stack.items()]
    out.sort(key=lambda item: item[1][0])
    return out


_CROWDED = 8


def _graph(nodes: Sequence[TreeNode]) -> nx.DiGraph:
    """The tree's shape, a node per distinct call prefix (not per rank), for traversals."""
    graph = nx.DiGraph()
    graph.add_node(ROOT)
    graph.add_edges_from((node.node_id, kid) for node in nodes for kid in node.children)
    return graph


def _divergence(nodes: Sequence[TreeNode], graph: nx.DiGraph) -> tuple[int, ...]:
    """The nodes with more than one child, in depth-first preorder."""
    return tuple(n for n in nx.dfs_preorder_nodes(graph, ROOT) if len(nodes[n].children) > 1)


def _outliers(
    nodes: Sequence[TreeNode],
    divergence: Sequence[int],
    culprits: Collection[int] = (),
    graph: nx.DiGraph | None = None,
) -> frozenset[int]:
    """The nodes on outlier branches, by the rule in the module's docstring."""
    if not divergence:
        return frozenset()
    parent = [ROOT] * len(nodes)
    for node in nodes:
        for kid in node.children:
            parent[kid] = node.node_id
    # the place where each class's stack ends: the path down to its innermost Python frame,
    # that frame by function and file only (native frames below it: how it waits, not where)
    ended: dict[int, set[tuple[int, str, str]]] = {kid: set() for div in divergence for kid in nodes[div].children}
    for node in nodes:
        if len(node.ranks) <= sum(len(nodes[kid].ranks) for kid in node.children):
            continue  # no class ends here
        inner = node
        while inner.frame is not None and inner.frame.native:
            inner = nodes[parent[inner.node_id]]
        if inner.frame is None:
            inner = node  # no Python frame at all: the innermost native one stands for it
        frame = inner.frame
        place = (parent[inner.node_id], frame.function, frame.filename) if frame else (ROOT, "", "")
        up = node.node_id
        while up != ROOT:
            if up in ended:
                ended[up].add(place)
            up = parent[up]

    blamed = frozenset(culprits)
    graph = _graph(nodes) if graph is None else graph
    outliers: set[int] = set()
    for div in divergence:
        kids = nodes[div].children
        most = max(len(nodes[kid].ranks) for kid in kids)
        top = [kid for kid in kids if len(nodes[kid].ranks) == most]
        majority = top[0] if len(top) == 1 else None
        blamed_kids = {kid for kid in kids if not blamed.isdisjoint(nodes[kid].ranks)}
        if len(blamed_kids) == len(kids):
            blamed_kids = set()  # culprits on every side: none is the odd one out for them
        for kid in kids:
            if kid == majority or kid in outliers:
                continue
            elsewhere = majority is not None and not ended[kid] <= ended[majority]
            if elsewhere or kid in blamed_kids:
                outliers.update(nx.dfs_preorder_nodes(graph, kid))
    return frozenset(outliers)
