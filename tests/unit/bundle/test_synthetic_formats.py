"""A synthetic job saved in both bundle formats (``bench/synthetic.py --schema-version``,
what ``bench/bench_scale.py --v1`` times) loads to the same JSON report."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from support.paths import REPO

from hangdoc.analysis.analyse import analyse
from hangdoc.bundle import load_snapshot
from hangdoc.report.json_report import dumps, to_json_dict

sys.path.insert(0, str(REPO / "bench"))
from synthetic import expected, main  # noqa: E402


def report(path: Path) -> str:
    snapshot = load_snapshot(path)
    return dumps(to_json_dict(analyse(snapshot), snapshot))


def test_both_formats_give_the_same_report(tmp_path: Path) -> None:
    first, second = tmp_path / "v1.json.gz", tmp_path / "v2.json.gz"
    args = ["--ranks", "96", "--scenario", "collective_mismatch", "--out"]
    assert main([*args, str(first), "--schema-version", "1"]) == 0
    assert main([*args, str(second)]) == 0
    assert json.loads(gzip.decompress(first.read_bytes()))["schema_version"] == 1
    assert json.loads(gzip.decompress(second.read_bytes()))["schema_version"] == 2
    text = report(first)
    assert text == report(second)
    verdict, culprits = expected(96, "collective_mismatch")
    said = json.loads(text)
    assert (said["verdict"], tuple(said["culprit_ranks"])) == (verdict.value, culprits)
