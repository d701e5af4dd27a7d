"""Read ``py-spy dump --json`` output from a file into ``ProcessDump`` values.

py-spy prints one JSON list per dump: the process's threads, each with its ``pid``,
``thread_id``, ``os_thread_id``, ``thread_name``, ``active``, ``owns_gil`` and ``frames``
(innermost first; ``module`` set on native frames; ``locals`` with ``--locals``). A file
may hold one dump, several concatenated (a loop's output), several in one JSON list
(``jq -s``), and lines between them that are not JSON (a loop's ``echo "rank 3"``), which
are kept as the next dump's label; py-spy's ``Error: ...`` line there (its stderr in the
file) is a dump of a process it could not read. Every value is checked before it is used:
a file is not trusted to be py-spy's, and anything that is not its shape is one
``DumpFileError`` that says where.
"""

from __future__ import annotations

import json
from typing import Any

from ...bundle import MAX_STACK_DEPTH
from ...errors import DumpFileError, shown
from ...model import PID_MAX
from ..read.pyspy import threads_from_json
from .dumped import ProcessDump, capture_error

_LABEL_LINES = 6
_LABEL_CHARS = 500
_MAX_ID = 2**64 - 1


class _Bad(Exception):
    """A value that is not py-spy's shape; the message says what, ``where`` says where."""


def parse_json(text: str, where: str) -> list[ProcessDump]:
    """The dumps in ``text``, the content of the file named ``where`` in messages."""
    decoder = json.JSONDecoder()
    dumps: list[ProcessDump] = []
    labels: list[str] = []
    i, end = 0, len(text)
    lineno, counted = 1, 0  # the line of position ``counted``
    while i < end:
        if text[i].isspace():
            i += 1
            continue
        lineno += text.count("\n", counted, i)
        counted = i
        if text[i] not in "[{":
            stop = text.find("\n", i)
            stop = end if stop < 0 else stop
            line = text[i:stop].strip()
            if line.startswith("Error: "):  # py-spy failed on a process (stderr in the file)
                dumps.append(
                    ProcessDump(lineno, None, "", "\n".join(labels), error=capture_error(line.removeprefix("Error: ")))
                )
                labels = []
            else:
                labels.append(line[:_LABEL_CHARS])
                del labels[:-_LABEL_LINES]
            i = stop
            continue
        try:
            value, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as err:
            truncated = " (truncated?)" if err.pos >= len(text.rstrip()) else ""
            raise DumpFileError(
                f"{where}: not valid JSON{truncated}: {err.msg} at line {err.lineno} column {err.colno}"
            ) from None
        except RecursionError:
            raise DumpFileError(f"{where}: not a py-spy dump (JSON nested too deeply)") from None
        except ValueError as err:  # an integer of more than 4300 digits
            raise DumpFileError(f"{where}: not valid JSON: {str(err)[:200]}") from None
        label = "\n".join(labels)
        labels = []
        for k, threads in enumerate(_dumps_in(value, where, lineno)):
            at = f"{where}: the dump at line {lineno}" + (f" (item {k})" if k else "")
            try:
                dumps.append(_dump(threads, lineno, label, at))
            except _Bad as err:
                raise DumpFileError(f"{at}: {err}") from None
    return dumps


def _dumps_in(value: object, where: str, lineno: int) -> list[list[Any]]:
    """The dumps (lists of threads) a JSON value holds: one, or a list of them."""
    if isinstance(value, list):
        if all(isinstance(item, list) for item in value):
            return [item for item in value if item]
        if all(isinstance(item, dict) for item in value):
            return [value] if value else []
    raise DumpFileError(
        f"{where}: the JSON at line {lineno} is {_kind(value)}, not a py-spy dump "
        "(a list of threads) or a list of dumps"
    )


_NAMES = {
    dict: ("an object", "objects"),
    list: ("a list", "lists"),
    str: ("a string", "strings"),
    bool: ("a boolean", "booleans"),
    type(None): ("null", "nulls"),
}


