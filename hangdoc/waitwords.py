"""The words of a wait followed past the ranks (``analysis.beyond``): who waits, on what,
and the process at the end. Shared by ``analysis.wording`` and the reporters' chain lines.
``counted`` (a count and its noun in the right number: ``1 rank``, ``2 ranks``) lives in
``model``, which imports nothing of hangdoc, and is re-exported here for the reporters."""

from __future__ import annotations

import os
from collections.abc import Sequence

from .model import LinkKind, RootCause, WaitLink
from .model import counted as counted

_KIND_WORDS = {
    LinkKind.COLLECTIVE: "in a collective, for",
    LinkKind.SOCKET: "on a socket to",
    LinkKind.PIPE: "on a pipe from",
    LinkKind.QUEUE: "on a queue fed by",
    LinkKind.CHILD: "on its child",
    LinkKind.RAY_TASK: "on a Ray task of",
    LinkKind.LOCK: "on a lock",
    LinkKind.FILE_LOCK: "on a file lock held by",
    LinkKind.THREAD: "on",
    LinkKind.CONDITION: "on a condition or event",
}
_COMMAND_CHARS = 72


def command_words(command: Sequence[str]) -> str:
    """``python server.py --serve``: the program and its arguments, paths by their base
    names (a script's directory says little of what it runs), cut short."""
    if not command:
        return ""
    text = " ".join(os.path.basename(a) if "/" in a and not a.startswith("-") else a for a in command)
    return text if len(text) <= _COMMAND_CHARS else text[: _COMMAND_CHARS - 1] + "…"


def who(link: WaitLink) -> str:
    """``rank 0``, or ``pid 812 (python server.py --serve)``, with its thread and frame."""
    if link.rank is not None:
        text = f"rank {link.rank}"
    else:
        runs = command_words(link.command)
        text = f"pid {link.pid}" + (f" ({runs})" if runs else "")
    if link.thread:
        text += f", thread '{link.thread}'"
    if link.frame is not None:
        text += f" at {link.frame.short_filename}:{link.frame.line or '?'}"
    return text


def waits_words(link: WaitLink) -> str:
    """``waits on a socket to 127.0.0.1:8000``; "" where the link does not wait on another."""
    if link.waits is None:
        return f"blocked on {link.on}, which does not return" if link.on else ""
    kind = _KIND_WORDS[link.waits]
    return f"waits {kind} {link.on}".rstrip() if link.on else f"waits {kind}".removesuffix(" to").removesuffix(" by")


def chain_words(links: Sequence[WaitLink]) -> str:
    """The whole chain on one line: ``rank 0, thread 'MainThread' at train.py:40 waits on a
    socket to pid 812 -> pid 812 (python server.py), thread 'scheduler' at server.py:9 ...``."""
    parts = []
    for link in links:
        said = waits_words(link)
        parts.append(f"{who(link)} {said}".rstrip())
    return " -> ".join(parts)


def root_line(root: RootCause) -> str:
    """The evidence line naming what holds the ranks (the chain itself is the report's
    ``root_cause``, drawn link by link by the reporters)."""
    end = root.chain[-1]
    start = next((link for link in root.chain if link.waits is not LinkKind.COLLECTIVE), root.chain[0])
    said = f" ({waits_words(end)})" if end.waits else ""
    cycle = ", which waits back on the chain: a deadlock across processes" if root.cycle else ""
    steps = len(root.chain) - 1
    return (
        f"the wait ends at {who(end)}{said}{cycle}: followed from {who(start).split(',')[0]} "
        f"in {steps} step{'s' if steps != 1 else ''} through the kernel's tables"
    )


def root_step(root: RootCause) -> str:
    """The first next step: look where the wait ends, not at the rank."""
    end = root.chain[-1]
    thread = f" thread '{root.thread}'" if root.thread else " its threads"
    where = f" at {root.frame.short_filename}:{root.frame.line or '?'}" if root.frame is not None else ""
    fix = "break the cycle: take the locks or resources in one order" if root.cycle else "fix it there"
    return (
        f"The hang is held by {who(end).split(',')[0]} on {root.host}: look at{thread}{where} "
        f"(`py-spy dump --pid {root.pid}` there) and {fix}; the ranks only wait on it."
    )
