"""Finding and cleaning up after real ``hangdoc.probe`` sockets in tests."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable

from hangdoc.capture.read.probe_client import _listening
from hangdoc.probe import DIR_PREFIX, legacy_socket_path


def probe_socket(pid: int) -> str:
    """The socket process ``pid`` (of this pid namespace) listens on as its probe."""
    found = _listening(pid, pid)
    assert found, f"pid {pid} listens on no probe socket"
    return found[0]


def remove_probe_files(pids: Iterable[int], uid: int | None = None) -> None:
    """What probes killed by SIGKILL (no atexit) left in /tmp: their sockets, and the
    directories made for them."""
    uid = os.geteuid() if uid is None else uid
    for pid in pids:
        legacy_socket_path(uid, pid).unlink(missing_ok=True)
        for path in glob.glob(f"/tmp/{DIR_PREFIX}-{uid}-*/{pid}.sock"):
            try:
                os.unlink(path)
                os.rmdir(os.path.dirname(path))
            except OSError:
                pass
