"""A hostile stand-in for ``hangdoc.probe``: a real process that serves the probe's socket
protocol (one request line; an 8-byte big-endian length and that many bytes) with an
answer of the attacker's choosing. It listens where it is told (``--dir``, a directory of
its own, mode 0700; its socket ``<pid>.sock`` unless ``--name`` says otherwise), so the real
client finds it as it finds a probe, and prints ``ready <socket path>`` once it listens.
Standard library only (Python 3.8+): another user runs it with the system's Python.

Answers (``--answer``), each about ``--size`` bytes:

- ``entries``: a well-formed answer whose flight recorder dump is ``{"entries":[{},{},...]}``;
- ``exceptions``: ``{"ok": true, "exceptions": [{}, {}, ...]}``;
- ``lists``: ``{"ok": true, "exceptions": [[], [], ...]}``;
- ``strings``: ``{"ok": true, "exceptions": ["ab", "ab", ...]}``;
- ``numbers``, ``dump-lists``, ``dump-strings``: a dump of ``{"entries": [1000, 1000, ...]}``,
  ``[[], [], ...]``, ``["ab", "ab", ...]``;
- ``astral``: a dump of one long name holding one character past U+FFFF;
- ``quiet``: the ``state`` answer of a job without torch.distributed (a few hundred bytes).

``--drip SECONDS`` sends the answer one byte per SECONDS instead of all at once.

Usage: ``python tests/support/fake_probe.py --dir DIR --answer entries --size 16000000``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import time

LENGTH = struct.Struct(">Q")


DUMP_ITEMS = {"entries": b"{},", "numbers": b"1000,", "dump-lists": b"[],", "dump-strings": b'\\"ab\\",'}
ANSWER_ITEMS = {"exceptions": b"{},", "lists": b"[],", "strings": b'"ab",'}
KINDS = (*DUMP_ITEMS, *ANSWER_ITEMS, "astral", "quiet")


def answer(kind: str, size: int, items: int = 0) -> bytes:
    """The answer's JSON text, about ``size`` bytes; ``items``: for a dump, that many items,
    and the rest of ``size`` a name of padding."""
    if kind == "quiet":
        return json.dumps(
            {
                "ok": True,
                "pid": os.getpid(),
                "heartbeat": None,
                "exceptions": [],
                "exceptions_left_out": 0,
                "flight": {"error": "torch.distributed is not initialised in this process"},
            }
        ).encode()
    head = b'{"ok": true, "pid": 1, "heartbeat": null, "exceptions": [], "flight": {"dump": "{\\"'
    if kind == "astral":  # one long name, and one character past U+FFFF in it
        return head + b'version\\": \\"' + b"a" * size + b'\\ud83d\\ude00\\"}"}}'
    if kind in DUMP_ITEMS:
        item = DUMP_ITEMS[kind]
        count = items or size // len(item)
        pad = b'pad\\": \\"' + b"x" * max(size - count * len(item), 0) + b'\\", \\"' if items else b""
        return head + pad + b'entries\\": [' + item * count + item[:-1] + b']}"}}'
    item = ANSWER_ITEMS[kind]
    return b'{"ok": true, "exceptions": [' + item * (size // len(item)) + item[:-1] + b"]}"


def serve(directory: str, data: bytes, drip: float, name: str = "") -> None:
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, name or f"{os.getpid()}.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    print("ready", path, flush=True)
    message = LENGTH.pack(len(data)) + data
    while True:
        conn, _ = server.accept()
        with conn:
            try:
                conn.recv(64)
                if drip <= 0:
                    conn.sendall(message)
                    continue
                for i in range(len(message)):
                    conn.sendall(message[i : i + 1])
                    time.sleep(drip)
            except OSError:
                continue


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--answer", default="entries", choices=KINDS)
    parser.add_argument("--size", type=int, default=16_000_000)
    parser.add_argument("--drip", type=float, default=0.0)
    parser.add_argument("--items", type=int, default=0, help="a dump's items (default: as many as --size holds)")
    parser.add_argument("--name", default="", help="the socket's file name (default: <pid>.sock)")
    args = parser.parse_args()
    serve(args.dir, answer(args.answer, args.size, args.items), args.drip, args.name)


if __name__ == "__main__":
    main()
