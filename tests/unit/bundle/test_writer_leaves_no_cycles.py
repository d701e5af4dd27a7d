"""Saving a bundle leaves no garbage for the cycle collector: a table and its compiled
``add`` refer to each other, and left so, a 100k-rank save's 2 million rows waited for a
collection (0.8 s of it) after the save returned, holding their memory meanwhile."""

from __future__ import annotations

import dataclasses
import gc

from support.factories import make_rank, make_snapshot

from hangdoc.bundle import snapshot_bytes, snapshot_to_dict

STACK = ["train.py:main:30", "torch/distributed/distributed_c10d.py:all_reduce:2501"]


def _cyclic_garbage(work) -> int:
    """How many objects ``work`` left that only the cycle collector frees (run once before,
    so that what the first save of a process caches, its codecs, is not counted)."""
    work()
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        work()
        return gc.collect()
    finally:
        if was:
            gc.enable()


def test_saving_leaves_nothing_for_the_cycle_collector() -> None:
    snapshot = make_snapshot(
        [make_rank(r, STACK, threads={"loader": ["threading.py:run:982"]}, env={"A": str(r)}) for r in range(16)]
    )
    assert _cyclic_garbage(lambda: snapshot_bytes(snapshot, compress=True)) == 0
    assert _cyclic_garbage(lambda: snapshot_to_dict(snapshot, schema_version=1)) == 0


def test_a_save_that_fails_midway_leaves_nothing_either() -> None:
    snapshot = make_snapshot([make_rank(0, STACK)])
    broken = dataclasses.replace(snapshot, ranks=(snapshot.ranks[0], object()))

    def save() -> None:
        try:
            snapshot_bytes(broken, compress=False)
        except Exception:  # noqa: BLE001 - any failure: the tables must still go
            pass

    assert _cyclic_garbage(save) == 0
