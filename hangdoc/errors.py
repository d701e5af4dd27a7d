"""Errors a user can act on: each carries its own help text and a process exit code.

Only the CLI prints them and exits; library code raises them. Conditions that concern one
rank (a pid that vanished, ptrace refused for one process) are not errors: they are
recorded in the snapshot as ``CaptureError`` values and reported.
"""

from __future__ import annotations


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
    # nodes that did not answer the search (set by the coordinator): with any, "not found"
    # only means "not found where we could look"
    unreachable: tuple[str, ...] = ()


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


class CommandNotFound(HangdocError):
    """``hangdoc watch -- CMD``: the command to wrap could not be started."""

    exit_code = 127  # what a shell returns for a command it cannot run
    help = "Check the command after `--`: it must be an executable on PATH or a path to one."
