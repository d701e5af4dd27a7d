"""The CLI through ``main([...])``: exit codes, one-line errors, --json on stdout only."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys

import pytest
from support.factories import make_rank, make_snapshot

from hangdoc import SCHEMA_VERSION, __version__, bundle
from hangdoc.bundle import save_snapshot, snapshot_to_dict
from hangdoc.cli import main
from hangdoc.model import Frame, Note, NoteKind

C10D = "torch/distributed/distributed_c10d.py"


def mismatch_snapshot():
    def site(op: str, where: str) -> list[str]:
        return ["train.py:<module>:9", where, f"{C10D}:{op}:2800"]

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


def test_analyze_save_writes_a_first_format_bundle_in_the_current_one(tmp_path, capsys) -> None:
    old, new = tmp_path / "old.json", tmp_path / "new.json.gz"
    old.write_text(json.dumps(snapshot_to_dict(mismatch_snapshot(), schema_version=1)))
    assert main(["analyze", str(old), "--json", "--save", str(new)]) == 0
    out = capsys.readouterr()
    assert f"snapshot saved to {new}" in out.err
    saved = json.loads(gzip.decompress(new.read_bytes()))
    assert saved["schema_version"] == bundle.BUNDLE_SCHEMA_VERSION == 2
    assert main(["analyze", str(new), "--json"]) == 0
    assert capsys.readouterr().out == out.out  # the same report from the converted file


def test_analyze_save_to_a_folder_that_does_not_exist_fails_before_reading(tmp_path, capsys) -> None:
    path = tmp_path / "hang.json"
    save_snapshot(mismatch_snapshot(), path)
    assert main(["analyze", str(path), "--save", str(tmp_path / "nowhere" / "x.json")]) != 0
    err = capsys.readouterr().err
    assert "cannot write snapshot" in err and len(err.strip().splitlines()) <= 3


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
        (["diagnose", "pid:4194304"], 3, "4194304"),  # the largest pid Linux allows: none
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
    out = subprocess.run(
        [sys.executable, "-m", "hangdoc", "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0 and out.stdout.startswith("hangdoc ")


# ------------------------------------------------------------------ bad input, all of it


def _one_error(capsys, code: int, argv: list[str], needle: str = "") -> str:
    """Run ``main(argv)``: exit ``code``, stderr one error line (then its help line), no
    traceback, nothing on stdout. Returns the error line."""
    assert main(argv) == code
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert lines and lines[0].startswith("hangdoc: error: "), out.err
    assert len(lines) <= 2 and all(line.startswith("  help: ") for line in lines[1:]), out.err
    assert "Traceback" not in out.err and "usage:" not in out.err
    assert out.out == ""
    assert needle in lines[0], lines[0]
    return lines[0]


NUMERIC = (
    [(["diagnose", "pid:1", "--timeout", value], "--timeout") for value in ("inf", "nan", "-5", "0")]
    + [(["diagnose", "pid:1", "--interval", value], "--interval") for value in ("inf", "nan", "0")]
    + [
        (["diagnose", "pid:1", "--window", "nan"], "--window"),
        (["diagnose", "pid:1", "--window", "-1"], "--window"),
        (["diagnose", "pid:1", "--max-window", "inf"], "--max-window"),
        (["diagnose", "pid:1", "--timeout", "1e999"], "--timeout"),  # reads as inf
        (["diagnose", "pid:1", "--timeout", "٣"], "--timeout"),  # float() takes Arabic-Indic digits
        (["diagnose", "pid:1", "--timeout", "1_0"], "--timeout"),
        (["diagnose", "pid:1", "--timeout", "9" * 5000], "--timeout"),
        (["diagnose", "pid:1", "--agents", "node1:²"], "--agents"),
        (["diagnose", "pid:1", "--agents", "node1:0"], "--agents"),
    ]
    + [(["diagnose", "pid:1", "--width", value], "--width") for value in ("0", "-3", "100000", "nan", "²")]
    + [
        (["analyze", "x.json", "--width", "0"], "--width"),
    ]
    + [(["watch", "pid:1", "--stall-after", value], "--stall-after") for value in ("nan", "inf", "-1", "0")]
    + [
        (["watch", "pid:1", option, value], option)
        for option, value in [
            ("--warmup-timeout", "nan"),
            ("--warmup-timeout", "0"),
            ("--check-interval", "inf"),
            ("--check-interval", "0"),
            ("--stall-factor", "nan"),
            ("--stall-factor", "0"),
            ("--stall-factor", "-2"),
            ("--min-stall", "-1"),
            ("--min-stall", "inf"),
            ("--kill-grace", "nan"),
            ("--kill-grace", "-1"),
            ("--max-postpone", "-1"),
            ("--max-postpone", "1.5"),
            ("--warmup-steps", "-1"),
            ("--warmup-steps", "٣"),
            ("--metrics-port", "70000"),
            ("--metrics-port", "-1"),
            ("--metrics-port", "²"),
            ("--window", "inf"),
            ("--interval", "0"),
            ("--max-window", "nan"),
            ("--timeout", "0"),
        ]
    ]
    + [
        (["agent", option, value], option)
        for option, value in [
            ("--listen", "127.0.0.1:70000"),
            ("--listen", "127.0.0.1:²"),
            ("--listen", "no-port"),
            ("--listen", "\x1b[2J:7420"),
            ("--node-name", "evil\x1b]0;x\x07"),
            ("--node-name", ""),
            ("--replay-world-size", "0"),
            ("--replay-world-size", "2000000000"),
            ("--replay-rank-offset", "-1"),
        ]
    ]
)


@pytest.mark.parametrize(("argv", "option"), NUMERIC, ids=[" ".join(a)[:60] for a, _ in NUMERIC])
def test_bad_option_values_are_one_line_errors(argv, option, capsys) -> None:
    line = _one_error(capsys, 2, argv, f"argument {option}")
    assert "\x1b" not in line and len(line) < 400


def test_option_ranges_name_their_bounds(capsys) -> None:
    line = _one_error(capsys, 2, ["diagnose", "pid:1", "--timeout", "inf"])
    assert line == (
        "hangdoc: error: argument --timeout: 'inf' is not a duration from 0.1 to 600 seconds "
        "(90s, 5m, 1.5h, 500ms; a plain number is seconds)"
    )
    line = _one_error(capsys, 2, ["watch", "pid:1", "--metrics-port", "70000"])
    assert "from 0 to 65535 (0: any free port)" in line


def test_argparse_errors_take_the_same_path(capsys) -> None:
    _one_error(capsys, 2, ["frobnicate"], "invalid choice")
    _one_error(capsys, 2, ["diagnose"], "the following arguments are required: JOB")
    _one_error(capsys, 2, ["diagnose", "pid:1", "--timeout"], "expected one argument")
    _one_error(capsys, 2, ["analyze", "x.json", "--no-such-option"], "unrecognized arguments")
    assert main(["diagnose", "--bogus", "pid:1"]) == 2  # found by the top-level parser, for diagnose
    assert "help: Run `hangdoc diagnose --help`" in capsys.readouterr().err
    assert main(["diagnose", "pid:1", "--timeout", "0"]) == 2
    assert "help: Run `hangdoc diagnose --help`" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2
    assert "help: Run `hangdoc --help`" in capsys.readouterr().err


# ------------------------------------------------------------ conventions of a CLI

COMMANDS = ["diagnose", "agent", "watch", "server", "incidents", "run", "analyze", "analyse", "completion"]


@pytest.fixture(autouse=True)
def _no_outside_config(monkeypatch, tmp_path) -> None:
    """Option defaults come from this test alone: no config file or HANGDOC_* variable of
    the machine it runs on."""
    from hangdoc import settings

    for env in settings.ENVIRONMENT:
        monkeypatch.delenv(env.name, raising=False)
    monkeypatch.delenv("HANGDOC_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    monkeypatch.setattr(settings, "SYSTEM_CONFIG", tmp_path / "no-system-config.toml")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_answers_version(command, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main([command, "--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"hangdoc {__version__}\n"


@pytest.mark.parametrize("command", COMMANDS)
def test_an_error_of_a_command_points_to_its_own_help(command, capsys) -> None:
    name = "analyze" if command == "analyse" else command
    _one_error(capsys, 2, [command, "--no-such-option"])
    assert main([command, "--no-such-option"]) == 2
    assert f"help: Run `hangdoc {name} --help` for the accepted options." in capsys.readouterr().err
    # a usage error the command finds itself, after parsing, points there too
    found_later = {"diagnose": ["diagnose", "pid:1", "--window", "5", "--max-window", "1"], "watch": ["watch"]}
    if command in found_later:
        assert main(found_later[command]) == 2
        assert f"help: Run `hangdoc {name} --help`" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90.0), ("5m", 300.0), ("1h", 3600.0), ("1.5m", 90.0), ("500ms", 0.5), ("2", 2.0), ("0.25", 0.25)],
)
def test_durations_take_units(text, seconds) -> None:
    from hangdoc.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["diagnose", "pid:1", "--window", text]).window == seconds
    assert parser.parse_args(["watch", "pid:1", "--stall-after", text]).stall_after == seconds
    assert parser.parse_args(["server", "--check-interval", text]).check_interval == seconds


@pytest.mark.parametrize("text", ["5x", "-1s", "nan", "nans", "infs", "1h30m", "5 s", "5M", "s", "2h"])
def test_bad_durations_are_one_line_errors(text, capsys) -> None:
    line = _one_error(capsys, 2, ["diagnose", "pid:1", f"--window={text}"], "argument --window")
    assert "is not a duration from 0 to 3600 seconds (90s, 5m, 1.5h, 500ms" in line


def test_help_says_durations_take_units(capsys) -> None:
    for command in ("diagnose", "watch", "server"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "Durations take 90s, 5m, 1.5h, 500ms" in " ".join(capsys.readouterr().out.split())


def _report_on_a_terminal(tmp_path, *options: str, **env: str) -> str:
    """``hangdoc analyze`` with its stdout on a pseudo-terminal, as a user runs it."""
    import pty

    path = tmp_path / "hang.json"
    save_snapshot(mismatch_snapshot(), path)
    leader, follower = pty.openpty()
    environ = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TERM")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hangdoc", "analyze", str(path), "--width", "100", *options],
        stdout=follower,
        stderr=subprocess.DEVNULL,
        env={**environ, "TERM": "xterm-256color", **env},
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert proc.wait(timeout=60) == 0
    os.close(leader)
    return b"".join(chunks).decode()


def _coloured(text: str) -> bool:
    """Whether ``text`` sets a colour (SGR 30-38, 40-48, 90-97, 100-107; bold is no colour)."""
    import re

    colours = {*range(30, 39), *range(40, 49), *range(90, 98), *range(100, 108)}
    for params in re.findall(r"\x1b\[([0-9;]*)m", text):
        if any(p.isdigit() and int(p) in colours for p in params.split(";")):
            return True
    return False


def test_color_auto_always_never_and_no_color(tmp_path, capsys, monkeypatch) -> None:
    path = tmp_path / "hang.json"
    save_snapshot(mismatch_snapshot(), path)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    assert main(["analyze", str(path)]) == 0  # auto, into a pipe: plain
    assert "\x1b[" not in capsys.readouterr().out
    assert main(["analyze", str(path), "--color", "always"]) == 0  # forced, even into a pipe
    assert _coloured(capsys.readouterr().out)
    monkeypatch.setenv("NO_COLOR", "1")
    assert main(["analyze", str(path), "--color", "always"]) == 0  # always wins over NO_COLOR
    assert _coloured(capsys.readouterr().out)
    # on a terminal: auto colours unless NO_COLOR says not to (bold may stay: it is no
    # colour); never sends no escape sequence at all
    assert _coloured(_report_on_a_terminal(tmp_path))
    assert not _coloured(_report_on_a_terminal(tmp_path, NO_COLOR="1"))
    assert "\x1b[" not in _report_on_a_terminal(tmp_path, "--color", "never")


def test_watch_checks_its_job_spec_before_starting(capsys) -> None:
    _one_error(capsys, 2, ["watch", "pid:²"], "pid '²'")
    _one_error(capsys, 2, ["watch", "--job", "HOST:99999", "--", "true"], "port '99999'")


SPECS = [
    ("pid:²", "pid '²'"),
    ("pid:٣", "pid '٣'"),
    ("pid:-1", "pid '-1'"),
    ("pid:0", "pid '0'"),
    ("pid:4194305", "from 1 to 4194304"),
    ("HOST:²", "port '²'"),
    ("HOST:99999", "port '99999'"),
    (":29500", "did you mean 127.0.0.1:29500?"),
    ("", "empty"),
    ("x" * 2**20, "longer than 1024 characters"),
    ("a\x1b[2J:1", "control characters"),
]


@pytest.mark.parametrize(("spec", "needle"), SPECS, ids=[s[:20] or "<empty>" for s, _ in SPECS])
def test_bad_job_specs(spec, needle, capsys) -> None:
    line = _one_error(capsys, 2, ["diagnose", spec], needle)
    assert len(line) < 600 and "\x1b" not in line


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("command", "spec", "suggestion", "help_part"),
    [
        ("diagnose", "pdi:2282", "pid:2282", "A host really named pdi? Write it with a trailing dot: pdi.:2282"),
        ("diagnose", "2282", "pid:2282", "HOST:2282 (127.0.0.1:2282 for a job on this node)"),
        ("watch", "slrum:1234.0", "slurm:1234.0", "slrum.:1234.0"),
    ],
)
def test_job_spec_errors_suggest_the_closest_form(command, spec, suggestion, help_part, capsys) -> None:
    assert main([command, spec]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"hangdoc: error: bad job spec '{spec}': ")
    assert f"did you mean {suggestion}?" in err[0]
    assert err[1].startswith("  help: ") and help_part in err[1]


def test_job_spec_help_lists_the_forms_the_error_lists(capsys) -> None:
    from hangdoc.capture.find.jobspec import ACCEPTED_FORMS

    for command in ("diagnose", "watch"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for form in ACCEPTED_FORMS.replace(" or ", ", ").split(", "):
            if form != "[IPV6]:PORT":  # --help says HOST:PORT; the brackets are in the error's own words
                assert form in text, (command, form)


# ------------------------------------------------------------------- bad snapshot files


def _analyze_error(capsys, path, needle: str, code: int = 6) -> str:
    line = _one_error(capsys, code, ["analyze", str(path)], needle)
    return line


@pytest.mark.timeout(20)
def test_analyze_a_fifo_does_not_wait_for_a_writer(tmp_path, capsys) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    _analyze_error(capsys, fifo, "is a FIFO (named pipe), not a snapshot file")


def test_analyze_devices_and_directories(tmp_path, capsys) -> None:
    _analyze_error(capsys, "/dev/zero", "/dev/zero is a character device")
    _analyze_error(capsys, tmp_path, "no flight recorder dump in it")  # a directory holds dumps
    _analyze_error(capsys, tmp_path / "missing.json", "No such file or directory")


def test_analyze_a_gzip_bomb(tmp_path, capsys) -> None:
    """1 GiB of zeros in 1 MB: inflating stops at the cap (512 MiB) with one line."""
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(bytes(16 * 2**20), compresslevel=9) * 64)
    _analyze_error(capsys, path, "inflates to more than 512 MiB")


def test_analyze_a_huge_file(tmp_path, capsys) -> None:
    path = tmp_path / "huge.json"
    with path.open("wb") as f:
        f.truncate(bundle.MAX_FILE_BYTES + 1)  # sparse: costs no disk
    _analyze_error(capsys, path, "larger than 512 MiB")


def test_analyze_a_json_report_says_what_to_pass(tmp_path, capsys) -> None:
    snap = tmp_path / "hang.json"
    save_snapshot(mismatch_snapshot(), snap)
    assert main(["analyze", str(snap), "--json"]) == 0
    report = tmp_path / "report.json"
    report.write_text(capsys.readouterr().out)
    _analyze_error(capsys, report, "this is a hangdoc report, not a snapshot; pass the file written by --save")


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b'{"kind": "hangdoc-snapshot", "schema_version": 1, "frames": [\xff\xfe]}', "binary data"),
        (b"[" * 200_000, "nested too deeply"),
        (b'{"kind": "hangdoc-snapshot", "schema_version": 1, "frames": [' + b"1" * 5000 + b"]}", "not valid JSON"),
    ],
)
def test_analyze_undecodable_files(tmp_path, capsys, content, needle) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    _analyze_error(capsys, path, needle)


@pytest.mark.parametrize(
    ("world_size", "needle"),
    [
        (2_000_000_000, "2000000000 is out of range (0 to 1048576)"),
        (1e300, "expected int, got the number 1e+300"),
        (-1, "-1 is out of range"),
        (True, "expected int, got a boolean"),
    ],
)
def test_analyze_an_absurd_world_size(tmp_path, capsys, world_size, needle) -> None:
    data = snapshot_to_dict(mismatch_snapshot())
    data["snapshot"]["world_size"] = world_size
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(data))
    _analyze_error(capsys, path, f"at snapshot.world_size: {needle}")


def test_analyze_nan_in_a_snapshot_prints_strict_json(tmp_path, capsys) -> None:
    snap = make_snapshot([make_rank(r, ["train.py:main:1"], cpu_start=math.nan) for r in (0, 1)])
    path = tmp_path / "nan.json"
    save_snapshot(snap, path)
    assert b"NaN" in path.read_bytes()  # Python's json writes it; hangdoc reads it back
    assert main(["analyze", str(path), "--json"]) == 0
    json.loads(capsys.readouterr().out, parse_constant=pytest.fail)


ESCAPES = "\x1b[2J\x1b]0;pwned\x07\rback\u202egnp.exe\x9b31m"


def test_analyze_never_sends_escape_sequences_to_the_terminal(tmp_path, capsys) -> None:
    frame = Frame(f"evil{ESCAPES}", f"/job/{ESCAPES}.py", 3, code=f"x = 1  # {ESCAPES}")
    snap = make_snapshot(
        [make_rank(r, ["train.py:main:1", frame], host=f"node{ESCAPES}") for r in (0, 1)],
        notes=[
            Note(f"note {ESCAPES}", NoteKind.NOT_RANKS, node=f"node{ESCAPES}", pids=(7,), listed=f"pid 7 {ESCAPES}")
        ],
        spec=f"pid:{ESCAPES}",
    )
    path = tmp_path / "evil.json"
    save_snapshot(snap, path)
    assert main(["analyze", str(path), "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert not {"\x1b", "\x07", "\r", "\u202e", "\x9b"} & set(out), repr(out)
    assert "evil\\x1b[2J\\x1b]0;pwned\\x07\\rback\\u202egnp.exe\\x9b31m" in out
    shown = "\\x1b[2J\\x1b]0;pwned\\x07\\rback\\u202egnp.exe\\x9b31m"
    assert f"• node{shown}: note {shown}: pid 7 {shown}" in out  # the note, node and list shown too
    assert main(["analyze", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["groups"][0]["stack"][-1]["function"] == f"evil{ESCAPES}"  # raw, JSON-escaped
    assert report["notes"] == [f"node{ESCAPES}: note {ESCAPES}: pid 7 {ESCAPES}"]  # the note's words


# ------------------------------------------------------------------ --json on failure


def _json_error(capsys, argv: list[str], code: int, kind: str) -> dict:
    assert main(argv) == code
    out = capsys.readouterr()
    obj = json.loads(out.out)  # exactly one JSON document on stdout
    assert list(obj) == ["error", "hangdoc_version", "schema_version"]
    assert list(obj["error"]) == ["kind", "message", "help", "exit_code"]
    assert obj["error"]["kind"] == kind and obj["error"]["exit_code"] == code
    assert obj["hangdoc_version"] == __version__ and obj["schema_version"] == SCHEMA_VERSION
    first = out.err.splitlines()[0]
    assert first == f"hangdoc: error: {obj['error']['message']}"  # the same line on stderr
    assert f"  help: {obj['error']['help']}" in out.err and "Traceback" not in out.err
    return obj["error"]


def test_json_error_object_for_each_kind_of_failure(tmp_path, capsys) -> None:
    error = _json_error(capsys, ["diagnose", "pid:²", "--json"], 2, "UsageError")
    assert "pid '²'" in error["message"] and error["help"]
    error = _json_error(capsys, ["diagnose", "127.0.0.1:1", "--json"], 3, "JobNotFound")
    assert "MASTER_PORT=1" in error["message"]
    corrupt = tmp_path / "bad.json"
    corrupt.write_text('{"kind": "hangdoc-snapshot", "schema_version": 1, "snap')
    error = _json_error(capsys, ["analyze", str(corrupt), "--json"], 6, "BundleError")
    assert "bad.json" in error["message"]
    _json_error(capsys, ["analyze", str(tmp_path / "none.json"), "--json"], 6, "BundleError")
    # argparse errors too, when --json is on the command line
    _json_error(capsys, ["diagnose", "pid:1", "--json", "--timeout", "nan"], 2, "UsageError")
    _json_error(capsys, ["analyze", "--json"], 2, "UsageError")


def test_json_error_object_for_agent_errors(capsys, monkeypatch) -> None:
    from hangdoc import pipeline as diagnose_module
    from hangdoc.fleet.client import AgentError

    def refuse(*args, **kwargs):
        raise AgentError("agent 10.0.0.9:7420 unavailable: connection refused")

    monkeypatch.setattr(diagnose_module, "diagnose", refuse)
    error = _json_error(capsys, ["diagnose", "10.0.0.1:29500", "--json"], 7, "AgentError")
    assert "connection refused" in error["message"]


def test_json_error_without_help_text(capsys, monkeypatch) -> None:
    monkeypatch.setenv("HANGDOC_NO_HELP", "1")
    assert main(["diagnose", "pid:0", "--json"]) == 2
    out = capsys.readouterr()
    assert json.loads(out.out)["error"]["help"]  # the object always carries it
    assert len(out.err.splitlines()) == 1


def test_unexpected_exception_is_one_line_internal_error(tmp_path, capsys, monkeypatch) -> None:
    from hangdoc.analysis import analyse as analyse_module

    def crash(snapshot):
        raise RuntimeError("boom\n\x1b[2Jsecond line")

    path = tmp_path / "hang.json"
    save_snapshot(mismatch_snapshot(), path)
    monkeypatch.setattr(analyse_module, "analyse", crash)
    line = _one_error(capsys, 70, ["analyze", str(path)])
    assert line == "hangdoc: error: internal error: RuntimeError: boom\\n\\x1b[2Jsecond line"
    error = _json_error(capsys, ["analyze", str(path), "--json"], 70, "InternalError")
    assert "HANGDOC_DEBUG=1" in error["help"]
    monkeypatch.setenv("HANGDOC_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        main(["analyze", str(path)])


def test_interrupt_with_json(tmp_path, capsys, monkeypatch) -> None:
    from hangdoc.capture.dumps import dumpfile  # what `analyze` reads its file with

    def interrupted(path, stdin=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(dumpfile, "load_evidence", interrupted)
    assert main(["analyze", "x.json", "--json"]) == 130
    out = capsys.readouterr()
    assert json.loads(out.out)["error"] == {
        "kind": "Interrupted",
        "message": "interrupted",
        "help": "",
        "exit_code": 130,
    }
    assert out.err == "hangdoc: interrupted\n"


# ------------------------------------------------------------------------ closed stdout


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_closed_stdout_is_quiet(tmp_path, json_flag) -> None:
    """`hangdoc analyze X | head -0`: no traceback, no "Exception ignored" at exit."""
    path = tmp_path / "hang.json"
    save_snapshot(mismatch_snapshot(), path)
    reader, writer = os.pipe()
    os.close(reader)  # the reader is gone before hangdoc writes a byte
    try:
        done = subprocess.run(
            [sys.executable, "-m", "hangdoc", "analyze", str(path), *json_flag],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(writer)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_closed_stdout_on_an_error_with_json(tmp_path) -> None:
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "hangdoc", "diagnose", "pid:0", "--json"],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(writer)
    assert done.returncode == 2
    assert done.stderr.startswith("hangdoc: error: bad job spec")
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr


def test_analyze_a_directory_of_flight_recorder_dumps(capsys) -> None:
    from support.paths import TESTS

    assert main(["analyze", str(TESTS / "data" / "flight" / "behind"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["verdict"], report["culprit_ranks"]) == ("straggler", [1])
    assert report["summary"].endswith("which ranks 0,2 wait in (flight recorder)")
