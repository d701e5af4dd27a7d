"""The in-process probe: what only the job itself can tell, served to hangdoc on request.

Three ways to start it; only the last one touches the training script:

- ``hangdoc run -- CMD ...`` runs CMD with the probe on in every Python process it starts
  (torchrun and its workers; ``hangdoc.probe_hook``);
- ``HANGDOC_PROBE=1`` in the environment of a Python whose site-packages holds hangdoc's
  hook (``hangdoc-probe.pth``, installed with the package): the probe starts at interpreter
  start-up (``start_from_environment``). Unset, the hook costs one environment lookup;
- one call: ``import hangdoc.probe; hangdoc.probe.start()``.

It serves, over a Unix socket that only the job's user (and root) can open:

- the flight recorder dump of torch.distributed (``_dump_fr_trace_json``: each process
  group's recent collectives, numbered) when the job has initialised it;
- the step heartbeat the process recorded (``hangdoc.heartbeat``), when it beats: read from
  its own record in memory, so hangdoc has it where the record's file is out of its sight;
- each thread's live exception (``sys._current_exceptions()``): the thread's id and name,
  the exception type's qualified name, and the function, file and line where it was
  raised. Never its message, arguments or any other value.

The socket is ``/tmp/hangdoc-probe-<uid>/<pid>.sock`` (the pid as the process sees it), in
a directory of mode 0700 that the probe refuses to use when another user owns it or others
may write it; hangdoc reaches it through ``/proc/<pid>/root``, so it works across
containers. A caller whose uid is neither the job's nor root is turned away (``SO_PEERCRED``).

It costs nothing while idle: one daemon thread asleep in ``accept``. It never blocks the
job: the answering thread takes the GIL only for bounded work (one request line of at most
64 bytes, read with a 2 s timeout; at most ``MAX_EXCEPTIONS`` threads, their tracebacks
walked at most ``MAX_TRACEBACK_STEPS`` entries in all, no code of the job run: names are read
through C-level descriptors; the dump is torch's own C++ call), and a main thread that
never releases the GIL leaves the request unanswered, which hangdoc reports as such after
its own timeout. Nothing is imported that the job has not imported already.

A forked child (a DataLoader worker) closes the listening socket it inherited: it never
answers as its parent, and serves a probe of its own only when it calls ``start()``.

Protocol: the client sends one line; the probe answers with an 8-byte big-endian length
and that many bytes of JSON, ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``:

- ``ping``: ``"pid"``;
- ``flight``: ``"dump"``, the dump's JSON text;
- ``heartbeat``: ``"heartbeat"``, null or ``{"step", "beats", "in_step", "age_seconds"}``;
- ``state``: ``"pid"``, ``"flight"`` (``{"dump": ...}`` or ``{"error": ...}``),
  ``"heartbeat"``, ``"exceptions"`` (a list of ``{"thread_id", "thread_name", "type",
  "function", "file", "line"}``) and ``"exceptions_left_out"`` (threads past the bound).

This module uses the standard library only and runs on Python 3.8 and later: ``hangdoc
run`` loads it by its path into a job whose Python cannot import hangdoc.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import stat
import struct
import sys
import threading
import time
from pathlib import Path

ENV = "HANGDOC_PROBE"  # "1": start at interpreter start-up; "verbose": and say so on stderr
ENABLED = ("1", "verbose")
REQUEST_BYTES = 64
REQUEST_TIMEOUT_S = 2.0
LENGTH = struct.Struct(">Q")
MAX_EXCEPTIONS = 64  # threads whose live exception one answer lists
MAX_NAME_CHARS = 200  # a type, function or thread name is cut here
MAX_PATH_CHARS = 1024
# traceback entries walked per answer, to find where each exception was raised (a
# RecursionError's traceback is ~1,000 deep): a few ms of GIL at most; an exception whose
# raising place lies beyond is left out, not placed wrongly
MAX_TRACEBACK_STEPS = 20_000

_started: dict[int, str] = {}  # pid -> socket path: a forked child starts its own
_servers: dict[int, socket.socket] = {}  # pid -> its listening socket
_refused: set[int] = set()  # pids told why their probe could not start (said once)
_lock = threading.Lock()


def socket_dir(uid: int, root: str = "") -> Path:
    """Where the probes of user ``uid`` listen (under ``root``: ``/proc/PID/root``)."""
    return Path(f"{root}/tmp/hangdoc-probe-{uid}")


def socket_path(uid: int, pid: int, root: str = "") -> Path:
    return socket_dir(uid, root) / f"{pid}.sock"


def start() -> str | None:
    """Serve this process's probe (once per process); its socket path, or None when it
    cannot be served (the reason goes to stderr once, the job goes on)."""
    return _start(say_why_not=True)[0]


def start_from_environment() -> str | None:
    """What the start-up hooks call: ``start()`` when ``HANGDOC_PROBE`` is ``1`` (silently)
    or ``verbose`` (saying on stderr where it serves, or why it cannot). Never raises."""
    mode = os.environ.get(ENV)
    if mode not in ENABLED:
        return None
    verbose = mode == "verbose"
    try:
        path, new = _start(say_why_not=verbose)
    except Exception as err:  # noqa: BLE001 - the job starts whatever happens here
        if verbose:
            print(f"hangdoc.probe: not started: {type(err).__name__}: {err}", file=sys.stderr)
        return None
    if new and verbose:  # a venv's lib64 -> lib runs the hook twice: said once
        print(f"hangdoc.probe: pid {os.getpid()} serves {path}", file=sys.stderr)
    return path


def _start(say_why_not: bool) -> tuple[str | None, bool]:
    """The socket path (None: not served) and whether this call started it."""
    pid = os.getpid()
    with _lock:
        if pid in _started:
            return _started[pid], False
        try:
            path = _listen(pid)
        except OSError as err:
            if say_why_not and pid not in _refused:
                print(f"hangdoc.probe: not started: {err}", file=sys.stderr)
            _refused.add(pid)
            return None, False
        _started[pid] = str(path)
        return str(path), True


def _listen(pid: int) -> Path:
    uid = os.geteuid()
    directory = socket_dir(uid)
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        raise PermissionError(f"{directory} is not a private directory of uid {uid}")
    path = directory / f"{pid}.sock"
    if path.exists() or path.is_symlink():
        path.unlink()  # a dead process's socket with a reused pid
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        os.chmod(path, 0o600)
        server.listen(4)
        threading.Thread(target=_serve, args=(server,), name="hangdoc-probe", daemon=True).start()
    except BaseException:
        server.close()
        raise
    _servers[pid] = server
    atexit.register(_remove, path, pid)
    return path


def stop() -> None:
    """Stop serving in this process and remove its socket (``hangdoc run`` does before it
    hands its pid to the command: a socket nobody answers must not be left under it)."""
    pid = os.getpid()
    with _lock:
        server, path = _servers.pop(pid, None), _started.pop(pid, None)
    if server is not None:
        try:
            server.shutdown(socket.SHUT_RDWR)  # wakes the thread in accept: it ends
        except OSError:
            pass
        server.close()
    if path is not None:
        _remove(Path(path), pid)


def _remove(path: Path, pid: int) -> None:
    if os.getpid() == pid:  # a forked child must not remove its parent's socket
        try:
            path.unlink()
        except OSError:
            pass


def _forget_parent() -> None:
    """In a forked child: close the parent's listening socket (the child has no thread
    serving it, and must never answer for its parent), and a lock another thread held."""
    global _lock
    _lock = threading.Lock()
    pid = os.getpid()
    for owner in [p for p in _servers if p != pid]:
        _servers.pop(owner).close()
        _started.pop(owner, None)


os.register_at_fork(after_in_child=_forget_parent)


def _serve(server: socket.socket) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            try:
                _answer(conn)
            except OSError:
                continue


def _answer(conn: socket.socket) -> None:
    uid = _peer_uid(conn)
    if uid is not None and uid not in (0, os.geteuid()):
        _send(conn, {"ok": False, "error": f"uid {uid} may not ask this process"})
        return
    conn.settimeout(REQUEST_TIMEOUT_S)
    request = conn.recv(REQUEST_BYTES).split(b"\n", 1)[0].strip().decode("ascii", "replace")
    if request == "ping":
        _send(conn, {"ok": True, "pid": os.getpid()})
    elif request == "flight":
        _send(conn, _flight())
    elif request == "heartbeat":
        _send(conn, {"ok": True, "heartbeat": _heartbeat()})
    elif request == "state":
        _send(conn, _state())
    else:
        _send(conn, {"ok": False, "error": f"unknown request {request[:32]!r}"})


def _peer_uid(conn: socket.socket) -> int | None:
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    return struct.unpack("3i", creds)[1]


def _state() -> dict[str, object]:
    flight = _flight()
    exceptions, left_out = _exceptions()
    return {
        "ok": True,
        "pid": os.getpid(),
        "flight": {"dump": flight["dump"]} if flight["ok"] else {"error": flight["error"]},
        "heartbeat": _heartbeat(),
        "exceptions": exceptions,
        "exceptions_left_out": left_out,
    }


def _flight() -> dict[str, object]:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return {"ok": False, "error": "torch.distributed is not initialised in this process"}
    try:
        c10d = sys.modules["torch._C._distributed_c10d"]
        dump = c10d._dump_fr_trace_json(True, True)
    except Exception as err:  # noqa: BLE001 - whatever torch raises is the answer
        return {"ok": False, "error": f"the flight recorder could not be dumped: {type(err).__name__}: {err}"}
    text = dump.decode("utf-8", "replace") if isinstance(dump, bytes) else str(dump)
    return {"ok": True, "dump": text}


def _heartbeat() -> dict[str, object] | None:
    """The process's own heartbeat record (``hangdoc.heartbeat``), as its readers parse it;
    None when the job never beat (or has no record: then its beats are dropped anyway)."""
    module = sys.modules.get("hangdoc.heartbeat")
    record = getattr(module, "_map", None)
    if record is None:
        return None
    try:
        _magic, _version, _pid, in_step, step, beats, last = module.RECORD.unpack_from(record)  # type: ignore[union-attr]
        no_step = module.NO_STEP  # type: ignore[union-attr]
    except (AttributeError, ValueError, struct.error):  # ValueError: a closed map
        return None
    if beats <= 0:
        return None
    return {"step": None if step == no_step else step, "beats": beats, "in_step": bool(in_step),
            "age_seconds": max(time.monotonic_ns() - last, 0) / 1e9}


_QUALNAME = type.__dict__["__qualname__"]
_MODULE = type.__dict__["__module__"]


def _exceptions() -> tuple[list[dict[str, object]], int]:
    """Each thread's live exception, without its message; and how many were left out."""
    current = getattr(sys, "_current_exceptions", None)
    if current is None:  # before Python 3.11
        return [], 0
    threads = dict(getattr(sys.modules.get("threading"), "_active", None) or {})
    own = threading.get_ident()
    listed: list[dict[str, object]] = []
    left_out, budget = 0, [MAX_TRACEBACK_STEPS]
    for ident, exc in current().items():
        if isinstance(exc, tuple):  # Python 3.11: (type, value, traceback)
            exc = exc[1]
        if not isinstance(exc, BaseException) or ident == own:
            continue
        entry = _describe(ident, threads.get(ident), exc, budget) if len(listed) < MAX_EXCEPTIONS else None
        if entry is None:
            left_out += 1
        else:
            listed.append(entry)
    return listed, left_out


