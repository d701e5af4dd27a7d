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

The socket is ``<pid>.sock`` (the pid as the process sees it) in a directory of mode 0700
that nobody else can have made first: ``$XDG_RUNTIME_DIR/hangdoc-probe`` when the process
has a runtime directory of its own (its user's, no group or other bits), else a fresh
``/tmp/hangdoc-probe-<uid>-<random>`` made for this process alone (``mkdir`` fails on a
name that exists: another user who creates names in ``/tmp`` ahead of the job never decides
where it listens, and never stops it listening). hangdoc finds the socket through the
process itself (its listening socket among its descriptors, the path the kernel lists for
it in ``/proc/<pid>/net/unix``) and reaches it through ``/proc/<pid>/root``, so it works
across containers. A caller whose uid is neither the job's nor root is turned away
(``SO_PEERCRED``). A probe that cannot listen says why on stderr, once per process,
whenever it was asked for (``HANGDOC_PROBE`` set, or ``start()``).

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
and that many bytes of JSON (ASCII), ``{"ok": true, ...}`` or ``{"ok": false, "error":
"..."}``, never more than ``MAX_ANSWER_BYTES`` (a longer flight recorder dump is left out
and said):

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
from collections.abc import Iterator  # threading imported collections already
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
# the most bytes of JSON one answer holds; the client reads no more. A real job's answer, a
# gloo job of torch 2.13 with two groups and the flight recorder's default ring of 2,000
# entries (TORCH_FR_BUFFER_SIZE=2000): 1,057,816 bytes, built and sent in 0.05 s; 10,000
# entries: 5.3 MB; 20,000: 10,633,715 bytes in 0.48 s (~530 bytes an entry, the dump's
# quotes escaped). 8 MiB holds a ring of ~15,000 such entries, 7.5 times the default; the
# client's count of the dump's values (probe_client.MAX_DUMP_OBJECTS) stops at ~11,000
MAX_ANSWER_BYTES = 8 * 2**20
DIR_PREFIX = "hangdoc-probe"  # the socket's directory's name starts so; the client looks for it
RUNTIME_SUBDIR = DIR_PREFIX  # in $XDG_RUNTIME_DIR
_TMP = "/tmp"
_TRIES = 16  # random names tried in /tmp before giving up

_started: dict[int, str] = {}  # pid -> socket path: a forked child starts its own
_servers: dict[int, socket.socket] = {}  # pid -> its listening socket
_own_dirs: dict[int, str] = {}  # pid -> the /tmp directory made for it (removed with its socket)
_refused: set[int] = set()  # pids told why their probe could not start (said once)
_lock = threading.Lock()


def legacy_socket_path(uid: int, pid: int, root: str = "") -> Path:
    """Where probes of hangdoc before issue 23 listened (under ``root``: ``/proc/PID/root``),
    a name any user could take first: read only where the process's own sockets cannot be
    listed, and only as the process's own."""
    return Path(f"{root}/tmp/{DIR_PREFIX}-{uid}/{pid}.sock")


def start() -> str | None:
    """Serve this process's probe (once per process); its socket path, or None when it
    cannot be served (the reason goes to stderr once, the job goes on)."""
    return _start()[0]


def start_from_environment() -> str | None:
    """What the start-up hooks call: ``start()`` when ``HANGDOC_PROBE`` is ``1`` or
    ``verbose`` (which also says on stderr where it serves). Why it cannot serve is said
    on stderr in both modes, once per process. Never raises."""
    mode = os.environ.get(ENV)
    if mode not in ENABLED:
        return None
    verbose = mode == "verbose"
    try:  # asked for and not served is said, whatever the mode: a probe that is not there is the bug
        path, new = _start()
    except Exception as err:  # noqa: BLE001 - the job starts whatever happens here
        print(f"hangdoc.probe: not started: {type(err).__name__}: {err}", file=sys.stderr)
        return None
    if new and verbose:  # a venv's lib64 -> lib runs the hook twice: said once
        print(f"hangdoc.probe: pid {os.getpid()} serves {path}", file=sys.stderr)
    return path


def _start() -> tuple[str | None, bool]:
    """The socket path (None: not served) and whether this call started it."""
    pid = os.getpid()
    with _lock:
        if pid in _started:
            return _started[pid], False
        try:
            path = _listen(pid)
        except OSError as err:
            if pid not in _refused:
                print(f"hangdoc.probe: not started: {err}", file=sys.stderr)
            _refused.add(pid)
            return None, False
        _started[pid] = str(path)
        return str(path), True


def _listen(pid: int) -> Path:
    uid = os.geteuid()
    refused: list[str] = []
    for directory in _directories(uid, pid, refused):
        path = Path(directory) / f"{pid}.sock"
        try:
            if path.exists() or path.is_symlink():
                path.unlink()  # a dead process's socket with a reused pid (the runtime directory)
            server = _bind(path)
        except OSError as err:
            refused.append(f"{path}: {err.strerror or err}")
            _remove_own_dir(pid)
            continue
        _servers[pid] = server
        atexit.register(_remove, path, pid)
        return path
    raise OSError(f"no private directory to listen in for uid {uid} ({'; '.join(refused) or 'none made'})")


def _directories(uid: int, pid: int, refused: list[str]) -> Iterator[str]:
    """Where to listen, in order: the process's runtime directory, then a fresh directory of
    its own in /tmp (made only when the first cannot serve); why one cannot, in ``refused``."""
    runtime = _runtime_dir(uid)
    if runtime is not None:
        yield runtime
    for _ in range(_TRIES):
        directory = f"{_TMP}/{DIR_PREFIX}-{uid}-{os.urandom(6).hex()}"
        try:
            os.mkdir(directory, 0o700)  # fails where the name exists: nobody picks it for us
        except FileExistsError:
            continue
        except OSError as err:
            refused.append(f"{_TMP}: {err.strerror or err}")
            return
        os.chmod(directory, 0o700)  # whatever the umask left
        _own_dirs[pid] = directory
        yield directory
        return


def _runtime_dir(uid: int) -> str | None:
    """``$XDG_RUNTIME_DIR/hangdoc-probe`` when the runtime directory is a private one of
    ``uid`` (no link in its path: the client follows none); None otherwise."""
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    if not base.startswith("/"):
        return None
    base = os.path.realpath(base)
    directory = os.path.join(base, RUNTIME_SUBDIR)
    try:
        if not private_dir(os.lstat(base), uid):
            return None
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
        return directory if private_dir(os.lstat(directory), uid) else None
    except OSError:
        return None


def private_dir(st: os.stat_result, uid: int) -> bool:
    """A directory of ``uid`` that no one else may enter: where a probe listens."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077


def _bind(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        os.chmod(path, 0o600)
        server.listen(4)
        threading.Thread(target=_serve, args=(server,), name="hangdoc-probe", daemon=True).start()
    except BaseException:
        server.close()
        raise
    return server


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
        _remove_own_dir(pid)


def _remove_own_dir(pid: int) -> None:
    directory = _own_dirs.pop(pid, None)
    if directory is not None:
        try:
            os.rmdir(directory)
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
        _own_dirs.pop(owner, None)  # the parent's: never the child's to remove


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
    uid: int = struct.unpack("3i", creds)[1]
    return uid


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
    return {
        "step": None if step == no_step else step,
        "beats": beats,
        "in_step": bool(in_step),
        "age_seconds": max(time.monotonic_ns() - last, 0) / 1e9,
    }


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
    entry: dict[str, object] = {
        "thread_id": ident,
        "thread_name": None,
        "type": name[:MAX_NAME_CHARS],
        "function": "",
        "file": "",
        "line": None,
    }
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
        entry.update(
            function=code.co_name[:MAX_NAME_CHARS], file=code.co_filename[:MAX_PATH_CHARS], line=innermost.tb_lineno
        )
    return entry


def _send(conn: socket.socket, answer: dict[str, object]) -> None:
    data = json.dumps(answer).encode()
    if len(data) > MAX_ANSWER_BYTES:  # only a flight recorder dump is ever this long
        _drop_dump(answer, len(data))
        data = json.dumps(answer).encode()
    conn.sendall(LENGTH.pack(len(data)) + data)


def _drop_dump(answer: dict[str, object], size: int) -> None:
    error = (
        f"the flight recorder dump makes an answer of {size:,} bytes, more than hangdoc reads "
        f"({MAX_ANSWER_BYTES:,}): a smaller TORCH_FR_BUFFER_SIZE fits"
    )
    if "dump" in answer:
        answer.update(ok=False, error=error)
        del answer["dump"]
    else:
        answer["flight"] = {"error": error}
