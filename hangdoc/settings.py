"""Option defaults from the environment and config files, read once at the CLI's door.

Precedence, highest first: the command line, the environment (``ENVIRONMENT``), the user's
config file (``$HANGDOC_CONFIG``, else ``$XDG_CONFIG_HOME/hangdoc/config.toml``, else
``~/.config/hangdoc/config.toml``), the system's (``/etc/hangdoc/config.toml``), the
option's built-in default. A config file is TOML whose keys are long options without their
dashes (``token_file`` or ``token-file``): top-level keys apply to every command that has
the option, a table (``[diagnose]``) to that command only and over the top level::

    agents = "node1:7431,node2:7431"
    token_file = "/etc/hangdoc/token"

    [diagnose]
    window = "5s"

Every value is checked by the option's own argparse type, so it takes what the command line
takes; an unknown key, table or a bad value is a ``UsageError`` that names the file and the
key. Nothing here prints, and nothing past the CLI reads ``os.environ`` for these options:
the values reach the commands as argparse defaults.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import UsageError, shown

CONFIG_ENV = "HANGDOC_CONFIG"
SYSTEM_CONFIG = Path("/etc/hangdoc/config.toml")
CONFIG_MAX_BYTES = 1 << 20  # a config file is a few lines; a bigger one is not one


@dataclass(frozen=True)
class EnvDefault:
    """An environment variable that sets an option's default: ``dest`` in ``commands``
    (every command with that option when empty)."""

    name: str
    option: str
    commands: tuple[str, ...] = ()


ENVIRONMENT = (
    EnvDefault("HANGDOC_AGENTS", "--agents"),
    EnvDefault("HANGDOC_HOSTFILE", "--hostfile"),
    EnvDefault("HANGDOC_TOKEN_FILE", "--token-file"),
    EnvDefault("HANGDOC_TLS_CA", "--tls-ca"),
    EnvDefault("HANGDOC_SERVER", "--server", ("incidents",)),  # `agent --server` is the agent's own
    EnvDefault("HANGDOC_NOTIFY_WEBHOOK", "--notify-webhook", ("server",)),
)


@dataclass(frozen=True)
class Setting:
    """A configured default: the option, its value (and as written), and where it was set
    (a variable's name, or a file)."""

    option: str
    value: object
    text: str
    source: str


# command -> argparse dest -> its configured default
Defaults = dict[str, dict[str, Setting]]

# Options that say one thing together: a source that sets one of them replaces what a lower
# source set for the others (HANGDOC_HOSTFILE over a config file's agents list).
TOGETHER = (frozenset({"agents", "hostfile"}),)


def user_config(environ: Mapping[str, str]) -> tuple[Path | None, bool]:
    """The user's config file, and whether it must exist (one named by ``HANGDOC_CONFIG``)."""
    if environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV]), True
    base = environ.get("XDG_CONFIG_HOME")
    if base and Path(base).is_absolute():  # the XDG spec: a relative value is to be ignored
        return Path(base) / "hangdoc" / "config.toml", False
    home = environ.get("HOME")
    return (Path(home) / ".config" / "hangdoc" / "config.toml", False) if home else (None, False)