def _describe(ident: int, thread: object, exc: BaseException, budget: list[int]) -> dict[str, object] | None:
    """The type's qualified name and where it was raised, read through C-level
    descriptors only: no ``__getattr__``, property or ``__repr__`` of the job runs. None
    when its traceback is deeper than what is left of ``budget`` (entries to walk)."""
    kind = type(exc)
    module, qualname = _MODULE.__get__(kind), _QUALNAME.__get__(kind)
    name = qualname if module in ("builtins", None) or not isinstance(module, str) else f"{module}.{qualname}"
    entry: dict[str, object] = {"thread_id": ident, "thread_name": None, "type": name[:MAX_NAME_CHARS],
                                "function": "", "file": "", "line": None}
    try:
        thread_name = object.__getattribute__(thread, "__dict__").get("_name")
    except AttributeError:  # no thread object (a thread started by C code)
        thread_name = None
    if isinstance(thread_name, str):
        entry["thread_name"] = thread_name[:MAX_NAME_CHARS]
    tb, innermost = BaseException.__dict__["__traceback__"].__get__(exc), None
    while tb is not None and budget[0] > 0:
        innermost, tb = tb, tb.tb_next
        budget[0] -= 1
    if tb is not None:
        return None
    if innermost is not None:
        code = innermost.tb_frame.f_code
        entry.update(function=code.co_name[:MAX_NAME_CHARS], file=code.co_filename[:MAX_PATH_CHARS],
                     line=innermost.tb_lineno)
    return entry


def _send(conn: socket.socket, answer: dict[str, object]) -> None:
    data = json.dumps(answer).encode()
    conn.sendall(LENGTH.pack(len(data)) + data)
