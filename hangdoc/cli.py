"""The command line: parse, call the pipeline, print. The only place that prints and exits.

Whatever goes wrong ends in one line on stderr, ``hangdoc: error: MESSAGE``, then
``  help: WHAT TO DO``, and the error's exit code; never a traceback (an unexpected
exception is an ``InternalError``, exit 70; ``HANGDOC_DEBUG=1`` lets it through). With
``--json`` the error is also printed on stdout as one JSON object (see
``hangdoc.report.json_report.error_to_dict``). Option values are checked as they are
parsed (``hangdoc.cliargs``): argparse's own errors take the same one-line path, exit 2.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from . import __version__
from .cliargs import (
    CHECK_INTERVAL_SECONDS,
    DUMP_TIMEOUT_SECONDS,
    DURATION_FORMS,
    INTERVAL_SECONDS,
    KILL_GRACE_SECONDS,
    MAX_POSTPONE,
    MIN_STALL_SECONDS,
    RANK_OFFSET,
    STALL_FACTOR,
    STALL_SECONDS,
    WARMUP_STEPS,
    WIDTH_COLUMNS,
    WINDOW_SECONDS,
    WORLD_SIZE,
    agent_list,
    finite_float,
    include_word,
    listen_address,
    node_name,
    port,
    seconds,
    whole_number,
)
from .completion import SHELLS, completion_script
from .errors import HangdocError, InternalError, UsageError, one_line
from .model import MAX_INCLUDE
from .settings import CONFIG_ENV, ENVIRONMENT, SYSTEM_CONFIG, Defaults, load_defaults

if TYPE_CHECKING:
    from .fleet.client import RemoteNode
    from .model import Diagnosis, JobSnapshot
    from .pipeline import FleetSource
    from .report.status import StatusDisplay
    from .watch.config import Level

EXIT_OK = 0
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are ``UsageError``s, printed like every other error
    (argparse would print its usage block and exit from inside ``parse_args``)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, help=_help_of(self.prog))


def _help_of(prog: str) -> str:
    return f"Run `{prog} --help` for the accepted options."


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hangdoc",
        description="Diagnose a hung distributed PyTorch job: which ranks, which collective, why.",
        epilog=_DEFAULTS_EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"hangdoc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    output = _Parser(add_help=False)
    output.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    output.add_argument("--width", type=whole_number(WIDTH_COLUMNS), default=None, help="terminal width for the report")
    output.add_argument(
        "--color",
        choices=COLOR_CHOICES,
        default="auto",
        help="colour the report: auto (on a terminal, unless NO_COLOR is set), always (also into a "
        "pipe or file), never (default auto)",
    )
    files = output.add_argument_group("report files (docs/reports.md)")
    files.add_argument(
        "--html", metavar="FILE", help="also write a self-contained HTML report with the merged tree to explore"
    )
    files.add_argument("--dot", metavar="FILE", help="also write the merged tree as Graphviz DOT")
    files.add_argument("--svg", metavar="FILE", help="also write the merged tree as an SVG picture")
    files.add_argument(
        "--speedscope",
        metavar="FILE",
        help="also write the sampled stacks as speedscope JSON, one profile per class of ranks",
    )
    files.add_argument(
        "--folded",
        metavar="FILE",
        help="also write the sampled stacks as folded stacks, flame graph input (flamegraph.pl)",
    )

    auth = _Parser(add_help=False)
    group = auth.add_argument_group("authentication")
    group.add_argument("--token-file", metavar="FILE", help="shared secret token (at least 16 characters)")
    group.add_argument("--tls-cert", metavar="FILE", help="this side's TLS certificate (PEM)")
    group.add_argument("--tls-key", metavar="FILE", help="this side's TLS private key (PEM)")
    group.add_argument("--tls-ca", metavar="FILE", help="CA certificate that signs the other side (PEM)")

    diag = sub.add_parser(
        "diagnose",
        parents=[output, auth],
        help="capture a running job and diagnose it",
        description="Find the job's rank processes, sample their stacks, and name the hang.",
    )
    diag.add_argument(
        "job",
        metavar="JOB",
        help="HOST:PORT (the ranks' MASTER_ADDR:MASTER_PORT), pid:PID (launcher or rank), "
        "slurm:JOBID[.STEP], ray:JOB_ID (a Ray job id or submission id)",
    )
    diag.add_argument("--save", metavar="FILE", help="also save the raw snapshot (replay with analyze)")
    diag.add_argument(
        "--window",
        type=seconds(WINDOW_SECONDS),
        default=2.0,
        help="seconds to sample before a first verdict (default 2)",
    )
    diag.add_argument(
        "--interval", type=seconds(INTERVAL_SECONDS), default=0.5, help="seconds between samples (default 0.5)"
    )
    diag.add_argument(
        "--max-window",
        type=seconds(WINDOW_SECONDS),
        default=12.0,
        help="longest observation when the evidence is ambiguous (default 12)",
    )
    diag.add_argument("--native", action="store_true", help="include native (C/C++) frames in every sample")
    diag.add_argument(
        "--timeout", type=seconds(DUMP_TIMEOUT_SECONDS), default=5.0, help="seconds allowed per py-spy dump (default 5)"
    )
    diag.add_argument(
        "--include",
        action="append",
        type=include_word,
        default=[],
        metavar="WORD",
        help="also sample the job's other processes whose command line contains WORD (an inference "
        "server, a reward service), on every node searched; repeatable",
    )
    diag.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="nothing on stderr but errors (no status messages, no live status line)",
    )
    _add_ray(diag, "the diagnosis")
    remote = diag.add_argument_group("agents (multi-node)")
    remote.add_argument(
        "--agents",
        type=agent_list,
        metavar="HOST[:PORT],...",
        help="ask these `hangdoc agent`s instead of reading this node",
    )
    remote.add_argument("--hostfile", metavar="FILE", help="agent addresses, one per line")
    diag.set_defaults(func=_cmd_diagnose)

    agent = sub.add_parser(
        "agent",
        parents=[auth],
        help="serve this node's ranks to a coordinator over gRPC",
        description="Per-node agent: finds and samples the job's ranks on this node. Read-only.",
    )
    agent.add_argument(
        "--listen",
        type=listen_address,
        default="127.0.0.1:7420",
        metavar="HOST:PORT",
        help="address to listen on (default 127.0.0.1:7420, loopback only)",
    )
    agent.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback address without token or TLS (trusted networks only)",
    )
    agent.add_argument("--node-name", type=node_name, metavar="NAME", help="host name to report for this node's ranks")
    agent.add_argument(
        "--open-health",
        action="store_true",
        help="answer the gRPC health service without the token (Kubernetes' gRPC health checks); "
        "it tells only whether the agent is serving",
    )
    agent.add_argument(
        "--server",
        metavar="HOST:PORT",
        help="report this node's jobs to `hangdoc server` at this address (http(s)://HOST:PORT also "
        "accepted; https with --tls-ca), every interval the server asks for",
    )
    agent.add_argument(
        "--advertise",
        type=listen_address,
        metavar="HOST:PORT",
        help="with --server: the address the server reaches this agent at (default: the address "
        "the server sees the report come from, and --listen's port)",
    )
    agent.add_argument("--replay", metavar="FILE", help=argparse.SUPPRESS)  # benchmarks: serve a saved snapshot
    agent.add_argument("--replay-rank-offset", type=whole_number(RANK_OFFSET), default=0, help=argparse.SUPPRESS)
    agent.add_argument("--replay-world-size", type=whole_number(WORLD_SIZE), default=None, help=argparse.SUPPRESS)
    agent.set_defaults(func=_cmd_agent)

    _add_watch(sub, auth)
    _add_server(sub, auth)
    _add_completion(sub)

    run = sub.add_parser(
        "run",
        help="run a command with hangdoc's in-process probe on in all its Python processes",
        usage="hangdoc run [-v] [--] COMMAND [ARGS...]",
        description="Run COMMAND (torchrun, a launcher script, python) with the in-process probe "
        "(hangdoc.probe) started in every Python process it starts, without touching the training "
        "script: `hangdoc diagnose` then also reads each rank's flight recorder dump, step heartbeat "
        "and threads' live exceptions. hangdoc becomes COMMAND (same pid, signals and exit status) "
        "and prints nothing of its own. A Python that cannot import hangdoc runs the probe from this "
        "hangdoc's files; one started with -E or -I is reached only through the hook hangdoc installs "
        "beside itself (HANGDOC_PROBE=1), one started with -S not at all.",
    )
    run.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="each Python process says on stderr where its probe serves, or why it cannot",
    )
    run.set_defaults(func=_cmd_run, command_argv=())

    ana = sub.add_parser(
        "analyze",
        aliases=["analyse"],
        parents=[output],
        help="diagnose a snapshot saved with --save, or stack dumps you already have, offline",
        description="Diagnose a snapshot written by `hangdoc diagnose --save`, or the stack "
        "dumps of the manual debugging loop: the text of `py-spy dump` for one or many "
        "processes (--native and --locals too), `py-spy dump --json` output (concatenated or "
        "in a JSON list), or `ray stack` output. The format is told by the content; gzip is "
        "read too. Several dumps of one pid are its samples; the notes say what a dump "
        "cannot show (ranks taken from command lines or file order, progress with one dump).",
    )
    ana.add_argument(
        "bundle",
        metavar="FILE",
        help="a snapshot written by `hangdoc diagnose "
        "--save`, or py-spy / ray stack dumps, or stacks as pasted in an issue "
        "(frame lines or tracebacks under labels such as `rank 3:`); `-` reads "
        "standard input",
    )
    ana.add_argument(
        "--save",
        metavar="FILE",
        help="also write what was read as a snapshot in the current format (a first-format bundle "
        "of 100,000 ranks then loads about 4x faster; dumps become a snapshot)",
    )
    ana.add_argument("-q", "--quiet", action="store_true", help="nothing on stderr but errors (no live status line)")
    ana.set_defaults(func=_cmd_analyze)
    _finish_commands(parser)
    return parser


COLOR_CHOICES = ("auto", "always", "never")
_DEFAULTS_EPILOG = (
    "Option defaults come from, highest first: the command line; the environment ("
    + ", ".join(env.name for env in ENVIRONMENT)
    + f"); the user's config file (${CONFIG_ENV}, else $XDG_CONFIG_HOME/hangdoc/config.toml, else "
    f"~/.config/hangdoc/config.toml); {SYSTEM_CONFIG}; the built-in default. A config file's keys are "
    'long options without dashes (token_file = "/etc/hangdoc/token"), at the top or in a [COMMAND] '
    f"table (docs/cli.md#configuration). Durations take {DURATION_FORMS}."
)


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's parser by its name (aliases left out)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {p.prog.split()[-1]: p for p in dict.fromkeys(sub.choices.values())}


def _finish_commands(parser: argparse.ArgumentParser) -> None:
    """What every subcommand has: ``--version``, and a word on durations where it takes one."""
    for command in _commands(parser).values():
        command.add_argument("--version", action="version", version=f"hangdoc {__version__}")
        command.set_defaults(command_prog=command.prog)  # whose help an error points to
        if any(getattr(a.type, "__name__", "") == "duration" for a in command._actions):
            note = f"Durations take {DURATION_FORMS}."
            command.epilog = f"{command.epilog} {note}" if command.epilog else note


def _add_completion(sub: argparse._SubParsersAction[_Parser]) -> None:
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh, fish)",
        description="Print the completion script for SHELL, made from this hangdoc's own options. "
        'bash: `eval "$(hangdoc completion bash)"` in ~/.bashrc; zsh: `hangdoc completion zsh > '
        '"${fpath[1]}/_hangdoc"`; fish: `hangdoc completion fish > ~/.config/fish/completions/hangdoc.fish`.',
    )
    completion.add_argument("shell", metavar="SHELL", choices=SHELLS, help="bash, zsh or fish")
    completion.set_defaults(func=_cmd_completion)


def _cmd_completion(args: argparse.Namespace) -> int:
    sys.stdout.write(completion_script(args.shell, build_parser()))
    return EXIT_OK


def _add_ray(command: argparse.ArgumentParser, after: str) -> None:
    ray = command.add_argument_group("Ray (ray:JOB)")
    ray.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="the cluster: GCS HOST:6379, auto, ray://HOST:10001 (default: RAY_ADDRESS, else auto)",
    )
    ray.add_argument(
        "--workers",
        metavar="PATTERNS",
        default="",
        help="comma-separated shell patterns over actor class/name (default: the training workers)",
    )
    ray.add_argument("--keep-agents", action="store_true", help=f"leave the agent actors running after {after}")


def _add_server(sub: argparse._SubParsersAction[_Parser], auth: _Parser) -> None:
    server = sub.add_parser(
        "server",
        parents=[auth],
        help="watch every job the agents see; diagnose, keep and serve each hang (docs/service.md)",
        description="A standing coordinator: agents started with --server (or listed here) report their "
        "node's jobs; a job whose ranks stay still for --stall-after is diagnosed across the nodes, "
        "stored as an incident (linked to earlier ones with the same fingerprint) and served on "
        "HTTP: a page at /, the API under /api/, Prometheus metrics at /metrics. --token-file is "
        "both the token callers give (Authorization: Bearer) and the agents' token; --tls-cert/"
        "--tls-key serve HTTPS and are the client certificate towards agents (--tls-ca).",
    )
    server.add_argument(
        "--listen",
        type=listen_address,
        default="127.0.0.1:7430",
        metavar="HOST:PORT",
        help="HTTP address (default 127.0.0.1:7430, loopback only)",
    )
    server.add_argument(
        "--db",
        default="hangdoc-incidents.db",
        metavar="PATH|URL",
        help="the incident store: a SQLite file (default ./hangdoc-incidents.db) or postgresql://USER@HOST/DB "
        "(password from PGPASSWORD or ~/.pgpass); its schema is migrated on start",
    )
    # 600 s: torch.distributed's own default timeout for a collective of an NCCL process group
    # is 10 minutes, and a job that is healthy but slow (a checkpoint save, an evaluation
    # pass) stays in one place for minutes at most; hangdoc watch's bench measured step gaps
    # of seconds. A shorter timeout finds hangs sooner and costs one diagnosis per false
    # suspicion (never an incident: the diagnosis sees the job move).
    server.add_argument(
        "--stall-after",
        type=seconds(STALL_SECONDS),
        default=600.0,
        metavar="SECONDS",
        help="a job is suspected when one of its ranks keeps the same stack this long (default 600)",
    )
    server.add_argument(
        "--check-interval",
        type=seconds(CHECK_INTERVAL_SECONDS),
        default=30.0,
        metavar="SECONDS",
        help="how often agents report (each report samples each rank once) and listed agents are polled (default 30)",
    )
    server.add_argument(
        "--notify-webhook",
        metavar="URL",
        help="post each new incident here as JSON a Slack-compatible incoming webhook takes "
        "(default: HANGDOC_NOTIFY_WEBHOOK, which keeps the URL out of the process list)",
    )
    server.add_argument("--public-url", metavar="URL", help="this server's URL as people reach it, for links")
    server.add_argument(
        "--insecure", action="store_true", help="serve off loopback without a token (trusted networks only)"
    )
    server.add_argument(
        "--agents", type=agent_list, metavar="HOST[:PORT],...", help="agents to poll (besides those that report)"
    )
    server.add_argument("--hostfile", metavar="FILE", help="agents to poll, one address per line")
    server.set_defaults(func=_cmd_server)

    incidents = sub.add_parser(
        "incidents",
        help="list the incidents a `hangdoc server` keeps",
        description="List a server's incidents, newest first (GET /api/incidents).",
    )
    incidents.add_argument(
        "--server",
        default="http://127.0.0.1:7430",
        metavar="URL",
        help="the server (default: HANGDOC_SERVER, else http://127.0.0.1:7430)",
    )
    incidents.add_argument("--token-file", metavar="FILE", help="the server's token")
    incidents.add_argument("--tls-ca", metavar="FILE", help="CA certificate of an HTTPS server (PEM)")
    incidents.add_argument("--job", metavar="JOB", help="only this job's")
    incidents.add_argument("--verdict", metavar="VERDICT", help="only this verdict's")
    incidents.add_argument("--since", metavar="TIME", help="only those detected since (ISO 8601 or epoch seconds)")
    incidents.add_argument("--limit", type=whole_number((1, 1000)), default=50, metavar="N", help="at most N (50)")
    incidents.add_argument("--json", action="store_true", help="print the API's JSON object")
    incidents.set_defaults(func=_cmd_incidents)


def _add_watch(sub: argparse._SubParsersAction[_Parser], auth: _Parser) -> None:
    watch = sub.add_parser(
        "watch",
        parents=[auth],
        help="watch a job and diagnose it by itself when its steps stop",
        usage="hangdoc watch [options] -- COMMAND [ARGS...]\n       hangdoc watch [options] JOB",
        description="Wrap a launch command (after `--`) or attach to a running JOB; when the job's steps "
        "stop for longer than the stall timeout, diagnose it while it is hung and write "
        "OUT/hang-<UTC>/report.json, snapshot.json.gz, report.txt and report.html. Exit status: the wrapped "
        "command's own; 124 when --on-hang kill ended the job; 0 when an attached job ended.",
    )
    watch.add_argument(
        "job",
        metavar="JOB",
        nargs="?",
        help="attach to this running job (HOST:PORT, pid:PID, slurm:JOBID[.STEP], ray:JOB_ID)",
    )
    watch.add_argument(
        "--job",
        dest="job_of_command",
        metavar="JOB",
        help="with a wrapped command: the job it runs, when its ranks are not its "
        "descendants on this node (with --agents)",
    )
    watch.add_argument("--out", default="hangs", metavar="DIR", help="where hang reports go (default ./hangs)")
    stall = watch.add_argument_group("stall detection")
    stall.add_argument(
        "--stall-after",
        type=seconds(STALL_SECONDS),
        metavar="SECONDS",
        help="a silence this long is a stall (default: learned from the step intervals)",
    )
    stall.add_argument(
        "--warmup-steps",
        type=whole_number(WARMUP_STEPS),
        default=5,
        metavar="N",
        help="steps before the steady-state timeout applies (default 5)",
    )
    stall.add_argument(
        "--warmup-timeout",
        type=seconds(STALL_SECONDS),
        metavar="SECONDS",
        help="stall timeout during warm-up (default: --stall-after, or 600)",
    )
    stall.add_argument(
        "--stall-factor",
        type=finite_float(STALL_FACTOR),
        default=3.0,
        metavar="F",
        help="learned timeout = F x the longest step gap seen after warm-up (default 3)",
    )
    stall.add_argument(
        "--min-stall",
        type=seconds(MIN_STALL_SECONDS),
        default=30.0,
        metavar="SECONDS",
        help="the learned timeout is never shorter (default 30)",
    )
    stall.add_argument(
        "--first-step-timeout",
        type=seconds(MIN_STALL_SECONDS),
        default=120.0,
        metavar="SECONDS",
        help="during warm-up, a stall when the job is silent and every rank has been still "
        "(same stack, no CPU, no I/O) this long (default 120; 0: off)",
    )
    stall.add_argument(
        "--check-interval",
        type=seconds(CHECK_INTERVAL_SECONDS),
        metavar="SECONDS",
        help="how often to check (default 1, or 5 when stacks must be sampled)",
    )
    stall.add_argument(
        "--step-regex",
        metavar="REGEX",
        help="output lines matching this are steps (group `step` or the first group: the number)",
    )
    stall.add_argument(
        "--log", metavar="FILE", help="also watch this log file's growth (attach mode: instead of sampling stacks)"
    )
    act = watch.add_argument_group("on a hang")
    act.add_argument(
        "--on-hang",
        default="report",
        metavar="ACTION",
        help="report (default: keep watching), kill (end the job), or 'exec CMD [ARGS]' "
        "(run CMD with the report directory: where ARGS say {report}, else appended unless "
        "they say {job}, the job's id: 'exec ray job stop {job}')",
    )
    act.add_argument(
        "--kill-grace",
        type=seconds(KILL_GRACE_SECONDS),
        default=10.0,
        metavar="SECONDS",
        help="after SIGTERM, wait this long before SIGKILL (default 10)",
    )
    act.add_argument(
        "--max-postpone",
        type=whole_number(MAX_POSTPONE),
        default=3,
        metavar="N",
        help="a rank still working alone postpones the report up to N stall timeouts (default 3)",
    )
    diag = watch.add_argument_group("diagnosis")
    diag.add_argument(
        "--window", type=seconds(WINDOW_SECONDS), default=2.0, help="seconds of sampling on a stall (default 2)"
    )
    diag.add_argument(
        "--interval", type=seconds(INTERVAL_SECONDS), default=0.5, help="seconds between samples (default 0.5)"
    )
    diag.add_argument(
        "--max-window",
        type=seconds(WINDOW_SECONDS),
        default=12.0,
        help="longest observation when ambiguous (default 12)",
    )
    diag.add_argument(
        "--timeout", type=seconds(DUMP_TIMEOUT_SECONDS), default=5.0, help="seconds allowed per py-spy dump (default 5)"
    )
    met = watch.add_argument_group("metrics")
    met.add_argument(
        "--metrics-port", type=port(), metavar="PORT", help="serve Prometheus metrics on this port (0: any free port)"
    )
    met.add_argument(
        "--metrics-host", default="127.0.0.1", metavar="HOST", help="address for the metrics server (default loopback)"
    )
    met.add_argument(
        "--metrics-textfile",
        metavar="PATH",
        help="also write the metrics to this .prom file for node_exporter's textfile "
        "collector (a directory: a file of its own in it); removed when the watch ends",
    )
    _add_ray(watch, "the watch")
    remote = watch.add_argument_group("agents (multi-node)")
    remote.add_argument(
        "--agents", type=agent_list, metavar="HOST[:PORT],...", help="diagnose through these `hangdoc agent`s"
    )
    remote.add_argument("--hostfile", metavar="FILE", help="agent addresses, one per line")
    watch.add_argument("-q", "--quiet", action="store_true", help="only the hang lines on stderr")
    watch.set_defaults(func=_cmd_watch, command_argv=())


def _status(args: argparse.Namespace) -> StatusDisplay:
    """Message on stderr (``hangdoc.report.status``): a live line on a terminal, plain
    lines elsewhere or with --json, nothing with --quiet."""
    from .report.status import StatusDisplay

    return StatusDisplay.on(sys.stderr, quiet=args.quiet, json=args.json)


def _report_files(args: argparse.Namespace) -> dict[str, str | None]:
    return {kind: getattr(args, kind, None) for kind in ("html", "dot", "svg", "speedscope", "folded")}


def _emit(args: argparse.Namespace, snapshot: JobSnapshot, diagnosis: Diagnosis) -> None:
    from .report.json_report import write_json

    # The last work of a one-shot command: the snapshot and the diagnosis stay as they are,
    # so the cyclic collector need not walk them again while the report is made (at 100k
    # ranks it did, for half the time of the JSON report).
    gc.freeze()
    if any(_report_files(args).values()):  # written before the report: a failure is its only output
        from .report.files import write_reports

        write_reports(_report_files(args), diagnosis, snapshot)
    if args.json:
        write_json(diagnosis, snapshot, sys.stdout.write)  # never whole: 418 MB at a million ranks
        sys.stdout.write("\n")
        sys.stdout.flush()
        return
    from .report.console import PlainConsole
    from .report.terminal import render

    # a closed pipe raises BrokenPipeError (rich's own would exit 1): main's handler decides
    no_color, force_terminal = _colour(args.color)
    console = PlainConsole(width=args.width, no_color=no_color, force_terminal=force_terminal, pipe_errors=True)
    render(diagnosis, snapshot, console)


def _colour(choice: str) -> tuple[bool | None, bool | None]:
    """``--color`` as PlainConsole's ``no_color`` and ``force_terminal``: auto leaves both
    to rich (colour on a terminal; none where NO_COLOR is set, or TERM=dumb); never sends
    no escape sequence at all (NO_COLOR keeps bold, which is no colour)."""
    if choice == "always":
        return False, True
    if choice == "never":
        return True, False
    return None, None


def _check_report_files(args: argparse.Namespace) -> None:
    """--html/--dot/--svg/--speedscope/--folded paths that cannot be written fail now, not
    after the capture."""
    if any(_report_files(args).values()):
        from .report.files import check_targets

        check_targets(_report_files(args))


def _check_jobs(*specs: str | None) -> None:
    """Parse the job specs now: a malformed one is a usage error before anything starts."""
    from .capture.find.jobspec import parse_job_spec

    for spec in specs:
        if spec is not None:
            parse_job_spec(spec)


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from .bundle import check_save_path, save_snapshot
    from .pipeline import CaptureOptions, diagnose

    if args.max_window < args.window:
        raise _usage("need --max-window >= --window")
    _check_jobs(args.job)
    _check_report_files(args)
    if args.save:
        check_save_path(args.save)  # a link or another's file is refused now, not after the capture
    if len(args.include) > MAX_INCLUDE:
        raise _usage(f"at most {MAX_INCLUDE} --include words")
    options = CaptureOptions(
        args.window, args.interval, args.max_window, args.native, args.timeout, tuple(args.include)
    )
    nodes = _remote_nodes(args)
    with _status(args) as shown:
        snapshot, diagnosis = diagnose(
            args.job, options, shown.say, nodes, _ray_source(args, args.job, nodes), shown.update
        )
    if args.save:
        save_snapshot(snapshot, args.save)
        shown.say(f"snapshot saved to {args.save}; replay with `hangdoc analyze {args.save}`")
    _emit(args, snapshot, diagnosis)
    return EXIT_OK


def _ray_source(args: argparse.Namespace, job: str | None, nodes: object) -> FleetSource | None:
    """For a ``ray:`` job, where its ranks come from: the cluster, agents placed by Ray."""
    from .capture.find.jobspec import JobKind, parse_job_spec

    if job is None or parse_job_spec(job).kind is not JobKind.RAY:
        if args.ray_address or args.workers or args.keep_agents:
            raise _usage("--ray-address/--workers/--keep-agents are for ray:JOB jobs")
        return None
    if nodes is not None:
        raise _usage("a ray: job places its own agents; leave out --agents/--hostfile")
    from .capture.find.ray_workers import parse_patterns
    from .ray import RayOptions, fleet_source

    return fleet_source(RayOptions(args.ray_address, parse_patterns(args.workers), args.keep_agents))


def _agent_list(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """``--agents`` and ``--hostfile``. Either given on the command line leaves out the
    other's configured value (HANGDOC_AGENTS, a config file); a ``ray:`` job, which places
    its own agents, leaves out both configured values."""
    from .capture.find.jobspec import JobKind, parse_job_spec

    agents, hostfile = args.agents, args.hostfile
    given = {dest for dest in ("agents", "hostfile") if getattr(args, dest) and not _configured(args, dest)}
    job = getattr(args, "job", None) or getattr(args, "job_of_command", None)
    if given or (job is not None and parse_job_spec(job).kind is JobKind.RAY):
        agents = agents if "agents" in given else None
        hostfile = hostfile if "hostfile" in given else None
    return agents, hostfile


def _remote_nodes(args: argparse.Namespace) -> list[RemoteNode] | None:
    agents, hostfile = _agent_list(args)
    if not (agents or hostfile):
        return None
    from .fleet.client import named_agents

    nodes = named_agents(agents, hostfile, args.token_file, args.tls_cert, args.tls_key, args.tls_ca)
    if not nodes:
        raise _usage("--agents/--hostfile named no agent")
    return nodes


def _cmd_watch(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .pipeline import CaptureOptions
    from .watch.stall import StallPolicy
    from .watch.watchdog import OnHang, WatchConfig, run_watch

    if args.job and args.command_argv:
        raise _usage("give either a JOB to attach to or a command after `--`, not both")
    if args.max_window < args.window:  # each value's own range is checked as it is parsed
        raise _usage("need --max-window >= --window")
    _check_jobs(args.job, args.job_of_command)
    if args.step_regex:
        import re

        try:
            re.compile(args.step_regex)
        except re.error as err:
            raise _usage(f"--step-regex {args.step_regex!r}: {err}") from None
    nodes = _remote_nodes(args)
    policy = StallPolicy(
        args.stall_after,
        args.warmup_steps,
        args.warmup_timeout,
        args.stall_factor,
        args.min_stall,
        args.first_step_timeout,
    )
    config = WatchConfig(
        command=tuple(args.command_argv),
        job=args.job or args.job_of_command,
        out=Path(args.out),
        policy=policy,
        check_interval=args.check_interval,
        step_regex=args.step_regex,
        log=args.log,
        on_hang=OnHang.parse(args.on_hang),
        kill_grace=args.kill_grace,
        max_postpone=args.max_postpone,
        capture=CaptureOptions(args.window, args.interval, args.max_window, False, args.timeout),
        nodes=nodes,
        source=_ray_source(args, args.job or args.job_of_command, nodes),
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        metrics_textfile=Path(args.metrics_textfile) if args.metrics_textfile else None,
    )
    say = _stderr_watch if not args.quiet else _stderr_hang_only
    return run_watch(config, say)


def _stderr_watch(_level: Level, msg: str) -> None:
    print(f"hangdoc watch: {one_line(msg)}", file=sys.stderr, flush=True)


def _stderr_hang_only(level: Level, msg: str) -> None:
    """``--quiet``: a hang and its report, what the watch could not do, and the watch
    stopping early; never its status messages or warnings. Chosen by the message's level alone."""
    from .watch.config import Level

    if level in (Level.HANG, Level.ERROR, Level.STOP):
        _stderr_watch(level, msg)