def configurable(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The options of ``parser`` a config file may set, by long option (``--token-file``):
    not help, version, hidden or repeatable ones, nor positionals."""
    found: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or not action.option_strings:
            continue
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._AppendAction)):
            continue
        if not isinstance(action, (argparse._StoreAction, argparse._StoreTrueAction, argparse._StoreFalseAction)):
            continue
        for option in action.option_strings:
            if option.startswith("--"):
                found[option] = action
    return found


def load_defaults(
    commands: Mapping[str, argparse.ArgumentParser],
    environ: Mapping[str, str],
    system: Path | None = None,
) -> Defaults:
    """The configured defaults of each of ``commands`` (name -> its parser). Sources are
    applied lowest first, each over the last: system file, user file (each: its top level,
    then its tables), environment. ``system``: the system's file (``SYSTEM_CONFIG``)."""
    options = {name: configurable(parser) for name, parser in commands.items()}
    defaults: Defaults = {name: {} for name in commands}
    user, required = user_config(environ)
    for path, must_exist in ((system or SYSTEM_CONFIG, False), (user, required)):
        if path is not None:
            for layer in _file_layers(options, path, must_exist):
                _override(defaults, layer)
    _override(defaults, _environment(options, environ))
    return defaults


def _override(defaults: Defaults, layer: Defaults) -> None:
    for name, settings in layer.items():
        dests = set(settings)
        for group in TOGETHER:  # one of a group set here drops the others set below
            if dests & group:
                for dest in group - dests:
                    defaults[name].pop(dest, None)
        defaults[name].update(settings)


def _environment(options: Mapping[str, Mapping[str, argparse.Action]], environ: Mapping[str, str]) -> Defaults:
    layer: Defaults = {name: {} for name in options}
    for env in ENVIRONMENT:
        text = environ.get(env.name)
        if not text:
            continue
        for name in env.commands or tuple(options):
            action = options.get(name, {}).get(env.option)
            if action is not None:
                value = _checked(action, env.option, text, env.name, f"Unset {env.name} or fix it.")
                layer[name][action.dest] = Setting(env.option, value, text, env.name)
    return layer


def _read(path: Path, must_exist: bool) -> dict[str, object] | None:
    try:
        with open(path, "rb") as f:
            data = f.read(CONFIG_MAX_BYTES + 1)
    except FileNotFoundError:
        if must_exist:
            raise _error(
                f"{path}: no such config file ({CONFIG_ENV} names it)", f"Unset {CONFIG_ENV} or fix it."
            ) from None
        return None
    except OSError as err:
        raise _error(f"{path}: cannot read the config file: {err.strerror or err}", _fix(path)) from None
    if len(data) > CONFIG_MAX_BYTES:
        raise _error(f"{path}: not a config file (over {CONFIG_MAX_BYTES} bytes)", _fix(path))
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise _error(f"{path}: not TOML: {err}", _fix(path)) from None


def _file_layers(options: Mapping[str, Mapping[str, argparse.Action]], path: Path, must_exist: bool) -> list[Defaults]:
    """A config file's settings: those of its top level, then those of its tables."""
    table = _read(path, must_exist)
    if table is None:
        return []
    top: Defaults = {name: {} for name in options}
    tables: Defaults = {name: {} for name in options}
    for key, value in table.items():
        if isinstance(value, dict):
            continue
        option = _option(key)
        where = [name for name, known in options.items() if option in known]
        if not where:
            raise _error(f"{path}: {shown(key)} is not an option of any command", _fix(path))
        for name in where:
            action = options[name][option]
            checked = _checked(action, option, value, f"{path}: {key}", _fix(path))
            top[name][action.dest] = Setting(option, checked, _written(value), str(path))
    for command, keys in table.items():
        if not isinstance(keys, dict):
            continue
        if command not in options:
            known = ", ".join(options)
            raise _error(f"{path}: [{shown(command)[1:-1]}] is not a command ({known})", _fix(path))
        for key, value in keys.items():
            option = _option(key)
            known_action = options[command].get(option)
            if known_action is None or isinstance(value, dict):
                raise _error(f"{path}: [{command}] {shown(key)} is not an option of hangdoc {command}", _fix(path))
            checked = _checked(known_action, option, value, f"{path}: [{command}] {key}", _fix(path))
            tables[command][known_action.dest] = Setting(option, checked, _written(value), str(path))
    return [top, tables]


def _written(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else str(value)


def _option(key: str) -> str:
    return "--" + key.replace("_", "-")


def _checked(action: argparse.Action, option: str, value: object, where: str, help: str) -> object:
    """``value`` as the command line would have it for ``action``, or a ``UsageError``."""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise _error(f"{where}: {option} is a switch: true or false, not {shown(value)}", help)
        return value if isinstance(action, argparse._StoreTrueAction) else not value
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _error(f"{where}: {option} takes a string or a number, not {shown(value)}", help)
    text = str(value)
    try:
        result = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, ValueError, TypeError) as err:
        raise _error(f"{where}: {err}", help) from None
    if action.choices is not None and result not in action.choices:
        raise _error(f"{where}: {shown(text)} is not one of {', '.join(map(str, action.choices))}", help)
    return result


def _fix(path: Path) -> str:
    return (
        f"Fix or remove it in {path}: its keys are the long options that `hangdoc COMMAND --help` "
        "lists, without dashes, at the top or in a [COMMAND] table (docs/cli.md#configuration)."
    )


def _error(message: str, help: str) -> UsageError:
    return UsageError(message, help=help)
