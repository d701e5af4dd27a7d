"""The in-process probe: what only the job itself can tell, served to hangdoc on request.

Opt-in, by one call in the training script (or its launcher's wrapper)::

    import hangdoc.probe
    hangdoc.probe.start()

It serves, over a Unix socket that only the job's user (and root) can open, the flight
recorder dump of torch.distributed (``_dump_fr_trace_json``: each process group's recent
collectives, numbered) when the job has started it. The socket is
``/tmp/hangdoc-probe-<uid>/<pid>.sock`` (the pid as the process sees it), in a directory
of mode 0700 that the probe refuses to use when another user owns it or others may write
it; hangdoc reaches it through ``/proc/<pid>/root``, so it works across containers. A
caller whose uid is neither the job's nor root is turned away (``SO_PEERCRED``).

It costs nothing while idle: one daemon thread asleep in ``accept``. It never blocks the
job: the answering thread takes the GIL only for bounded work (one request line of at most
64 bytes, read with a 2 s timeout; the dump is torch's own C++ call), and a main thread
that never releases the GIL leaves the request unanswered, which hangdoc reports as such
after its own timeout. Nothing is imported that the job has not imported already: without
``torch.distributed`` in ``sys.modules`` the answer says so.

Protocol: the client sends one line (``ping`` or ``flight``); the probe answers with an
8-byte big-endian length and that many bytes of JSON: ``{"ok": true, ...}`` or
``{"ok": false, "error": "..."}``; ``flight`` adds ``"dump"``, the dump's JSON text.
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
from pathlib import Path

REQUEST_BYTES = 64
REQUEST_TIMEOUT_S = 2.0
LENGTH = struct.Struct(">Q")
_started: dict[int, str] = {}  # pid -> socket path: a forked child starts its own
_lock = threading.Lock()


def socket_dir(uid: int, root: str = "") -> Path:
    """Where the probes of user ``uid`` listen (under ``root``: ``/proc/PID/root``)."""
    return Path(f"{root}/tmp/hangdoc-probe-{uid}")


def socket_path(uid: int, pid: int, root: str = "") -> Path:
    return socket_dir(uid, root) / f"{pid}.sock"


def start() -> str | None:
    """Serve this process's probe (once per process); its socket path, or None when it
    cannot be served (the reason goes to stderr once, the job goes on)."""
    pid = os.getpid()
    with _lock:
        if pid in _started:
            return _started[pid]
        try:
            path = _listen(pid)
        except OSError as err:
            print(f"hangdoc.probe: not started: {err}", file=sys.stderr)
            return None
        _started[pid] = str(path)
        return str(path)


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
    server.bind(str(path))
    os.chmod(path, 0o600)
    server.listen(4)
    threading.Thread(target=_serve, args=(server,), name="hangdoc-probe", daemon=True).start()
    atexit.register(_remove, path, pid)
    return path


def _remove(path: Path, pid: int) -> None:
    if os.getpid() == pid:  # a forked child must not remove its parent's socket
        try:
            path.unlink()
        except OSError:
            pass


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
    else:
        _send(conn, {"ok": False, "error": f"unknown request {request[:32]!r}"})


def _peer_uid(conn: socket.socket) -> int | None:
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    return struct.unpack("3i", creds)[1]


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


def _send(conn: socket.socket, answer: dict[str, object]) -> None:
    data = json.dumps(answer).encode()
    conn.sendall(LENGTH.pack(len(data)) + data)
