"""``hangdoc completion bash|zsh|fish``: scripts made from the parser, loaded in the real
shells and asked to complete (bash through ``COMP_WORDS``/``compgen``, fish through
``complete -C``, zsh in a pseudo-terminal); zsh and fish are skipped where not installed."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from hangdoc.cli import build_parser, main
from hangdoc.completion import commands, completion_script


def _script(shell: str, capsys) -> str:
    assert main(["completion", shell]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    return out.out


def test_the_script_is_made_from_the_parser() -> None:
    top, found = commands(build_parser())
    by_name = {name: command for command in found for name in command.names}
    assert {"diagnose", "agent", "watch", "server", "incidents", "run", "analyze", "analyse", "completion"} <= set(
        by_name
    )
    assert "--version" in {flag for option in top for flag in option.flags}
    diagnose = {flag: option for option in by_name["diagnose"].options for flag in option.flags}
    assert diagnose["--color"].choices == ("auto", "always", "never")
    assert diagnose["--save"].files and not diagnose["--window"].files
    assert diagnose["--window"].takes_value and not diagnose["--native"].takes_value
    assert "--replay" not in {flag for option in by_name["agent"].options for flag in option.flags}  # hidden
    assert by_name["completion"].positional_choices == ("bash", "zsh", "fish")
    assert by_name["analyze"].positional_files and by_name["run"].runs_a_command


def _bash_complete(script: str, *words: str) -> list[str]:
    """What the script's completion function offers for ``words`` (the last one: the word
    being completed), run in a real bash."""
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    program = (
        f"{script}\n"
        f"COMP_WORDS=({quoted}); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 )); COMPREPLY=()\n"
        '_hangdoc; printf "%s\\n" "${COMPREPLY[@]}"\n'
        "complete -p hangdoc >&2\n"
    )
    done = subprocess.run(["bash", "--norc", "--noprofile"], input=program, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "-F _hangdoc hangdoc" in done.stderr  # registered for the command
    return [line for line in done.stdout.splitlines() if line]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completes_commands_options_and_choices(capsys) -> None:
    script = _script("bash", capsys)
    assert _bash_complete(script, "hangdoc", "diag") == ["diagnose"]
    assert _bash_complete(script, "hangdoc", "diagnose", "--wi") == ["--width", "--window"]
    assert _bash_complete(script, "hangdoc", "diagnose", "--color", "al") == ["always"]
    assert _bash_complete(script, "hangdoc", "diagnose", "--color", "=", "ne") == ["never"]  # --color=ne
    assert _bash_complete(script, "hangdoc", "completion", "") == ["bash", "zsh", "fish"]
    assert _bash_complete(script, "hangdoc", "analyse", "--js") == ["--json"]  # an alias
    assert _bash_complete(script, "hangdoc", "agent", "--vers") == ["--version"]
    assert _bash_complete(script, "hangdoc", "--vers") == ["--version"]
    assert _bash_complete(script, "hangdoc", "diagnose", "--window", "") == []  # a value: nothing
    # the command `run` and `watch --` start: its name is a command, its options its own
    assert "bash" in _bash_complete(script, "hangdoc", "run", "bas")
    assert "bash" in _bash_complete(script, "hangdoc", "watch", "--out", "hangs", "--", "bas")
    assert _bash_complete(script, "hangdoc", "run", "python3", "--ver") == []


@pytest.mark.skipif(shutil.which("fish") is None, reason="needs fish")
def test_fish_script_completes(capsys, tmp_path) -> None:
    path = tmp_path / "hangdoc.fish"
    path.write_text(_script("fish", capsys))
    assert subprocess.run(["fish", "-n", str(path)], capture_output=True, timeout=30).returncode == 0
    asks = ["hangdoc diag", "hangdoc diagnose --wi", "hangdoc diagnose --color ", "hangdoc completion "]
    program = f"source {path}\n" + "".join(f"complete -C '{ask}'; echo ---\n" for ask in asks)
    done = subprocess.run(["fish", "--no-config", "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    answers = [[line.split("\t")[0] for line in part.strip().splitlines()] for part in done.stdout.split("---")[:4]]
    assert answers == [["diagnose"], ["--width", "--window"], ["always", "auto", "never"], ["bash", "fish", "zsh"]]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="needs zsh")
def test_zsh_script_completes(capsys, tmp_path) -> None:
    (tmp_path / "_hangdoc").write_text(_script("zsh", capsys))
    assert subprocess.run(["zsh", "-n", str(tmp_path / "_hangdoc")], capture_output=True, timeout=30).returncode == 0
    # an interactive zsh in a pseudo-terminal, as a user has it: TAB after each line
    driver = f"""
zmodload zsh/zpty
expect() {{  # read the terminal until it shows $1, for at most 10 s
    local seen="" chunk
    for i in {{1..100}}; do
        while zpty -r -t z chunk; do seen+=$chunk; done
        [[ $seen == *$1* ]] && return 0
        sleep 0.1
    done
    print -r -- "NOT SHOWN: $1"; exit 1
}}
zpty z zsh -f -i
zpty -w z 'PS1="> "; fpath=({tmp_path} $fpath); autoload -U compinit; compinit -u -D; hangdoc() {{ :; }}'
zpty -w -n z $'hangdoc diag\t'
expect diagnose
zpty -w -n z $'\x15hangdoc diagnose --wi\t'
expect --window
print -r -- OK
"""
    done = subprocess.run(["zsh", "-f"], input=driver, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().endswith("OK"), done.stdout[-2000:] + done.stderr[-2000:]


def test_every_shell_gets_a_script_and_a_wrong_one_is_a_usage_error(capsys) -> None:
    for shell in ("bash", "zsh", "fish"):
        assert "hangdoc" in completion_script(shell, build_parser())
    assert main(["completion", "powershell"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'powershell'" in err and "help: Run `hangdoc completion --help`" in err