def _kind(value: object) -> str:
    """How a JSON value is named in messages: ``a string``, ``a list of numbers``."""
    if isinstance(value, list) and value:
        kinds = sorted({_NAMES.get(type(v), ("a number", "numbers"))[1] for v in value})
        return f"a list of {' and '.join(kinds)}"
    return _NAMES.get(type(value), ("a number", "numbers"))[0]


def _dump(threads: list[Any], lineno: int, label: str, at: str) -> ProcessDump:
    clean = [_thread(raw, j) for j, raw in enumerate(threads)]
    pids = {t["pid"] for t in clean if t.get("pid") is not None}
    if len(pids) > 1:
        raise _Bad(f"threads of several processes in one dump (pids {sorted(pids)})")
    pid = pids.pop() if pids else None
    info = next((t["process_info"] for t in threads if isinstance(t.get("process_info"), dict)), None)
    cmdline = info.get("command_line") if info else None
    return ProcessDump(
        lineno, pid, cmdline if isinstance(cmdline, str) else "", label, threads_from_json(clean, pid), None
    )


def _thread(raw: object, j: int) -> dict[str, Any]:
    """The fields of a thread object hangdoc reads, checked; ``_Bad`` names the first
    wrong one."""
    if not isinstance(raw, dict):
        raise _Bad(f"thread {j} is {_kind(raw)}, not an object")
    try:
        frames = raw.get("frames")
        if frames is not None and not isinstance(frames, list):
            raise _Bad(f"'frames' is {_kind(frames)}, not a list")
        if len(frames or ()) > MAX_STACK_DEPTH:
            raise _Bad(f"{len(frames or ()):,} frames; hangdoc reads at most {MAX_STACK_DEPTH:,}")
        return {
            "pid": _int(raw, "pid", PID_MAX, optional=True),
            "thread_id": _int(raw, "thread_id", _MAX_ID),
            "os_thread_id": _int(raw, "os_thread_id", _MAX_ID, optional=True),
            "thread_name": _str(raw, "thread_name", optional=True),
            "active": _bool(raw, "active"),
            "owns_gil": _bool(raw, "owns_gil"),
            "frames": [_frame(f, k) for k, f in enumerate(frames or ())],
        }
    except _Bad as err:
        raise _Bad(f"thread {j}: {err}") from None


def _frame(raw: object, k: int) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _Bad(f"frame {k} is {_kind(raw)}, not an object")
    try:
        variables = raw.get("locals")
        if variables is not None and not isinstance(variables, list):
            raise _Bad(f"'locals' is {_kind(variables)}, not a list")
        return {
            "name": _str(raw, "name"),
            "filename": _str(raw, "filename"),
            "module": _str(raw, "module", optional=True),
            "line": _int(raw, "line", 2**31 - 1, optional=True) or 0,
            "locals": [_local(v, n) for n, v in enumerate(variables)] if variables else None,
        }
    except _Bad as err:
        raise _Bad(f"frame {k}: {err}") from None


def _local(raw: object, n: int) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _Bad(f"local {n} is {_kind(raw)}, not an object")
    return {"name": _str(raw, "name"), "repr": _str(raw, "repr", optional=True), "arg": _bool(raw, "arg")}


def _int(raw: dict[str, Any], key: str, maximum: int, optional: bool = False) -> int | None:
    value = raw.get(key)
    if value is None and optional:
        return None
    if type(value) is not int or not 0 <= value <= maximum:
        raise _Bad(f"{key!r} is {shown(value, 40)}, not a whole number from 0 to {maximum}")
    return value


def _str(raw: dict[str, Any], key: str, optional: bool = False) -> str | None:
    value = raw.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _Bad(f"{key!r} is {_kind(value)}, not a string")
    return value


def _bool(raw: dict[str, Any], key: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise _Bad(f"{key!r} is {_kind(value)}, not true or false")
    return value
