"""Every command the docs quote is one hangdoc takes, and the ones that can run here run.

Read from README.md and docs/*.md (not docs/cli.md, which tools/gen_docs.py writes from the
parser itself):

- a command is a line of a fenced code block that starts with ``hangdoc ``, ``$ hangdoc ``,
  ``python -m hangdoc`` or ``make `` (after ``VAR=value`` assignments), continuation lines
  joined and ``#`` comments dropped. A block with ``$ `` lines is a transcript: only those
  are commands. A ``text`` block, and a line such as ``hangdoc watch: ...`` (hangdoc's own
  messages name the program, then a colon), is output, not a command;
- every option a ``hangdoc`` command names must be one of its subcommand's, and the command
  must parse, after the placeholders of ``PLACEHOLDERS`` and ``SHELL_VARIABLES`` are given
  sample values; an inline code span that starts with ``hangdoc SUBCOMMAND`` must name a
  subcommand and options it has; ``make TARGET`` must name a target of the Makefile;
- an inline ``--option`` in a paragraph that names a hangdoc command must be an option of
  some subcommand, or of another tool in ``OTHER_TOOLS``;
- a command runs here (a real process, checked for exit status 0 and output) when it needs
  no job, agent or network: a ``--help``/``--version`` form, a subcommand in ``OFFLINE``
  whose input files are in this repository, or a make target in ``MAKE_RUNNABLE``.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.paths import REPO

from hangdoc.capture.find.jobspec import parse_job_spec
from hangdoc.cli import build_parser
from hangdoc.errors import HangdocError

# written by tools/gen_docs.py from the parser itself (troubleshooting.md, the errors' help
# texts, is read: a help that names an option must name one hangdoc has)
GENERATED = ("cli.md",)
DOCS = tuple(p for p in (REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))) if p.name not in GENERATED)

# Placeholders the docs write for a value the reader fills in, where the value is checked
# (a job spec, a number), and a sample value that passes. Most are not (`--token-file FILE`,
# `--server SERVER:7430`: any word parses); replaced longest first, whole words only.
PLACEHOLDERS = {
    "MASTER_ADDR:MASTER_PORT": "10.0.0.1:29500",
    "HOST:PORT": "10.0.0.1:29500",
    "JOBID": "1234",
    "PID": "4242",
}
# shell variables the docs' commands expand (Slurm's and torchrun's), with sample values
SHELL_VARIABLES = {"SLURM_JOB_ID": "1234", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}

# Subcommands that read only what they are given (files, standard input, the parser): no
# job, agent, server or network. The others are parsed only.
OFFLINE = ("analyze", "analyse", "completion")
# `make help` lists the targets; every other target builds .venv, starts jobs or deletes
MAKE_RUNNABLE = ("help",)

# Options of other programs that the docs name beside hangdoc's: what hangdoc reads (py-spy
# dumps made with --locals/--native), how a Python is started (the probe's start-up table),
# what a container needs for hangdoc to read its processes (the permission help)
OTHER_TOOLS = {
    "py-spy": ("--locals", "--native", "--json"),
    "python": ("-S", "-E", "-I", "-m"),
    "docker run": ("--cap-add", "--pid"),
}

SUBCOMMAND = r"(?:diagnose|agent|watch|server|incidents|run|analy[sz]e|completion)"
_COMMAND_START = re.compile(r"^(?:\$ )?(?:[A-Za-z_][A-Za-z0-9_]*=\S* )*(?:hangdoc|python3? -m hangdoc|make)(?: |$)")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# hangdoc's messages name the program, then a colon: `hangdoc: error: ...`, `hangdoc watch: ...`
_MESSAGE = re.compile(r"^(?:\$ )?hangdoc(?: [a-z]+)?: ")
_SHELL_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
_SHELL_OPERATORS = ("|", "||", "&&", ";", "&", ">", ">>", "2>", "2>&1", "<")
_SPAN = re.compile(r"(`+)(.+?)\1")
_NAMES_A_COMMAND = re.compile(rf"hangdoc {SUBCOMMAND}\b|`{SUBCOMMAND}`")


@dataclass(frozen=True)
class Quoted:
    """A command as a doc quotes it: where, its words (the program first)."""

    doc: Path
    line: int
    text: str
    words: tuple[str, ...]
    problem: str = ""  # why its words could not be read

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


def _words(text: str) -> tuple[str, ...]:
    """The shell words of one command: shell variables given sample values, comments and
    anything after a pipe or redirection dropped, ``python -m hangdoc`` read as ``hangdoc``."""

    def variable(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in SHELL_VARIABLES:
            raise KeyError(f"${name}: add a sample value to SHELL_VARIABLES")
        return SHELL_VARIABLES[name]

    words = shlex.split(text.removeprefix("$ "), comments=True)
    for i, word in enumerate(words):
        if word in _SHELL_OPERATORS:
            words = words[:i]
            break
    words = [_SHELL_VARIABLE.sub(variable, word) for word in words]
    while words and _ASSIGNMENT.match(words[0]):
        words = words[1:]
    if words[:3] in (["python", "-m", "hangdoc"], ["python3", "-m", "hangdoc"]):
        words = ["hangdoc", *words[3:]]
    return tuple(words)


def _fenced_commands(doc: Path) -> list[Quoted]:
    """The commands of a doc's fenced code blocks (the rules at the top of this file)."""
    found: list[Quoted] = []
    lines = doc.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = lines[i].strip()
        i += 1
        if not opening.startswith("```"):
            continue
        block_start = i
        while i < len(lines) and not lines[i].strip().startswith("```"):
            i += 1
        block = lines[block_start:i]
        i += 1
        if opening.removeprefix("```").strip() == "text":
            continue
        transcript = any(line.startswith("$ ") for line in block)
        j = 0
        while j < len(block):
            start, text = block_start + j + 1, block[j].strip()
            j += 1
            while text.endswith("\\") and j < len(block):
                text = text[:-1] + " " + block[j].strip()
                j += 1
            if transcript and not text.startswith("$ "):
                continue
            if not _COMMAND_START.match(text) or _MESSAGE.match(text):
                continue
            try:
                found.append(Quoted(doc, start, text, _words(text)))
            except (ValueError, KeyError) as err:
                found.append(Quoted(doc, start, text, ("hangdoc",), f"cannot be read as shell words: {err}"))
    return found


