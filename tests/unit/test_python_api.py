"""The Python API (hangdoc/api.py, docs/python-api.md): the commands' path as functions.

``analyze`` gives the report ``hangdoc analyze --json`` prints, from a path or from the
text itself; ``diagnose`` checks its options as the CLI does before anything starts, and
diagnoses a real process; ``import hangdoc`` stays free of the heavy parts; the docs'
examples run and pass ``mypy --strict`` against the package as installed (``py.typed``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import report_schema
from support.paths import REPO, TESTS

import hangdoc
from hangdoc import api
from hangdoc.cli import build_parser, main
from hangdoc.errors import BundleError, DumpFileError, JobNotFound, UsageError
from hangdoc.model import RankState, Verdict
from hangdoc.pipeline import CaptureOptions

DOCS = REPO / "docs" / "python-api.md"
DEMO = TESTS / "data" / "demo_mismatch.json.gz"
TEXT_DUMP = TESTS / "data" / "dumps" / "mismatch_wrapper_two_callers.txt"
HEAVY = ("rich", "grpc", "networkx", "torch", "psutil", "sqlalchemy", "google.protobuf")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=REPO,
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY or m.startswith("google.protobuf"))


def test_import_hangdoc_stays_cheap() -> None:
    modules = _modules_after("import hangdoc")
    assert {m for m in modules if m.startswith("hangdoc")} == {"hangdoc", "hangdoc.heartbeat"}
    # the API module itself is light too: the heavy parts come with the first call
    modules = _modules_after("import hangdoc\nhangdoc.diagnose, hangdoc.analyze, hangdoc.Report")
    assert "hangdoc.api" in modules and _heavy(modules) == []
    assert "hangdoc.pipeline" not in modules


def test_the_package_names_the_api() -> None:
    assert hangdoc.diagnose is api.diagnose and hangdoc.analyze is api.analyze and hangdoc.Report is api.Report
    assert {"diagnose", "analyze", "Report", "report_schema"} <= set(hangdoc.__all__) <= set(dir(hangdoc))
    with pytest.raises(AttributeError, match="no attribute 'diagnosis'"):
        hangdoc.diagnosis  # type: ignore[attr-defined]  # noqa: B018


@pytest.mark.parametrize("source", [DEMO, TEXT_DUMP, TESTS / "data" / "flight" / "behind"], ids=lambda p: p.name)
def test_analyze_gives_the_report_analyze_json_prints(source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = hangdoc.analyze(source)
    assert main(["analyze", str(source), "--json", "--quiet"]) == 0
    assert capsys.readouterr().out == report.to_json() + "\n"
    assert hangdoc.analyze(str(source)).to_dict() == report.to_dict()  # a str path, the same
    assert json.loads(report.to_json(indent=None)) == report.to_dict()
    report_schema.check_report(report.to_dict())


def test_analyze_reads_the_text_itself() -> None:
    text = TEXT_DUMP.read_text()
    from_text, from_file = hangdoc.analyze(text), hangdoc.analyze(TEXT_DUMP)
    assert from_text.snapshot.spec == "<text> (py-spy dump text)"
    assert from_text.diagnosis.verdict is from_file.diagnosis.verdict is Verdict.COLLECTIVE_MISMATCH
    assert from_text.diagnosis.culprit_ranks == from_file.diagnosis.culprit_ranks == (3,)
    # a snapshot's JSON on one line is content too, and the same snapshot as the file
    one_line = json.dumps(json.loads(gzip.decompress(DEMO.read_bytes())))
    assert "\n" not in one_line
    assert hangdoc.analyze(one_line).to_dict() == hangdoc.analyze(DEMO).to_dict()


def test_the_report_is_frozen_and_saves_what_analyze_reads(tmp_path: Path) -> None:
    report = hangdoc.analyze(TEXT_DUMP)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.diagnosis = report.diagnosis  # type: ignore[misc]
    path = tmp_path / "hang.json.gz"
    report.save(path)
    assert path.read_bytes()[:2] == b"\x1f\x8b" and path.stat().st_mode & 0o777 == 0o600
    again = hangdoc.analyze(path)
    assert again.snapshot.ranks == report.snapshot.ranks
    assert again.to_dict() == report.to_dict()
    (tmp_path / "elsewhere").symlink_to(tmp_path / "target")
    with pytest.raises(BundleError):
        report.save(tmp_path / "elsewhere")  # never through a link, as --save


@pytest.mark.parametrize(
    ("source", "error", "needle"),
    [
        ("no/such/dump.txt", BundleError, "no/such/dump.txt"),
        ("neither a dump\nnor a snapshot\n", DumpFileError, "<text>: neither a hangdoc snapshot"),
        ("{not json", BundleError, "<text>"),
        (b"Process 1: python\n", UsageError, "neither a path nor the text"),
        (None, UsageError, "neither a path nor the text"),
    ],
)
def test_analyze_errors_are_hangdoc_errors(source: Any, error: type[Exception], needle: str) -> None:
    with pytest.raises(error) as raised:
        hangdoc.analyze(source)
    assert needle in str(raised.value) and "\n" not in str(raised.value)
    assert getattr(raised.value, "help", "")


# ------------------------------------------------------------------ diagnose


def _cli_defaults() -> dict[str, Any]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    diag = sub.choices["diagnose"]
    return {a.dest: a.default for a in diag._actions}


def test_diagnose_has_the_commands_defaults() -> None:
    import inspect

    keywords = {name: p.default for name, p in inspect.signature(hangdoc.diagnose).parameters.items()}
    cli = _cli_defaults()
    options = CaptureOptions()
    for name in ("window", "interval", "max_window", "native", "timeout"):
        assert keywords[name] == cli[name] == getattr(options, name), name
    assert keywords["include"] == tuple(cli["include"]) == options.include
    for name in ("agents", "hostfile", "token_file", "tls_cert", "tls_key", "tls_ca", "ray_address"):
        assert keywords[name] is None is cli[name], name
    assert keywords["keep_agents"] is cli["keep_agents"] is False
    assert all(p.kind is p.KEYWORD_ONLY for p in list(inspect.signature(hangdoc.diagnose).parameters.values())[1:])


@pytest.mark.parametrize(
    ("spec", "options", "needle"),
    [
        (4100, {}, "spec=4100"),
        ("pid:", {}, "pid:"),
        ("pid:1", {"window": -1}, "window=-1"),
        ("pid:1", {"window": float("nan")}, "window=nan"),
        ("pid:1", {"interval": 0}, "interval=0"),
        ("pid:1", {"timeout": "5"}, "timeout='5'"),
        ("pid:1", {"timeout": True}, "timeout=True"),
        ("pid:1", {"max_window": 1.0, "window": 5.0}, "max_window >= window"),
        ("pid:1", {"include": "server"}, "include='server'"),
        ("pid:1", {"include": ["ok"] * 17}, "at most 16 include"),
        ("pid:1", {"include": ["bad\x1bword"]}, "include:"),
        ("pid:1", {"agents": "node1:0"}, "agents:"),
        ("pid:1", {"agents": ["node1", 7]}, "agents="),
        ("pid:1", {"workers": ["Trainer*"]}, "for ray:JOB jobs"),
        ("ray:raysubmit_x", {"agents": "node1"}, "places its own agents"),
    ],
)
def test_bad_options_are_usage_errors_before_anything_starts(spec: Any, options: dict[str, Any], needle: str) -> None:
    with pytest.raises(UsageError) as raised:
        hangdoc.diagnose(spec, **options)
    assert needle in str(raised.value), str(raised.value)
    assert raised.value.exit_code == 2 and raised.value.help


def test_diagnose_an_unreadable_hostfile_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read hostfile"):
        hangdoc.diagnose("pid:1", hostfile=tmp_path / "nope")


def test_diagnose_a_job_that_is_not_there() -> None:
    with pytest.raises(JobNotFound) as raised:
        hangdoc.diagnose("pid:4194304", window=0.0, max_window=0.0)  # the largest pid Linux allows
    assert "4194304" in str(raised.value) and raised.value.exit_code == 3


def test_diagnose_a_real_rank() -> None:
    """A Python process with a rank in its environment, sampled by py-spy: the report of
    the capture, with the status lines on the way."""
    if shutil.which("py-spy") is None and not (Path(sys.executable).parent / "py-spy").exists():
        pytest.skip("py-spy is not installed")
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    code = "import time\nprint('ready', flush=True)\nwhile True:\n    time.sleep(1)\n"
    rank = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout is not None and rank.stdout.readline() == "ready\n"
        said: list[str] = []
        report = hangdoc.diagnose(f"pid:{rank.pid}", window=0.5, interval=0.25, max_window=1.0, progress=said.append)
    finally:
        rank.kill()
        rank.wait()
        if rank.stdout is not None:
            rank.stdout.close()
    assert any("found 1 rank" in line for line in said), said
    (only,) = report.diagnosis.ranks
    assert (only.rank, only.pid) == (0, rank.pid)
    assert only.state in (RankState.BLOCKED, RankState.BUSY, RankState.PROGRESSING)
    assert report.snapshot.spec == f"pid:{rank.pid}" and report.snapshot.ranks[0].samples
    report_schema.check_report(report.to_dict())


# ------------------------------------------------------------------ the docs' examples

FENCE = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def _examples() -> list[str]:
    return FENCE.findall(DOCS.read_text())


def test_the_docs_examples_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In order, in one namespace, as a reader would paste them; an example that needs a
    running job defines what it runs (a function) and is only compiled."""
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "python_api_docs"}
    examples = _examples()
    assert len(examples) >= 4
    for example in examples:
        exec(compile(example, str(DOCS), "exec"), namespace)  # noqa: S102
    assert "why_stuck" in namespace
    out = capsys.readouterr().out
    assert "collective mismatch" in out.lower() and "no-such-dump.txt" in out


