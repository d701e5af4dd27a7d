"""What capture keeps of the locals behind a frame's lock expressions (``pyspy.object_locals``).

py-spy reads memory without running code: a lock local shows as ``<_thread.lock at
0x7f..>`` (never locked/unlocked, never an RLock's owner), any other object as ``<Type at
0x..>``, a cell variable as ``<cell at 0x..>`` (the cell's address, not its object's), and
a closure's variables not at all. The dumps below have the shape py-spy 0.4.3 printed for a
real two-thread lock-order deadlock (``--locals --json``, Python 3.11).
"""

from __future__ import annotations

import json
from pathlib import Path

from hangdoc.capture.read.pyspy import parse_dump

SOURCE = """import threading
GLOBAL_LOCK = threading.Lock()


class Loader:
    def produce(self, other, label):
        lock = self._lock
        with lock:
            with other._lock:
                pass

    def flush(self):
        with GLOBAL_LOCK:
            with undefined_name:
                pass

    def cells(self):
        cb = lambda: self._lock
        with self._lock:
            pass
"""


def _dump(path: Path, function: str, line: int, variables: list[dict]) -> str:
    return json.dumps(
        [
            {
                "pid": 4242,
                "thread_id": 1,
                "thread_name": "MainThread",
                "os_thread_id": 4242,
                "active": False,
                "owns_gil": False,
                "frames": [
                    {
                        "name": function,
                        "filename": str(path),
                        "module": None,
                        "short_filename": path.name,
                        "line": line,
                        "locals": variables,
                    }
                ],
            }
        ]
    )


def _var(name: str, text: str, arg: bool = False) -> dict:
    return {"name": name, "addr": 140068246324880, "arg": arg, "repr": text}


def test_the_roots_of_lock_expressions_keep_their_address_and_lock_type(tmp_path: Path) -> None:
    src = tmp_path / "loader.py"
    src.write_text(SOURCE)
    variables = [
        _var("self", "<Loader at 0x7f642e110690>", True),
        _var("other", "<Loader at 0x7F642E0E9950>", True),
        _var("label", '"rank0 secret path /data/x"', True),
        _var("lock", "<_thread.lock at 0x7f642e1106c0>"),
    ]
    (thread,) = parse_dump(_dump(src, "Loader.produce", 9, variables))
    assert thread.locals_at(0) is not None
    assert thread.locals_at(0).values == (("@lock", "0x7f642e1106c0 _thread.lock"), ("@other", "0x7f642e0e9950"))
    assert "secret" not in repr(thread.locals)  # a string is never kept, whatever its name


def test_a_module_global_is_marked_and_an_unknown_name_left_out(tmp_path: Path) -> None:
    src = tmp_path / "loader.py"
    src.write_text(SOURCE)
    (thread,) = parse_dump(_dump(src, "Loader.flush", 15, [_var("self", "<Loader at 0x7f00000010a0>", True)]))
    found = thread.locals_at(0)
    # GLOBAL_LOCK is assigned at the module's top level; undefined_name is not (a closure's
    # or a cell variable py-spy does not list: no identity rather than a wrong one)
    assert found is not None and found.values == (("@GLOBAL_LOCK", "-"),)


def test_a_cell_variable_has_no_identity(tmp_path: Path) -> None:
    src = tmp_path / "loader.py"
    src.write_text(SOURCE)
    (thread,) = parse_dump(
        _dump(
            src,
            "Loader.cells",
            20,
            [_var("self", "<cell at 0x7f974a28c400>", True), _var("cb", "<function at 0x7f974a50df80>")],
        )
    )
    assert thread.locals == ()


def test_nothing_is_kept_without_locals_or_source(tmp_path: Path) -> None:
    src = tmp_path / "loader.py"
    src.write_text(SOURCE)
    without_locals = json.loads(_dump(src, "Loader.produce", 9, []))
    without_locals[0]["frames"][0]["locals"] = None  # py-spy run without --locals
    assert parse_dump(json.dumps(without_locals))[0].locals == ()
    gone = tmp_path / "gone.py"  # a source the process cannot read
    (thread,) = parse_dump(_dump(gone, "Loader.produce", 9, [_var("self", "<Loader at 0x7f0000000010>")]))
    assert thread.locals == ()