def _paragraphs(doc: Path) -> list[tuple[int, list[int], str]]:
    """The prose of a doc, paragraph by paragraph (fenced blocks left out): its first line,
    where each of its lines starts in its text, and its text (lines joined by spaces)."""
    paragraphs: list[tuple[int, list[int], str]] = []
    first, starts, text = 0, [], ""
    fenced = False
    for number, line in enumerate(doc.read_text().splitlines(), start=1):
        fence = line.strip().startswith("```")
        fenced = fenced != fence
        if fenced or fence or not line.strip():
            if text:
                paragraphs.append((first, starts, text))
                starts, text = [], ""
            continue
        if text and line.lstrip().startswith("|"):  # a table's row is a paragraph of its own
            paragraphs.append((first, starts, text))
            starts, text = [], ""
        if not text:
            first = number
        starts.append(len(text) + 1 if text else 0)
        text = f"{text} {line.strip()}" if text else line.strip()
    if text:
        paragraphs.append((first, starts, text))
    return paragraphs


def _spans(doc: Path) -> list[tuple[int, str, str]]:
    """Every inline code span: the line it starts on, the span, its paragraph."""
    return [
        (first + sum(1 for start in starts[1:] if start <= match.start()), match.group(2).strip(), text)
        for first, starts, text in _paragraphs(doc)
        for match in _SPAN.finditer(text)
        if match.group(2).strip()
    ]


def _inline_commands(doc: Path) -> list[Quoted]:
    """Inline spans that quote a hangdoc or make command (`hangdoc run [-v] [--] COMMAND`,
    `make help`): a usage line's brackets are read as spaces."""
    found = []
    for line, span, _ in _spans(doc):
        if re.match(r"(hangdoc|make) [\w-]", span):
            try:
                found.append(Quoted(doc, line, span, _words(re.sub(r"[][]", " ", span))))
            except (ValueError, KeyError) as err:
                found.append(Quoted(doc, line, span, ("hangdoc",), f"cannot be read as shell words: {err}"))
    return found


FENCED = [command for doc in DOCS for command in _fenced_commands(doc)]
HANGDOC = [c for c in FENCED if c.words[0] == "hangdoc"]
READABLE = [c for c in HANGDOC if not c.problem]
MAKE = [c for c in FENCED if c.words[0] == "make"]
INLINE = [command for doc in DOCS for command in _inline_commands(doc)]
INLINE_HANGDOC = [c for c in INLINE if c.words[0] == "hangdoc"]


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's parser by every name it answers to (aliases too)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


