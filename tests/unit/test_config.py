"""Option defaults from config files and the environment (``hangdoc.settings``): where the
files are (XDG), which source wins, the values checked as the command line checks them,
and one-line errors that name the file and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.factories import make_rank, make_snapshot

from hangdoc import settings
from hangdoc.bundle import save_snapshot
from hangdoc.cli import _commands, build_parser, main
from hangdoc.settings import load_defaults, user_config

C10D = "torch/distributed/distributed_c10d.py"


@pytest.fixture(autouse=True)
def _no_outside_config(monkeypatch, tmp_path) -> None:
    """No config of this machine's user or system, nor a HANGDOC_* variable, leaks in."""
    for name in [env.name for env in settings.ENVIRONMENT] + ["HANGDOC_CONFIG", "NO_COLOR"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(settings, "SYSTEM_CONFIG", tmp_path / "etc" / "config.toml")


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _defaults(environ: dict[str, str], system: Path | None = None) -> dict[str, dict[str, object]]:
    found = load_defaults(_commands(build_parser()), environ, system)
    return {name: {dest: s.value for dest, s in values.items()} for name, values in found.items()}


def test_where_the_user_file_is(tmp_path) -> None:
    assert user_config({"XDG_CONFIG_HOME": "/x", "HOME": "/h"}) == (Path("/x/hangdoc/config.toml"), False)
    assert user_config({"HOME": "/h"}) == (Path("/h/.config/hangdoc/config.toml"), False)
    assert user_config({"XDG_CONFIG_HOME": "rel", "HOME": "/h"}) == (Path("/h/.config/hangdoc/config.toml"), False)
    assert user_config({"HANGDOC_CONFIG": "/c.toml", "XDG_CONFIG_HOME": "/x"}) == (Path("/c.toml"), True)
    assert user_config({}) == (None, False)


def test_precedence_environment_over_user_over_system_over_builtin(tmp_path) -> None:
    system = _write(tmp_path / "etc.toml", 'token_file = "/sys/token"\nwindow = 3\n[diagnose]\ninterval = "1s"\n')
    user = _write(
        tmp_path / "xdg" / "hangdoc" / "config.toml", 'token_file = "/user/token"\n[diagnose]\nwindow = "5s"\n'
    )
    environ = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    diagnose = _defaults(environ, system)["diagnose"]
    # the user's table over the system's top level; the system's own table where the user says nothing
    assert diagnose == {"token_file": "/user/token", "window": 5.0, "interval": 1.0}
    assert _defaults({**environ, "HANGDOC_TOKEN_FILE": "/env/token"}, system)["diagnose"]["token_file"] == "/env/token"
    # a top-level key applies to every command that has the option, and only to those
    found = _defaults(environ, system)
    assert found["agent"] == {"token_file": "/user/token"} and found["analyze"] == {}
    assert "window" in found["watch"] and "window" not in found["server"]
    # HANGDOC_CONFIG names another user file: the XDG one is not read
    other = _write(tmp_path / "other.toml", "[diagnose]\nnative = true\n")
    diagnose = _defaults({**environ, "HANGDOC_CONFIG": str(other)}, system)["diagnose"]
    assert diagnose == {"token_file": "/sys/token", "window": 3.0, "interval": 1.0, "native": True}
    assert user.exists()


def test_an_agent_list_from_a_higher_source_replaces_the_lower_one(tmp_path) -> None:
    system = _write(tmp_path / "etc.toml", 'agents = "n1:7431"\n')
    found = _defaults({"HANGDOC_HOSTFILE": "/hosts"}, system)["diagnose"]
    assert found == {"hostfile": "/hosts"}
    assert _defaults({}, system)["server"] == {"agents": "n1:7431"}


def test_variables_that_belong_to_one_command() -> None:
    found = _defaults({"HANGDOC_SERVER": "http://hangdoc:7430", "HANGDOC_NOTIFY_WEBHOOK": "https://hooks/x"})
    assert found["incidents"] == {"server": "http://hangdoc:7430"}
    assert found["server"] == {"notify_webhook": "https://hooks/x"}
    assert found["agent"] == {}  # `agent --server` is where the agent reports, not this


def test_values_are_checked_by_the_options_own_types(tmp_path) -> None:
    path = _write(tmp_path / "c.toml", '[watch]\nstall_after = "10m"\nwarmup_steps = 3\nkeep-agents = true\n')
    watch = _defaults({"HANGDOC_CONFIG": str(path)})["watch"]
    assert watch == {"stall_after": 600.0, "warmup_steps": 3, "keep_agents": True}


BAD = [
    ("windo = 3\n", "'windo' is not an option of any command"),
    ("[diagnoze]\nwindow = 1\n", "[diagnoze] is not a command"),
    ("[analyze]\nwindow = 1\n", "[analyze] 'window' is not an option of hangdoc analyze"),
    ('[diagnose]\nwindow = "5x"\n', "[diagnose] window: '5x' is not a duration"),
    ('[diagnose]\nwindow = "-1s"\n', "[diagnose] window: '-1s' is not a duration"),
    ("[diagnose]\nwindow = nan\n", "[diagnose] window: 'nan' is not a duration"),
    ('native = "yes"\n', "native: --native is a switch: true or false, not 'yes'"),
    ("agents = [1, 2]\n", "agents: --agents takes a string or a number"),
    ('agents = "node1:0"\n', "agent address 'node1:0' is not HOST[:PORT]"),
    ('color = "pink"\n', "color: 'pink' is not one of auto, always, never"),
    ('[diagnose]\ninclude = "x"\n', "[diagnose] 'include' is not an option"),  # repeatable
    ("window = [\n", "not TOML"),
]


@pytest.mark.parametrize(("text", "needle"), BAD, ids=[n for _, n in BAD])
def test_bad_config_is_a_one_line_error_naming_file_and_key(text, needle, tmp_path, capsys) -> None:
    path = _write(tmp_path / "xdg" / "hangdoc" / "config.toml", text)
    assert main(["analyze", "nothing.json"]) == 2
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"hangdoc: error: {path}: "), out.err
    assert needle in lines[0] and lines[1].startswith(f"  help: Fix or remove it in {path}")
    assert "Traceback" not in out.err and out.out == ""
    # help and version still answer
    with pytest.raises(SystemExit) as stop:
        main(["diagnose", "--version"])
    assert stop.value.code == 0