def _cmd_run(args: argparse.Namespace) -> int:
    import signal

    from . import probe
    from .probe_hook import run_environment

    command = list(args.command_argv)
    if not command:
        raise _usage("hangdoc run needs a command: hangdoc run [-v] [--] COMMAND [ARGS...]")
    env = run_environment(os.environ, verbose=args.verbose)
    probe.stop()  # this process's own probe, if the hook started one: the pid becomes COMMAND's
    sys.stdout.flush()
    sys.stderr.flush()
    for name in ("SIGPIPE", "SIGXFSZ"):  # Python ignores these; COMMAND gets the defaults
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvpe(command[0], command, env)
    except OSError as err:
        what = "not found" if isinstance(err, FileNotFoundError) else (err.strerror or str(err))
        raise UsageError(
            f"cannot run {command[0]!r}: {what}",
            help="Give a command on PATH or a path to an executable: "
            "hangdoc run -- torchrun --nproc-per-node 4 train.py",
        ) from None
    return EXIT_OK  # not reached: exec replaced this process


def _cmd_agent(args: argparse.Namespace) -> int:
    from .analysis.progress import stack_position
    from .fleet.agent import AgentConfig, read_token, run_agent
    from .fleet.serverlink import server_url

    if args.advertise and not args.server:
        raise _usage("--advertise is for --server")
    if args.server:
        server_url(args.server, tls=bool(args.tls_ca))  # a malformed address fails now
    token = read_token(args.token_file) if args.token_file else None
    config = AgentConfig(
        args.listen,
        token,
        args.tls_cert,
        args.tls_key,
        args.tls_ca,
        args.insecure,
        host=args.node_name,
        open_health=args.open_health,
        replay=args.replay,
        replay_rank_offset=args.replay_rank_offset,
        replay_world_size=args.replay_world_size,
        server=args.server,
        advertise=args.advertise,
        position=stack_position,
    )
    return run_agent(config)