PARSER = build_parser()
COMMANDS = _commands(PARSER)
EVERY_OPTION = _options(PARSER).union(*(_options(p) for p in COMMANDS.values()))


def _subcommand(words: tuple[str, ...]) -> str | None:
    return next((w for w in words[1:] if not w.startswith("-")), None)


def _own_words(words: tuple[str, ...]) -> list[str]:
    """hangdoc's own words of a command, without the command it wraps (`hangdoc watch ...
    -- CMD`, `hangdoc run CMD`), split off as ``hangdoc.cli.main`` does: at ``--``, and for a
    subcommand that takes no positional argument of its own, at its first positional word."""
    own = list(words[1:])
    name = _subcommand(words)
    command = COMMANDS.get(name or "")
    if command is None or command.get_default("command_argv") is None:
        return own
    if "--" in own:
        return own[: own.index("--")]
    if not any(not a.option_strings for a in command._actions):
        after = own.index(name) + 1 if name in own else 0
        first = next((i for i in range(after, len(own)) if not own[i].startswith("-")), len(own))
        return own[:first]
    return own


def _unknown_options(words: tuple[str, ...]) -> list[str]:
    """The options a hangdoc command names (before any command it wraps) that its subcommand
    (or hangdoc itself, with none) does not have."""
    own = _own_words(words)
    name = _subcommand(("hangdoc", *own))
    known = _options(COMMANDS[name]) if name in COMMANDS else _options(PARSER)
    options = [w.strip("[]").split("=", 1)[0] for w in own if w.startswith("-") and w not in ("-", "--")]
    return [o for o in options if o not in known]


def _sample_values(words: list[str]) -> list[str]:
    filled = []
    for word in words:
        for placeholder in sorted(PLACEHOLDERS, key=len, reverse=True):
            whole = rf"(?<![\w]){re.escape(placeholder)}(?![\w])"  # `FILE`, not `PROFILE`
            word = re.sub(whole, PLACEHOLDERS[placeholder], word)
        filled.append(word)
    return filled


def _asks_for_help(words: tuple[str, ...]) -> bool:
    return any(w in ("-h", "--help", "--version") for w in _own_words(words))


def test_the_docs_quote_commands() -> None:
    # the extraction itself: a change to the docs' layout that hides every command fails here
    assert len(HANGDOC) >= 20 and len(MAKE) >= 2 and len(INLINE_HANGDOC) >= 20
    assert all(c.words[0] in ("hangdoc", "make") for c in FENCED)


@pytest.mark.parametrize("quoted", HANGDOC, ids=lambda c: c.where)
def test_a_quoted_command_names_options_its_subcommand_has(quoted: Quoted) -> None:
    assert not quoted.problem, f"{quoted.where}: {quoted.problem}: {quoted.text}"
    name = _subcommand(quoted.words)
    assert name is None or name in COMMANDS, f"{quoted.where}: no subcommand {name!r}: {quoted.text}"
    unknown = _unknown_options(quoted.words)
    assert not unknown, f"{quoted.where}: `hangdoc {name}` has no option {', '.join(unknown)}: {quoted.text}"


@pytest.mark.parametrize("quoted", [c for c in READABLE if not _asks_for_help(c.words)], ids=lambda c: c.where)
def test_a_quoted_command_parses(quoted: Quoted) -> None:
    argv = _sample_values(_own_words(quoted.words))
    try:
        args = PARSER.parse_args(argv)
    except HangdocError as err:
        pytest.fail(f"{quoted.where}: {err} (parsed as {shlex.join(argv)}): {quoted.text}")
    command = COMMANDS[_subcommand(("hangdoc", *argv)) or ""]
    for action in command._actions:
        if not action.option_strings and action.metavar == "JOB" and getattr(args, action.dest) is not None:
            try:
                parse_job_spec(getattr(args, action.dest))
            except HangdocError as err:
                pytest.fail(f"{quoted.where}: {err}: {quoted.text}")


@pytest.mark.parametrize("quoted", INLINE_HANGDOC, ids=lambda c: c.where)
def test_an_inline_command_names_options_its_subcommand_has(quoted: Quoted) -> None:
    assert not quoted.problem, f"{quoted.where}: {quoted.problem}: `{quoted.text}`"
    name = _subcommand(quoted.words)
    unknown = _unknown_options(quoted.words)
    assert not unknown, f"{quoted.where}: `hangdoc {name}` has no option {', '.join(unknown)}: `{quoted.text}`"


