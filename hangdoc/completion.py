"""Shell completion scripts (bash, zsh, fish), made from the argparse parser itself.

``commands(parser)`` reads the parser once into plain values (each command's names, its
options, which take a value, their choices, which name a file); each shell's writer turns
those into that shell's script, so a new option completes without touching this file.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

SHELLS = ("bash", "zsh", "fish")
_FILE_METAVARS = re.compile(r"FILE|PATH|DIR", re.ASCII)


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]
    help: str
    takes_value: bool
    choices: tuple[str, ...] = ()
    files: bool = False


@dataclass(frozen=True)
class Command:
    names: tuple[str, ...]  # the name, then its aliases
    help: str
    options: tuple[Option, ...]
    positional_choices: tuple[str, ...] = ()
    positional_files: bool = False
    positionals: bool = False
    runs_a_command: bool = False  # `run`, `watch -- COMMAND`: a command line after the options


def _summary(text: str | None) -> str:
    text = " ".join((text or "").replace("%%", "%").split())
    return text if len(text) <= 70 else text[:69].rsplit(" ", 1)[0] + "…"


def _option(action: argparse.Action) -> Option:
    takes_value = action.nargs != 0
    metavar = action.metavar if isinstance(action.metavar, str) else ""
    return Option(
        tuple(action.option_strings),
        _summary(action.help),
        takes_value,
        tuple(str(c) for c in action.choices) if takes_value and action.choices else (),
        takes_value and bool(_FILE_METAVARS.search(metavar)),
    )


def _options(parser: argparse.ArgumentParser) -> tuple[Option, ...]:
    return tuple(_option(a) for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS)


def commands(parser: argparse.ArgumentParser) -> tuple[tuple[Option, ...], tuple[Command, ...]]:
    """The top-level options, and each subcommand."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    names: dict[int, list[str]] = {}
    parsers: dict[int, argparse.ArgumentParser] = {}
    for name, command in sub.choices.items():
        names.setdefault(id(command), []).append(name)
        parsers[id(command)] = command
    found = []
    for key, command in parsers.items():
        positionals = [a for a in command._actions if not a.option_strings]
        choices = tuple(str(c) for a in positionals if a.choices for c in a.choices)
        files = any(_FILE_METAVARS.search(a.metavar) for a in positionals if isinstance(a.metavar, str))
        found.append(
            Command(
                tuple(names[key]),
                _summary(helps.get(names[key][0])),
                _options(command),
                choices,
                files,
                bool(positionals),
                command.get_default("command_argv") is not None,
            )
        )
    return _options(parser), tuple(found)