def _cmd_server(args: argparse.Namespace) -> int:
    from .fleet.agent import read_token
    from .fleet.client import AgentAuth, parse_agents
    from .service.loop import ServiceConfig
    from .service.serve import ServerOptions, run_server

    if bool(args.tls_cert) != bool(args.tls_key):
        raise _usage("HTTPS needs both --tls-cert and --tls-key")
    token = read_token(args.token_file) if args.token_file else None
    listed = _agent_list(args)
    agents = tuple(parse_agents(*listed)) if any(listed) else ()
    config = ServiceConfig(
        stall_after=args.stall_after,
        check_interval=args.check_interval,
        agents=agents,
        auth=AgentAuth(token, args.tls_cert, args.tls_key, args.tls_ca),
        public_url=args.public_url,
    )
    options = ServerOptions(
        listen=args.listen,
        db=args.db,
        service=config,
        token=token,
        tls=(args.tls_cert, args.tls_key) if args.tls_cert else None,
        insecure=args.insecure,
        notify_webhook=args.notify_webhook,
    )
    return run_server(options)


def _cmd_incidents(args: argparse.Namespace) -> int:
    from .fleet.agent import read_token
    from .service.incidents_cli import fetch_incidents, render_incidents

    token = read_token(args.token_file) if args.token_file else None
    answer = fetch_incidents(args.server, token, args.tls_ca, args.job, args.verdict, args.since, args.limit)
    if args.json:
        import json

        sys.stdout.write(json.dumps(answer, indent=2) + "\n")
    else:
        sys.stdout.write(render_incidents(answer))
    return EXIT_OK