def _quoted_elsewhere(paragraph: str) -> set[str]:
    """Options of another program's command line quoted in the same paragraph (`python
    bench/bench_fanout.py --per-process 625`): that program's, not hangdoc's."""
    return {
        word.split("=", 1)[0]
        for match in _SPAN.finditer(paragraph)
        if not re.match(r"hangdoc\b|-", match.group(2).strip())
        for word in match.group(2).split()
        if word.startswith("-")
    }


def test_every_option_named_beside_a_hangdoc_command_exists() -> None:
    others = {flag for flags in OTHER_TOOLS.values() for flag in flags}
    wrong = []
    for doc in DOCS:
        for line, span, paragraph in _spans(doc):
            if not span.startswith("-") or span in ("-", "--") or not _NAMES_A_COMMAND.search(paragraph):
                continue
            allowed = EVERY_OPTION | others | _quoted_elsewhere(paragraph)
            for flag in span.split()[0].split("/"):
                name = flag.split("=", 1)[0]
                if re.fullmatch(r"--?[A-Za-z][\w-]*", name) and name not in allowed:
                    wrong.append(f"{doc.relative_to(REPO)}:{line}: `{span}`")
    assert not wrong, "options no hangdoc command has:\n" + "\n".join(wrong)


def test_every_make_target_named_exists() -> None:
    targets = set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), flags=re.MULTILINE))
    quoted = MAKE + [c for c in INLINE if c.words[0] == "make"]
    wrong = [
        f"{c.where}: {c.text}"
        for c in quoted
        for word in c.words[1:]
        if not word.startswith("-") and "=" not in word and word not in targets
    ]
    assert len(quoted) >= 5
    assert not wrong, "no such make target:\n" + "\n".join(wrong)


def _runnable(quoted: Quoted) -> bool:
    if quoted.problem:
        return False
    if quoted.words[0] == "make":
        return all(w in MAKE_RUNNABLE for w in quoted.words[1:])
    if _subcommand(quoted.words) not in (None, *COMMANDS):  # `hangdoc COMMAND --help`: a placeholder
        return False
    if _asks_for_help(quoted.words):
        return True
    if _subcommand(quoted.words) not in OFFLINE:
        return False
    try:
        reads = _input_files(quoted)
    except HangdocError:  # not a whole command (`hangdoc analyze` in prose); fenced ones fail above
        return False
    return "-" not in reads and all((REPO / path).exists() for path in reads)  # `-`: needs a pipe


def _input_files(quoted: Quoted) -> list[str]:
    """The files a command reads: the values of its positional arguments named FILE/PATH/DIR."""
    args = PARSER.parse_args(_sample_values(_own_words(quoted.words)))
    command = COMMANDS[_subcommand(quoted.words) or ""]
    return [
        getattr(args, a.dest)
        for a in command._actions
        if not a.option_strings and str(a.metavar) in ("FILE", "PATH", "DIR")
    ]


# each distinct command once, where it is first quoted
RUNNABLE = list({c.words: c for c in reversed(FENCED + INLINE) if _runnable(c)}.values())[::-1]


def test_commands_that_need_no_job_are_quoted() -> None:
    # the rule below runs something: the docs keep at least one offline command that works
    assert any(_subcommand(c.words) in OFFLINE for c in RUNNABLE) and any(c.words[0] == "make" for c in RUNNABLE)


@pytest.mark.parametrize("quoted", RUNNABLE, ids=lambda c: c.where)
def test_a_quoted_command_that_needs_no_job_runs_as_written(quoted: Quoted, tmp_path: Path) -> None:
    if quoted.words[0] == "make":
        if shutil.which("make") is None:
            pytest.skip("make is not installed")
        argv, cwd = list(quoted.words), REPO
    else:
        # report files the command writes go to tmp_path; the files it reads are the repository's
        reads = set(_input_files(quoted)) if not _asks_for_help(quoted.words) else set()
        installed = Path(sys.executable).parent / "hangdoc"
        program = [str(installed)] if installed.exists() else [sys.executable, "-m", "hangdoc"]
        argv = program + [str(REPO / w) if w in reads else w for w in quoted.words[1:]]
        cwd = tmp_path
    # as a newcomer has it: no hangdoc settings of this machine's user (a config file, HANGDOC_*)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGDOC_")}
    env.update(NO_COLOR="1", HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"))
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"{quoted.where}: {quoted.text}: exit {done.returncode}\n{done.stderr}"
    assert done.stdout.strip(), f"{quoted.where}: {quoted.text}: printed nothing"
    assert "Traceback" not in done.stderr