def completion_script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The completion script for ``shell`` (one of ``SHELLS``)."""
    top, found = commands(parser)
    writer = {"bash": _bash, "zsh": _zsh, "fish": _fish}[shell]
    return writer(parser.prog, top, found)


# ---------------------------------------------------------------------------- bash


def _words(words: list[str] | tuple[str, ...]) -> str:
    return " ".join(words)


def _bash(prog: str, top: tuple[Option, ...], found: tuple[Command, ...]) -> str:
    fn = f"_{prog}"
    lines = [
        f'# {prog} completion for bash: eval "$({prog} completion bash)" (in ~/.bashrc)',
        f"{fn}() {{",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="" cmd="" start=0 i',
        '    (( COMP_CWORD > 0 )) && prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    if [[ "$prev" == "=" ]] && (( COMP_CWORD > 1 )); then prev="${COMP_WORDS[COMP_CWORD-2]}"; fi',
        '    if [[ "$cur" == "=" ]]; then cur=""; fi',
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        case "${COMP_WORDS[i]}" in',
        "            -*) ;;",
        '            *) cmd="${COMP_WORDS[i]}"; start=$i; break ;;',
        "        esac",
        "    done",
        "    COMPREPLY=()",
        '    case "$cmd" in',
    ]
    names = [name for command in found for name in command.names]
    top_flags = [flag for option in top for flag in option.flags]
    lines.append(f'        "") COMPREPLY=($(compgen -W "{_words(names + top_flags)}" -- "$cur")); return ;;')
    for command in found:
        lines.append(f"        {'|'.join(command.names)})")
        if command.runs_a_command:
            # its command line starts after `--`, or (no positionals) at the first word
            # that is not an option; its first word is a command, the rest the shell's default
            bare = "" if command.positionals else ' || [[ "${COMP_WORDS[i]}" != -* ]]'
            lines += [
                "            for ((i = start + 1; i < COMP_CWORD; i++)); do",
                f'                if [[ "${{COMP_WORDS[i]}}" == "--" ]]{bare}; then',
                '                    if (( i + 1 == COMP_CWORD )) && [[ "${COMP_WORDS[i]}" == "--" ]]; then',
                '                        COMPREPLY=($(compgen -c -- "$cur"))',
                "                    fi",
                "                    return",
                "                fi",
                "            done",
            ]
            if not command.positionals:
                lines.append('            [[ "$cur" != -* ]] && { COMPREPLY=($(compgen -c -- "$cur")); return; }')
        lines.append('            case "$prev" in')
        for option in command.options:
            if not option.takes_value:
                continue
            if option.choices:
                action = f'COMPREPLY=($(compgen -W "{_words(option.choices)}" -- "$cur"))'
            elif option.files:
                action = 'COMPREPLY=($(compgen -f -- "$cur"))'
            else:
                action = "compopt +o default 2>/dev/null"  # a value of its own: no file names
            lines.append(f"                {'|'.join(option.flags)}) {action}; return ;;")
        lines.append("            esac")
        flags = [flag for option in command.options for flag in option.flags]
        lines.append('            if [[ "$cur" == -* ]]; then')
        lines.append(f'                COMPREPLY=($(compgen -W "{_words(flags)}" -- "$cur"))')
        if command.positional_choices:
            lines.append("            else")
            lines.append(f'                COMPREPLY=($(compgen -W "{_words(command.positional_choices)}" -- "$cur"))')
        elif command.positional_files:
            lines.append("            else")
            lines.append('                COMPREPLY=($(compgen -f -- "$cur"))')
        lines.append("            fi")
        lines.append("            ;;")
    lines += ["    esac", "}", f"complete -o bashdefault -o default -F {fn} {prog}", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- zsh


def _zsh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _zsh_help(text: str) -> str:
    return re.sub(r"([\[\]:\\])", r"\\\1", text)


def _zsh_spec(option: Option) -> list[str]:
    specs = []
    for flag in option.flags:
        spec = f"{flag}{'=' if option.takes_value and flag.startswith('--') else ''}[{_zsh_help(option.help)}]"
        if option.takes_value:
            if option.choices:
                spec += f":value:({' '.join(option.choices)})"
            elif option.files:
                spec += ":file:_files"
            else:
                spec += ":value: "
        specs.append(_zsh_quote(spec))
    return specs


def _zsh(prog: str, top: tuple[Option, ...], found: tuple[Command, ...]) -> str:
    fn = f"_{prog}"
    lines = [
        f"#compdef {prog}",
        f'# {prog} completion for zsh: {prog} completion zsh > "${{fpath[1]}}/_{prog}" (then compinit)',
        f"{fn}() {{",
        '    local curcontext="$curcontext" state line',
        "    typeset -A opt_args",
        "    _arguments -C \\",
    ]
    for option in top:
        lines += [f"        {spec} \\" for spec in _zsh_spec(option)]
    lines += ["        '1: :->command' \\", "        '*:: :->args'", "    case $state in", "        command)"]
    lines.append("            local -a subcommands=(")
    for command in found:
        for name in command.names:
            lines.append(f"                {_zsh_quote(f'{name}:{_zsh_help(command.help)}')}")
    lines += [
        "            )",
        f"            _describe -t commands '{prog} command' subcommands",
        "            ;;",
        "        args)",
        "            case $line[1] in",
    ]
    for command in found:
        lines.append(f"                {'|'.join(command.names)})")
        lines.append("                    _arguments \\")
        for option in command.options:
            lines += [f"                        {spec} \\" for spec in _zsh_spec(option)]
        if command.positional_choices:
            lines.append(
                f"                        {_zsh_quote(':value:(' + ' '.join(command.positional_choices) + ')')} \\"
            )
        elif command.positional_files:
            lines.append("                        ':file:_files' \\")
        if command.runs_a_command:
            lines.append("                        '*::command:_normal' \\")
        lines.append("                        && return")
        lines.append("                    ;;")
    lines += ["            esac", "            ;;", "    esac", "}"]
    # autoloaded from $fpath: complete now; sourced (source <(hangdoc completion zsh)): register
    lines += [
        f'if [[ "${{funcstack[1]}}" == "{fn}" ]]; then',
        f'    {fn} "$@"',
        "else",
        f"    compdef {fn} {prog}",
        "fi",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- fish


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish_option(prog: str, condition: str, option: Option) -> str:
    parts = [f"complete -c {prog} -n {_fish_quote(condition)}"]
    for flag in option.flags:
        parts.append(f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}")
    if option.choices:
        parts.append(f"-x -a {_fish_quote(' '.join(option.choices))}")
    elif option.files:
        parts.append("-r -F")
    elif option.takes_value:
        parts.append("-x")
    parts.append(f"-d {_fish_quote(option.help)}")
    return " ".join(parts)


def _fish(prog: str, top: tuple[Option, ...], found: tuple[Command, ...]) -> str:
    names = [name for command in found for name in command.names]
    lines = [
        f"# {prog} completion for fish: {prog} completion fish > ~/.config/fish/completions/{prog}.fish",
        f"complete -c {prog} -f",
    ]
    first = f"not __fish_seen_subcommand_from {' '.join(names)}"
    lines += [_fish_option(prog, first, option) for option in top]
    for command in found:
        for name in command.names:
            lines.append(f"complete -c {prog} -n {_fish_quote(first)} -a {name} -d {_fish_quote(command.help)}")
    for command in found:
        seen = f"__fish_seen_subcommand_from {' '.join(command.names)}"
        lines += [_fish_option(prog, seen, option) for option in command.options]
        if command.positional_choices:
            choices = _fish_quote(" ".join(command.positional_choices))
            lines.append(f"complete -c {prog} -n {_fish_quote(seen)} -a {choices}")
        elif command.positional_files:
            lines.append(f"complete -c {prog} -n {_fish_quote(seen)} -F")
        if command.runs_a_command:
            lines.append(f"complete -c {prog} -n {_fish_quote(seen)} -a '(__fish_complete_subcommand)'")
    return "\n".join(lines) + "\n"