def _cmd_analyze(args: argparse.Namespace) -> int:
    from .analysis.analyse import analyse
    from .bundle import check_save_path, first, save_snapshot
    from .capture.dumps.dumpfile import load_evidence

    _check_report_files(args)
    if args.save:
        check_save_path(args.save)
    with _status(args) as shown, shown.busy(f"reading {args.bundle}") as now_doing:
        # a saved snapshot, or py-spy / ray stack dumps / pasted stacks; `-`: standard input
        snapshot = load_evidence(args.bundle, sys.stdin.buffer if args.bundle == "-" else None)
        count = len(snapshot.ranks)
        now_doing(f"analysing {count} rank{'' if count == 1 else 's'}")
        diagnosis = analyse(snapshot)
        if args.save:
            now_doing(f"saving {args.save}")
            save_snapshot(snapshot, args.save)
    if args.save:
        shown.say(f"snapshot saved to {args.save}; replay with `hangdoc analyze {args.save}`")
    elif count >= first.NOTICE_RANKS and args.bundle != "-" and first.declared_version(args.bundle) == 1:
        shown.say(
            f"{args.bundle} is a snapshot in the first format, which loads {first.SLOWER} times slower "
            f"than the current one: `hangdoc analyze {args.bundle} --save NEW.json.gz` converts it"
        )
    _emit(args, snapshot, diagnosis)
    return EXIT_OK


