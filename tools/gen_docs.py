"""Generate docs/cli.md (from the argument parser) and docs/troubleshooting.md (from the
errors' own help texts). ``python tools/gen_docs.py`` rewrites them; ``--check`` fails when
they are stale (run by the tests)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hangdoc import errors, settings
from hangdoc.cli import build_parser
from hangdoc.model import CaptureErrorKind


def cli_reference() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: fix it for stable output
    parser = build_parser()
    parts = [
        "# CLI reference",
        "",
        "Generated from the parser by `python tools/gen_docs.py`.",
        "",
        "```",
        parser.format_help().rstrip(),
        "```",
        "",
    ]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    seen = set()
    for name, command in sub.choices.items():
        if id(command) in seen:
            continue
        seen.add(id(command))
        parts += [f"## hangdoc {name}", "", "```", command.format_help().rstrip(), "```", ""]
    return "\n".join(parts + configuration(sub.choices))


def configuration(commands: dict[str, argparse.ArgumentParser]) -> list[str]:
    """The config files, the environment variables and the keys each command takes."""
    parts = [
        "## Configuration",
        "",
        "Option defaults come from, highest first: the command line; the environment; the "
        f"user's config file (`${settings.CONFIG_ENV}`, else `$XDG_CONFIG_HOME/hangdoc/config.toml`, "
        f"else `~/.config/hangdoc/config.toml`); the system's (`{settings.SYSTEM_CONFIG}`); the "
        "built-in default. A missing file is skipped (one named by "
        f"`{settings.CONFIG_ENV}` must exist). `hangdoc COMMAND --help` lists the defaults "
        "configured for that command and where each comes from.",
        "",
        "A config file is TOML. Its keys are long options without the dashes (`token_file` or "
        '`token-file`), with the values the command line takes (durations as `"5s"` or `5`, '
        "switches as `true`/`false`): at the top for every command that has the option, in a "
        "`[COMMAND]` table for that command only (over the top). An unknown key or table, or "
        "a bad value, stops the command with an error naming the file and the key (`--help` "
        "and `--version` still answer). Repeatable options (`--include`) are not configurable.",
        "",
        "```toml",
        'agents = "node1:7431,node2:7431"',
        'token_file = "/etc/hangdoc/token"',
        "",
        "[diagnose]",
        'window = "5s"',
        "",
        "[watch]",
        'stall_after = "10m"',
        "```",
        "",
        "Setting `--agents` or `--hostfile` at one level (the command line, the environment, "
        "a file, a table) drops what a lower level set for the other. A `ray:` job places its "
        "own agents: configured ones are left out for it.",
        "",
        "| environment variable | option | commands |",
        "|---|---|---|",
    ]
    for env in settings.ENVIRONMENT:
        where = ", ".join(env.commands) if env.commands else "every command that has it"
        parts.append(f"| `{env.name}` | `{env.option}` | {where} |")
    parts += ["", "| command | config keys |", "|---|---|"]
    seen = set()
    for name, command in commands.items():
        if id(command) in seen:
            continue
        seen.add(id(command))
        keys = [option[2:].replace("-", "_") for option in settings.configurable(command)]
        parts.append(f"| `{name}` | {', '.join(f'`{k}`' for k in keys) or '-'} |")
    return parts + [""]


def troubleshooting() -> str:
    import importlib

    for module in ("hangdoc.fleet.client", "hangdoc.fleet.wire"):  # they define error classes
        importlib.import_module(module)
    parts = [
        "# Troubleshooting",
        "",
        (
            "Every error hangdoc can stop with, its exit code, and the help it prints. "
            "Generated from `hangdoc/errors.py` by `python tools/gen_docs.py`."
        ),
        "",
        "| error | exit code | help printed |",
        "|---|---|---|",
    ]
    classes = [errors.HangdocError, *sorted(_subclasses(errors.HangdocError), key=lambda c: (c.exit_code, c.__name__))]
    for cls in classes:
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        parts.append(f"| `{cls.__name__}`: {doc} | {cls.exit_code} | {cls.help or '-'} |")
    parts += [
        "",
        "## Per-rank problems (reported, not fatal)",
        "",
        (
            "A rank that cannot be read does not stop the diagnosis: it is listed with its reason "
            "and the verdict says when it rests on partial evidence."
        ),
        "",
        "| reason | meaning |",
        "|---|---|",
    ]
    for kind in CaptureErrorKind:
        doc = _member_doc(kind)
        parts.append(f"| `{kind.value}` | {doc} |")
    return "\n".join(parts) + "\n"


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out.add(sub)
        out |= _subclasses(sub)
    return out


def _member_doc(member: CaptureErrorKind) -> str:
    import ast
    import inspect

    source = inspect.getsource(CaptureErrorKind)
    tree = ast.parse(source)
    body = tree.body[0].body  # type: ignore[attr-defined]
    for i, node in enumerate(body):
        if isinstance(node, ast.Assign) and node.targets[0].id == member.name:  # type: ignore[attr-defined]
            nxt = body[i + 1] if i + 1 < len(body) else None
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                return str(nxt.value.value)
    return ""


OUTPUTS = {"docs/cli.md": cli_reference, "docs/troubleshooting.md": troubleshooting}


def main() -> int:
    check = "--check" in sys.argv
    stale = []
    for rel, make in OUTPUTS.items():
        path = ROOT / rel
        text = make()
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(rel)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run python tools/gen_docs.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