def test_bad_environment_and_missing_named_file(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HANGDOC_AGENTS", "node1:99999")
    assert main(["analyze", "nothing.json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hangdoc: error: HANGDOC_AGENTS: agent address 'node1:99999'")
    assert "help: Unset HANGDOC_AGENTS or fix it." in err
    monkeypatch.delenv("HANGDOC_AGENTS")
    monkeypatch.setenv("HANGDOC_CONFIG", str(tmp_path / "missing.toml"))
    assert main(["analyze", "nothing.json"]) == 2
    assert "missing.toml: no such config file (HANGDOC_CONFIG names it)" in capsys.readouterr().err


def _snapshot(tmp_path: Path) -> Path:
    def site(op: str, where: str) -> list[str]:
        return ["train.py:<module>:9", where, f"{C10D}:{op}:2800"]

    path = tmp_path / "hang.json"
    snapshot = make_snapshot(
        [make_rank(r, site("all_gather", "metrics.py:log:12")) for r in (0, 1, 2)]
        + [make_rank(3, site("all_reduce", "model.py:sync:88"))]
    )
    save_snapshot(snapshot, path)
    return path


def test_the_cli_takes_configured_defaults_and_the_command_line_wins(tmp_path, capsys) -> None:
    bundle = _snapshot(tmp_path)
    _write(settings.SYSTEM_CONFIG, "[analyze]\njson = true\n")
    assert main(["analyze", str(bundle)]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "collective_mismatch"
    _write(tmp_path / "xdg" / "hangdoc" / "config.toml", "[analyze]\njson = false\nwidth = 40\n")
    assert main(["analyze", str(bundle)]) == 0  # the user's file over the system's
    narrow = capsys.readouterr().out
    assert max(len(line) for line in narrow.splitlines()) <= 40
    assert main(["analyze", str(bundle), "--width", "120"]) == 0  # the command line over both
    wide = capsys.readouterr().out
    assert max(len(line) for line in wide.splitlines()) > 40


def test_help_lists_the_configured_defaults_and_their_sources(tmp_path, monkeypatch, capsys) -> None:
    path = _write(tmp_path / "xdg" / "hangdoc" / "config.toml", '[diagnose]\nwindow = "5s"\n')
    monkeypatch.setenv("HANGDOC_AGENTS", "node1:7431")
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        main(["diagnose", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"Configured defaults: --window 5s ({path}); --agents node1:7431 (HANGDOC_AGENTS)." in text
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "HANGDOC_AGENTS, HANGDOC_HOSTFILE, HANGDOC_TOKEN_FILE" in text and "/etc/hangdoc/config.toml" in text


def test_configured_agents_are_left_out_for_a_ray_job(monkeypatch, capsys) -> None:
    # given on the command line, a ray: job refuses them; configured, it leaves them out
    assert main(["diagnose", "ray:raysubmit_x", "--agents", "node1:7431"]) == 2
    assert "a ray: job places its own agents" in capsys.readouterr().err
    from hangdoc import cli

    args = build_parser().parse_args(["diagnose", "ray:raysubmit_x"])
    args.agents = "node1:7431"
    args.configured = {"agents": settings.Setting("--agents", "node1:7431", "node1:7431", "HANGDOC_AGENTS")}
    assert cli._agent_list(args) == (None, None)
    args.job = "pid:1"
    assert cli._agent_list(args) == ("node1:7431", None)
    args.hostfile = "/hosts"  # given on the command line: the configured --agents goes
    assert cli._agent_list(args) == (None, "/hosts")