def _usage(message: str) -> HangdocError:
    return UsageError(message)


def _configure(commands: dict[str, argparse.ArgumentParser], defaults: Defaults) -> None:
    """Make the configured values the commands' defaults, and list them in their help."""
    for name, settings in defaults.items():
        command = commands[name]
        command.set_defaults(**{dest: setting.value for dest, setting in settings.items()})
        command.set_defaults(configured=settings)
        if settings:
            listed = "; ".join(f"{s.option} {s.text} ({s.source})" for s in settings.values())
            command.epilog = f"{command.epilog or ''} Configured defaults: {listed}.".strip()


def _configured(args: argparse.Namespace, dest: str) -> bool:
    """Whether ``dest``'s value is the one the environment or a config file set (not given
    on the command line, or given as the same)."""
    setting = getattr(args, "configured", {}).get(dest)
    return setting is not None and getattr(args, dest, None) == setting.value


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if argv and argv[0] == "watch" and "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    elif argv and argv[0] == "run":
        argv, command = _split_run(argv)
    wants_json = "--json" in argv  # until the arguments are parsed, or fail to be
    args = None
    try:
        parser = build_parser()
        commands = _commands(parser)
        try:
            _configure(commands, load_defaults(commands, os.environ))
            unusable: HangdocError | None = None
        except HangdocError as err:  # --help and --version still answer
            unusable = err
        args, extra = parser.parse_known_args(argv)
        if extra:  # the command's parser would not take them: its help is the one to read
            prog = getattr(args, "command_prog", parser.prog)
            raise UsageError(f"unrecognized arguments: {' '.join(extra)}", help=_help_of(prog))
        wants_json = bool(getattr(args, "json", False))
        if command:
            args.command_argv = command
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return 2
        if unusable is not None:
            raise unusable
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except HangdocError as err:
        help_text = err.help
        prog = getattr(args, "command_prog", None)
        if isinstance(err, UsageError) and "help" not in vars(err) and prog:
            help_text = _help_of(prog)  # a usage error found by the command itself
        return _fail(type(err).__name__, str(err), help_text, err.exit_code, wants_json)
    except KeyboardInterrupt:
        return _fail("Interrupted", "interrupted", "", EXIT_INTERRUPTED, wants_json)
    except BrokenPipeError:  # `hangdoc ... | head`: the reader has gone, so has the output
        _drop_stdout()
        return EXIT_OK
    except Exception as exc:  # a bug: one line, and the traceback on request
        if os.environ.get("HANGDOC_DEBUG"):
            raise
        bug = InternalError(f"internal error: {type(exc).__name__}: {exc}")
        return _fail(type(bug).__name__, str(bug), bug.help, bug.exit_code, wants_json)