def test_the_docs_examples_pass_mypy_strict_against_the_installed_package(tmp_path: Path) -> None:
    """As a user's type checker sees hangdoc: a package on the path, typed by its py.typed."""
    pytest.importorskip("mypy", reason="mypy is not installed (the dev extra)")
    site = tmp_path / "site"
    site.mkdir()
    (site / "hangdoc").symlink_to(REPO / "hangdoc")
    script = tmp_path / "user.py"
    script.write_text("\n\n".join(_examples()) + "\n")
    wrong = tmp_path / "wrong.py"
    wrong.write_text("import hangdoc\n\nverdict: str = hangdoc.analyze('x').diagnosis.verdict\n")
    # jsonschema, which one example uses, ships no type hints (a user would say so too)
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\nstrict = True\n\n[mypy-jsonschema.*]\nignore_missing_imports = True\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    command = [sys.executable, "-m", "mypy", "--config-file", str(config), "--cache-dir", str(tmp_path / "cache")]
    command += ["--python-executable", sys.executable, "--no-error-summary"]
    done = subprocess.run(
        [*command, str(script)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # and the check has teeth: a wrong type is found
    done = subprocess.run(
        [*command, str(wrong)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path, check=False
    )
    assert done.returncode == 1 and 'has type "Verdict"' in done.stdout, done.stdout + done.stderr
