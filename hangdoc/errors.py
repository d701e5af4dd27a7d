"""Errors a user can act on: each carries its own help text and a process exit code.

Only the CLI prints them and exits; library code raises them. Conditions that concern one
rank (a pid that vanished, ptrace refused for one process) are not errors: they are
recorded in the snapshot as ``CaptureError`` values and reported.
"""

from __future__ import annotations

import os

# Characters that must never reach a terminal as they are: C0 controls (ESC starts the
# sequences that clear the screen, retitle the window, move the cursor; CR overwrites a
# line), DEL, C1 controls (0x9b is a one-byte CSI), bidirectional overrides and isolates
# (U+202E shows text backwards: "Trojan Source"), the Unicode line/paragraph separators,
# and lone surrogates (from JSON "\ud800" escapes: they cannot even be encoded to UTF-8).
UNSAFE_CHARACTERS = [
    *range(0x20),
    0x7F,
    *range(0x80, 0xA0),
    0x061C,
    0x200E,
    0x200F,
    0x2028,
    0x2029,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
    *range(0xD800, 0xE000),
]
_SHORT_ESCAPES = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
_PRINTABLE = str.maketrans(
    {cp: _SHORT_ESCAPES.get(cp) or (f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}") for cp in UNSAFE_CHARACTERS}
)
MESSAGE_MAX_CHARS = 2000  # an error line longer than this is cut (a 1 MB job spec, say)


def printable(text: str) -> str:
    """``text`` with every control, bidi-override and surrogate character written as an
    escape (``\\x1b``, ``\\u202e``, ``\\n``), so text that comes from a job or a file can be
    shown but can never drive the terminal. Everything else, non-ASCII included, is kept."""
    return text.translate(_PRINTABLE)


def one_line(text: str, limit: int = MESSAGE_MAX_CHARS) -> str:
    """``printable(text)`` cut to ``limit`` characters: what an error line may show."""
    text = printable(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def shown(value: object, limit: int = 60) -> str:
    """``repr(value)`` for a message, cut to about ``limit`` characters."""
    if isinstance(value, str) and len(value) > limit:
        return f"{printable(repr(value[:limit]))}… ({len(value)} characters)"
    text = printable(repr(value))
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def described(err: BaseException) -> str:
    """``Type: message (file:line)`` of where ``err`` was raised: an unexpected error (a bug)
    in one line."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    at = f" ({os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno})" if tb is not None else ""
    message = " ".join(str(err).split())
    return f"{type(err).__name__}: {message[:500]}{at}"


class HangdocError(Exception):
    """Base class. ``str(err)`` is one line; ``help`` says what to do about it."""

    exit_code = 2
    help: str = ""

    def __init__(self, message: str, help: str | None = None) -> None:
        super().__init__(message)
        if help is not None:
            self.help = help


class UsageError(HangdocError):
    """The command line or a job spec is malformed."""

    exit_code = 2
    help = "Run `hangdoc --help` for the accepted forms."


class JobNotFound(HangdocError):
    """A job spec matched no rank process."""

    exit_code = 3
    help = (
        "Check the spec: HOST:PORT must equal the ranks' MASTER_ADDR/MASTER_PORT, pid:PID "
        "must be a launcher or rank on this node. Run as the job's user or root."
    )

    def __init__(
        self, message: str, help: str | None = None, unreachable: tuple[str, ...] = (), running: bool = False
    ) -> None:
        super().__init__(message, help)
        # nodes that did not answer the search: with any, "not found" only means "not found
        # where we could look"
        self.unreachable = unreachable
        # the job itself is still running without ranks for now (a scheduler restarting its
        # workers): they may come back, so a watch keeps watching
        self.running = running


class PySpyMissing(HangdocError):
    """No py-spy executable could be found."""

    exit_code = 4
    help = (
        "Install py-spy into hangdoc's environment (`pip install py-spy`) or put it on PATH; "
        "hangdoc looks next to its own interpreter first."
    )


class PermissionDenied(HangdocError):
    """The kernel refused to let hangdoc read the job's processes."""

    exit_code = 5
    help = (
        "Run as root or as the job's user with ptrace allowed: "
        "`sysctl kernel.yama.ptrace_scope=0`; in Docker `--cap-add SYS_PTRACE`; in Kubernetes "
        "`securityContext: {capabilities: {add: [SYS_PTRACE]}}` and `hostPID: true`."
    )


class BundleError(HangdocError):
    """A saved snapshot could not be read."""

    exit_code = 6
    help = "Pass a file written by `hangdoc diagnose --save`; it is JSON with a `schema_version`."


class DumpFileError(BundleError):
    """A file given to ``hangdoc analyze`` is neither a snapshot nor a stack dump it reads."""

    exit_code = 6  # like BundleError: the input file cannot be read
    help = (
        "`hangdoc analyze` reads a snapshot written by `hangdoc diagnose --save`, the text "
        "`py-spy dump` prints (one or more processes, with --native or --locals too), "
        "`py-spy dump --json` output (one or more dumps, concatenated or in a JSON list), "
        "`ray stack` output, stacks as pasted in issues (`func (file:line)` frame lines under "
        "labels such as `rank 3:`, Python tracebacks, faulthandler output), or a directory of "
        "flight recorder dumps; `-` reads standard input."
    )


class RayNotInstalled(HangdocError):
    """``ray:JOB_ID`` needs Ray in hangdoc's environment and it is not there."""

    exit_code = 4  # like PySpyMissing: a tool hangdoc needs is missing
    help = (
        "Install Ray with its dashboard client into hangdoc's environment: `pip install 'ray[default]'`, "
        "or hangdoc's Ray extra, `pip install '.[ray]'` in a clone of hangdoc (`pip install 'hangdoc[ray]'` "
        "once hangdoc is published); use the Ray version the cluster runs."
    )


class RayUnreachable(HangdocError):
    """The Ray cluster (its GCS or its dashboard) did not answer at the address tried."""

    exit_code = 7  # like AgentError: something hangdoc must talk to did not answer
    help = (
        "Pass the cluster's address with --ray-address or RAY_ADDRESS: the dashboard URL "
        "(http://HEAD:8265), the GCS address HEAD:6379, ray://HEAD:10001, or `auto` on a node "
        "of the cluster. The cluster must run the dashboard (`ray[default]`, "
        "`ray start --head --include-dashboard=true`): hangdoc reads Ray's state API through it."
    )


class RayJobNotFound(JobNotFound):
    """``ray:JOB_ID`` names no job the Ray cluster knows (by hex job id or submission id)."""

    exit_code = 3
    help = (
        "Pass a job id as `ray job list` or the dashboard shows it: the hex job id "
        "(02000000) or the submission id (raysubmit_...), and check --ray-address / RAY_ADDRESS "
        "names the cluster that runs it."
    )


class RayWorkersNotFound(JobNotFound):
    """The Ray job has no live actor that is a training worker (or that --workers matched)."""

    exit_code = 3
    help = (
        "Name the job's worker actors with --workers PATTERNS: comma-separated shell patterns "
        "over an actor's class name or name (RayTrainWorker, 'Trainer*'). Without --workers "
        "hangdoc takes Ray Train's workers, or else every actor of the job but Ray's own."
    )


class CommandNotFound(HangdocError):
    """``hangdoc watch -- CMD``: the command to wrap could not be started."""

    exit_code = 127  # what a shell returns for a command it cannot run
    help = "Check the command after `--`: it must be an executable on PATH or a path to one."


class InternalError(HangdocError):
    """hangdoc itself failed: a bug, reported as one line instead of a traceback."""

    exit_code = 70  # EX_SOFTWARE (sysexits.h)
    help = "This is a bug in hangdoc: please report it with the command line. Set HANGDOC_DEBUG=1 to see the traceback."
