"""The CLI through ``main([...])``: exit codes, one-line errors, --json on stdout only."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from factories import make_rank, make_snapshot

from hangdoc.bundle import save_snapshot
from hangdoc.cli import main

C10D = "torch/distributed/distributed_c10d.py"


def mismatch_snapshot():
    site = lambda op, where: ["train.py:<module>:9", where, f"{C10D}:{op}:2800"]
    return make_snapshot(
        [make_rank(r, site("all_gather", "metrics.py:log:12")) for r in (0, 1, 2)]
        + [make_rank(3, site("all_reduce", "model.py:sync:88"))]
    )


def test_analyze_json_replays_verdict(tmp_path, capsys) -> None:
    path = tmp_path / "hang.json"
    save_snapshot(mismatch_snapshot(), path)
    assert main(["analyze", str(path), "--json"]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert report["verdict"] == "collective_mismatch"
    assert report["culprit_ranks"] == [3]
    assert out.err == ""


def test_analyze_terminal_report(tmp_path, capsys) -> None:
    path = tmp_path / "hang.json.gz"
    save_snapshot(mismatch_snapshot(), path)
    assert main(["analyze", str(path), "--width", "120"]) == 0
    text = capsys.readouterr().out
    assert "collective_mismatch" in text and "model.py:88" in text


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["diagnose", "nonsense"], 2, "HOST:PORT"),
        (["diagnose", "pid:999999999"], 3, "999999999"),
        (["diagnose", "127.0.0.1:1"], 3, "MASTER_PORT=1"),
        (["diagnose", "pid:1", "--window", "5", "--max-window", "1"], 2, "--max-window"),
    ],
)
def test_bad_input_is_one_line_error(argv, code, needle, capsys) -> None:
    assert main(argv) == code
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first.startswith("hangdoc: error:") and needle in err
    assert "Traceback" not in err


def test_corrupt_bundle(tmp_path, capsys) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"kind": "hangdoc-snapshot", "schema_version": 1, "snap')
    assert main(["analyze", str(path)]) == 6
    err = capsys.readouterr().err
    assert "bad.json" in err and "Traceback" not in err


def test_non_python_process_is_reported_not_crashed(capsys) -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        code = main(["diagnose", f"pid:{sleeper.pid}", "--json"])
        err = capsys.readouterr().err
        assert code == 3 and "Traceback" not in err
    finally:
        sleeper.kill()
        sleeper.wait()


def test_module_entry_point_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "hangdoc", "--version"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0 and out.stdout.startswith("hangdoc ")
