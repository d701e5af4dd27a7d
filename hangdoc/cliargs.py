"""Argument types for the command line: every number and address is checked at the edge.

Each factory here returns an argparse ``type=`` function: it takes the option's text and
returns the value, or raises ``argparse.ArgumentTypeError`` with one line that names the
accepted range, which the CLI prints as ``hangdoc: error: argument --x: ...`` (exit 2).

Numbers are read from ASCII only and must be finite: ``int()`` and ``float()`` would also
take ``٣``, ``1_000``, `` 5 ``, ``inf`` and ``nan``, and argparse would pass them on.
The ranges are inclusive; each is documented where it is defined.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Any

from .errors import shown
from .model import MAX_INCLUDE_CHARS, MAX_WORLD_SIZE

# --------------------------------------------------------------------------- ranges

HOUR = 3600.0
WEEK = 7 * 24 * HOUR

# diagnose/watch: sampling
WINDOW_SECONDS = (0.0, HOUR)  # --window, --max-window: an hour of sampling is already plenty
INTERVAL_SECONDS = (0.01, 600.0)  # --interval: below 10 ms py-spy only burns CPU
DUMP_TIMEOUT_SECONDS = (0.1, 600.0)  # --timeout: one py-spy dump takes 50 ms to a few s
# reports
WIDTH_COLUMNS = (20, 1000)  # --width: narrower cannot show a frame, wider is not a terminal
# watch: stall detection and actions
STALL_SECONDS = (0.1, WEEK)  # --stall-after, --warmup-timeout
MIN_STALL_SECONDS = (0.0, WEEK)  # --min-stall
CHECK_INTERVAL_SECONDS = (0.01, HOUR)  # --check-interval
STALL_FACTOR = (1.0, 1000.0)  # --stall-factor: below 1 an ordinary step gap would be a stall
WARMUP_STEPS = (0, 10**9)  # --warmup-steps
KILL_GRACE_SECONDS = (0.0, HOUR)  # --kill-grace
MAX_POSTPONE = (0, 1000)  # --max-postpone
# addresses
LISTEN_PORT = (0, 65535)  # --listen, --metrics-port: 0 asks the kernel for any free port
AGENT_PORT = (1, 65535)  # --agents HOST:PORT
HOST_MAX_CHARS = 255  # --node-name, hosts in --listen/--agents (DNS names are at most 253)
# agent --replay (benchmarks)
RANK_OFFSET = (0, MAX_WORLD_SIZE - 1)  # --replay-rank-offset
WORLD_SIZE = (1, MAX_WORLD_SIZE)  # --replay-world-size

_NUMBER_MAX_CHARS = 64  # no number in range needs more; int() refuses 4300+ digits anyway
_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def _parse_number(text: str, integer: bool) -> float | int | None:
    if len(text) > _NUMBER_MAX_CHARS:
        return None
    if integer:
        return int(text) if _INT.fullmatch(text) else None
    if not _FLOAT.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None  # "1e999" reads as inf


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _range_type(lo: float, hi: float, integer: bool, unit: str) -> Callable[[str], Any]:
    what = "a whole number" if integer else "a number"
    bounds = f"from {_fmt(lo)} to {_fmt(hi)}{unit}"

    def parse(text: str) -> float | int:
        value = _parse_number(text, integer)
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{shown(text, 40)} is not {what} {bounds}")
        return value

    parse.__name__ = "number"
    return parse


DURATION_FORMS = "90s, 5m, 1.5h, 500ms; a plain number is seconds"
_DURATION = re.compile(r"(?P<number>.+?)(?P<unit>ms|s|m|h)?", re.ASCII | re.DOTALL)
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": HOUR, None: 1.0}


def _duration(text: str) -> float | None:
    """Seconds in ``text`` (a number, or a number and ``ms``/``s``/``m``/``h``); None if not one."""
    match = _DURATION.fullmatch(text)
    if match is None:
        return None
    number = _parse_number(match["number"], integer=False)
    if number is None:
        return None
    value = number * _UNIT_SECONDS[match["unit"]]
    return value if math.isfinite(value) else None


def seconds(bounds: tuple[float, float]) -> Callable[[str], float]:
    """A finite duration within ``bounds`` (seconds): ``90``, ``90s``, ``1.5m``, ``1h``, ``500ms``."""
    lo, hi = bounds

    def parse(text: str) -> float:
        value = _duration(text)
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(
                f"{shown(text, 40)} is not a duration from {_fmt(lo)} to {_fmt(hi)} seconds ({DURATION_FORMS})"
            )
        return value

    parse.__name__ = "duration"
    return parse


def finite_float(bounds: tuple[float, float]) -> Callable[[str], float]:
    """A finite number within ``bounds``."""
    return _range_type(bounds[0], bounds[1], integer=False, unit="")


def whole_number(bounds: tuple[int, int]) -> Callable[[str], int]:
    """A whole number (ASCII digits) within ``bounds``."""
    return _range_type(bounds[0], bounds[1], integer=True, unit="")


def include_word(text: str) -> str:
    """A word of a command line: printable, 1 to ``MAX_INCLUDE_CHARS`` characters."""
    if not text or len(text) > MAX_INCLUDE_CHARS or not text.isprintable():
        raise argparse.ArgumentTypeError(
            f"{shown(text, 40)} is not a word of a command line (1 to {MAX_INCLUDE_CHARS} printable characters)"
        )
    return text


def port(bounds: tuple[int, int] = LISTEN_PORT) -> Callable[[str], int]:
    """A TCP port number within ``bounds``."""
    lo, hi = bounds

    def parse(text: str) -> int:
        value = _parse_number(text, integer=True)
        if value is None or not lo <= value <= hi:
            zero = " (0: any free port)" if lo == 0 else ""
            raise argparse.ArgumentTypeError(f"{shown(text, 40)} is not a port number from {lo} to {hi}{zero}")
        return int(value)

    parse.__name__ = "port"
    return parse


def _check_host(text: str, host: str) -> None:
    if len(host) > HOST_MAX_CHARS or not host.isascii() or not host.isprintable() or " " in host:
        where = "" if host == text else f"{shown(text, 60)}: "
        raise argparse.ArgumentTypeError(f"{where}{shown(host, 40)} is not a host name")


def listen_address(text: str) -> str:
    """``HOST:PORT`` to listen on (``[IPV6]:PORT``; port 0: any free port); returned as given."""
    host, sep, number = text.rpartition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"{shown(text, 60)} is not HOST:PORT")
    _check_host(text, host)
    port(LISTEN_PORT)(number)
    return text


def agent_list(text: str) -> str:
    """``HOST[:PORT],...``: each port, where given, 1 to 65535; returned as given."""
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        host, sep, number = entry.rpartition(":")  # as hangdoc.remote.parse_agents splits it
        _check_host(entry, host if sep else entry)
        if sep:
            try:
                if not host:
                    raise argparse.ArgumentTypeError(entry)
                port(AGENT_PORT)(number)
            except argparse.ArgumentTypeError:
                raise argparse.ArgumentTypeError(
                    f"agent address {shown(entry, 60)} is not HOST[:PORT] with a port from "
                    f"{AGENT_PORT[0]} to {AGENT_PORT[1]}"
                ) from None
    return text


def node_name(text: str) -> str:
    """A host name to report for this node's ranks: printable ASCII, no spaces."""
    if not text:
        raise argparse.ArgumentTypeError("the node name is empty")
    _check_host(text, text)
    return text