def _split_run(argv: list[str]) -> tuple[list[str], list[str]]:
    """``run``'s own options, and the command: after ``--``, or from the first argument
    that is not an option (``hangdoc run torchrun --nproc-per-node 2 train.py``)."""
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "--":
            return argv[:i], argv[i + 1 :]
        if not arg.startswith("-"):
            return argv[:i], argv[i:]
    return argv, []


def _fail(kind: str, message: str, help_text: str, exit_code: int, wants_json: bool) -> int:
    """Print an error: one line on stderr (and its help), with --json also the error object
    on stdout (``kind``: the error's class name, or "Interrupted" for Ctrl-C)."""
    message, help_text = one_line(message), one_line(help_text)
    try:
        if wants_json:
            from .report.json_report import dumps, error_to_dict

            sys.stdout.write(dumps(error_to_dict(kind, message, help_text, exit_code)) + "\n")
            sys.stdout.flush()
    except BrokenPipeError:
        _drop_stdout()
    if kind == "Interrupted":
        print(f"hangdoc: {message}", file=sys.stderr, flush=True)
        return exit_code
    print(f"hangdoc: error: {message}", file=sys.stderr, flush=True)
    if help_text and not os.environ.get("HANGDOC_NO_HELP"):
        print(f"  help: {help_text}", file=sys.stderr)
    return exit_code


def _drop_stdout() -> None:
    """Point stdout's descriptor at /dev/null: what is still buffered for the closed pipe is
    then flushed there at exit instead of failing again as "Exception ignored ... BrokenPipeError"."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (tests capture it)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
