"""The merged tree a diagnosis carries marks the branches of its culprits (merge's rule 3),
also where the stacks alone would not: the outliers are found again once the verdict is
known, after every source of evidence has had its say."""

from __future__ import annotations

from pathlib import Path

from hangdoc.analysis import merge
from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot
from hangdoc.model import Verdict

SNAPSHOTS = Path(__file__).resolve().parents[2] / "snapshots"


def _on_outliers(tree, outliers: frozenset[int] | set[int]) -> set[int]:
    """The ranks on some outlier branch."""
    return {r for n in outliers for r in tree.node(n).ranks}


def test_pipeline_culprits_are_on_outlier_branches() -> None:
    # ranks 1 and 3 stand in the same function as the majority, one line apart (a pipeline
    # stage's send and the receive beside it): by place alone only one side is marked
    diagnosis = analyse(load_snapshot(SNAPSHOTS / "mismatch_pipeline_short_last_batch_p2p.json.gz"))
    assert diagnosis.verdict is Verdict.COLLECTIVE_MISMATCH
    assert diagnosis.culprit_ranks == (1, 3)
    tree = diagnosis.tree
    assert tree is not None
    by_place = merge._outliers(tree.nodes, tree.divergence, ())
    assert not {1, 3} <= _on_outliers(tree, by_place)  # what the tree said before the verdict
    assert {1, 3} <= _on_outliers(tree, tree.outliers)
    assert set(by_place) < set(tree.outliers)  # the place rule's marks all stay


def test_no_culprit_leaves_the_tree_as_built() -> None:
    diagnosis = analyse(load_snapshot(SNAPSHOTS / "nccl_timeout_grad_bucket_netsplit.json.gz"))
    assert not diagnosis.culprit_ranks
    tree = diagnosis.tree
    assert tree is not None
    assert tree.outliers == merge._outliers(tree.nodes, tree.divergence, ())
