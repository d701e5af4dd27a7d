"""Where a frame comes from is read from the installation's layout, never from substrings.

The same recorded hang must get the same verdict and culprits whatever directory the job
was checked out in: ``~/nanotorch/`` and ``lightning/pytorch/`` contain ``torch/`` as a
substring, and a substring test once turned a cleanup deadlock into a mismatch there.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.harness import JOBS_DIR, load_meta
from support.paths import TESTS
from support.relocate import moved_under

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot
from hangdoc.capture.read.source import keeps_source
from hangdoc.model import Frame, Origin, frame_origin

RECORDED = sorted((TESTS / "snapshots").glob("*.json.gz"))
SITE = "/venv/lib/python3.11/site-packages"


@pytest.mark.parametrize(
    ("path", "kind", "package", "module_path"),
    [
        (
            f"{SITE}/torch/distributed/distributed_c10d.py",
            Origin.TORCH,
            "torch",
            "torch/distributed/distributed_c10d.py",
        ),
        ("/usr/lib/python3/dist-packages/torch/_tensor.py", Origin.TORCH, "torch", "torch/_tensor.py"),
        (
            "/opt/conda/lib/python3.13t/site-packages/torch/nn/parallel/distributed.py",
            Origin.TORCH,
            "torch",
            "torch/nn/parallel/distributed.py",
        ),
        # a source checkout of torch (pip install -e): torch's own top-level modules say so
        (
            "/src/pytorch/torch/distributed/distributed_c10d.py",
            Origin.TORCH,
            "torch",
            "torch/distributed/distributed_c10d.py",
        ),
        (
            f"{SITE}/lightning/pytorch/trainer/trainer.py",
            Origin.LIBRARY,
            "lightning",
            "lightning/pytorch/trainer/trainer.py",
        ),
        (f"{SITE}/deepspeed/comm/comm.py", Origin.LIBRARY, "deepspeed", "deepspeed/comm/comm.py"),
        (f"{SITE}/six.py", Origin.LIBRARY, "six", "six.py"),
        ("/usr/lib/python3.11/threading.py", Origin.STDLIB, "", "threading.py"),
        ("/usr/local/lib64/python3.12/multiprocessing/spawn.py", Origin.STDLIB, "", "multiprocessing/spawn.py"),
        # checkouts whose path merely contains "torch" are the user's
        ("/home/u/nanotorch/train.py", Origin.USER, "", "/home/u/nanotorch/train.py"),
        ("/home/u/lightning/pytorch/train.py", Origin.USER, "", "/home/u/lightning/pytorch/train.py"),
        ("/home/u/torch/train.py", Origin.USER, "", "/home/u/torch/train.py"),
        ("/home/u/lib/python3.11-notes/train.py", Origin.USER, "", "/home/u/lib/python3.11-notes/train.py"),
        ("train.py", Origin.USER, "", "train.py"),
        ("<frozen runpy>", Origin.INTERNAL, "", ""),
        ("<string>", Origin.INTERNAL, "", ""),
    ],
)
def test_origin_from_the_layout(path: str, kind: Origin, package: str, module_path: str) -> None:
    origin = frame_origin(path)
    assert (origin.kind, origin.package, origin.module_path) == (kind, package, module_path)


def test_native_frames_are_internal_and_sources_kept_for_job_and_libraries() -> None:
    assert Frame("ncclAllReduce", f"{SITE}/torch/lib/libtorch.so", native=True).origin.kind is Origin.INTERNAL
    assert keeps_source("/home/u/nanotorch/train.py")
    assert keeps_source(f"{SITE}/lightning/pytorch/trainer/trainer.py")  # its finally: is cleanup too
    assert not keeps_source(f"{SITE}/torch/distributed/distributed_c10d.py")
    assert not keeps_source("/usr/lib/python3.11/threading.py")
    assert not keeps_source("<string>")


@pytest.mark.parametrize("root", ["/home/u/nanotorch", "/srv/lightning/pytorch/examples"])
@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name.removesuffix(".json.gz"))
def test_the_checkout_directory_does_not_change_the_verdict(path: Path, root: str) -> None:
    meta = load_meta(JOBS_DIR / path.name.replace(".json.gz", ".py"))
    moved = analyse(moved_under(load_snapshot(path), root))
    assert moved.verdict.value == meta.verdict, moved.summary
    assert list(moved.culprit_ranks) == sorted(meta.culprits), moved.summary
