"""``hangdoc analyze`` of a first-format bundle large enough for its load to be slow says,
once and on one line, that ``--save`` converts it; ``first.declared_version`` tells the
format by the file's first bytes."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest
from support.paths import REPO

from hangdoc.bundle import first, snapshot_to_dict
from hangdoc.cli import main

sys.path.insert(0, str(REPO / "bench"))
from synthetic import synthetic_snapshot  # noqa: E402

RANKS = 32  # the notice's threshold is lowered to this here


def bundle(tmp_path: Path, ranks: int, version: int, name: str = "hang.json.gz") -> Path:
    path = tmp_path / name
    path.write_bytes(gzip.compress(json.dumps(snapshot_to_dict(synthetic_snapshot(ranks), version)).encode()))
    return path


def notices(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    assert main(["analyze", *args]) == 0
    return [line for line in capsys.readouterr().err.splitlines() if "first format" in line]


@pytest.fixture(autouse=True)
def lower_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(first, "NOTICE_RANKS", RANKS)


def test_a_large_first_format_bundle_is_told_to_convert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = bundle(tmp_path, RANKS, 1)
    said = notices(capsys, str(path), "--json")
    assert said == [
        f"hangdoc: {path} is a snapshot in the first format, which loads {first.SLOWER} times slower "
        f"than the current one: `hangdoc analyze {path} --save NEW.json.gz` converts it"
    ]
    assert notices(capsys, str(path)) == said  # the terminal report too, once


def test_below_the_threshold_nothing_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert notices(capsys, str(bundle(tmp_path, RANKS - 8, 1)), "--json") == []


def test_the_current_format_is_not_told(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert notices(capsys, str(bundle(tmp_path, RANKS, 2)), "--json") == []


def test_quiet_or_converting_says_nothing_of_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = bundle(tmp_path, RANKS, 1)
    assert notices(capsys, str(path), "--json", "-q") == []
    assert notices(capsys, str(path), "--json", "--save", str(tmp_path / "new.json.gz")) == []
    assert first.declared_version(tmp_path / "new.json.gz") == 2


def test_the_numbers_said_are_measured_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    # the measurements behind them are written where they are set (bundle/first.py)
    monkeypatch.undo()  # the threshold as shipped
    assert first.SLOWER >= 2
    assert first.LOAD_US_PER_RANK * first.NOTICE_RANKS >= 500_000  # half a second or more


def test_declared_version(tmp_path: Path) -> None:
    assert first.declared_version(bundle(tmp_path, 24, 1, "a.json.gz")) == 1
    assert first.declared_version(bundle(tmp_path, 24, 2, "b.json.gz")) == 2
    plain = tmp_path / "c.json"
    plain.write_text(json.dumps(snapshot_to_dict(synthetic_snapshot(24), 1), indent=2))
    assert first.declared_version(plain) == 1
    late = tmp_path / "d.json"  # further than the first 64 KiB: not looked for
    late.write_text(json.dumps({"kind": "hangdoc-snapshot", "pad": "x" * 70_000, "schema_version": 1}))
    assert first.declared_version(late) is None
    for odd in (b"", b"not json", b"[1, 2]", b'{"schema_version": "1"}', b"\x1f\x8b\x08 broken gzip"):
        (tmp_path / "odd").write_bytes(odd)
        assert first.declared_version(tmp_path / "odd") is None
    assert first.declared_version(tmp_path) is None  # a directory
    assert first.declared_version(tmp_path / "missing") is None
