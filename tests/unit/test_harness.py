"""The corpus harness itself: the job headers it reads. Launching and killing jobs under
every mode is tested in ``tests/live/test_harness_live.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.harness import JOBS_DIR, corpus, load_meta
from support.tinyjob import write_job


def test_load_meta_defaults_and_optional_keys(tmp_path: Path) -> None:
    meta = load_meta(write_job(tmp_path, "mode=direct nproc=3 world=4 ranks=0,1,3 ready=0,1"))
    assert (meta.verdict, meta.culprits, meta.mode) == ("not_hung", (), "direct")
    assert (meta.nproc, meta.world, meta.ranks, meta.ready) == (3, 4, (0, 1, 3), (0, 1))
    assert (meta.spec, meta.cut, meta.settle) == ("port", False, 1.0)


def test_load_meta_rejects_inconsistent_header(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="spec=pid needs a launcher"):
        load_meta(write_job(tmp_path, "mode=direct nproc=2 spec=pid"))


def test_corpus_headers_parse() -> None:
    metas = corpus()
    assert all(meta.path.parent == JOBS_DIR for meta in metas)
    assert all(len(meta.ready) >= 1 for meta in metas)
    assert len({meta.name for meta in metas}) == len(metas)
