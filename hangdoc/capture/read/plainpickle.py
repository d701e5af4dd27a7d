"""Plain data out of a pickle, read without pickle's own loader.

torch writes its flight recorder dump as a pickle of plain data: dicts with string keys,
lists, ``(name, desc)`` tuples, strings, integers, booleans and ``None``, memo references for
repeated strings and frames (protocol 2: ``BINPUT``/``BINGET``). ``pickle.Unpickler`` is
not safe on such a file from someone else, even with ``find_class`` refusing every global:
a dict key built as a tuple is hashed while it loads, so a key nested a million deep
crashes the interpreter (a C stack overflow, 1 MB of pickle) and a key that shares one
tuple 2^40 times through the memo never finishes hashing.

``load_plain`` runs the opcodes torch and ``pickle.dumps`` write for such data, one at a
time in a loop (no recursion, whatever the nesting), and refuses everything else: any
global (so no code), sets, bytes, persistent ids, a dict key that is not a scalar, an
integer longer than ``MAX_INT_BYTES``, and more than ``max_objects`` objects built. Memo
references are kept as references, never copied, so memory is bounded by the objects built
(at most one per opcode). The caller must still never walk or ``str()`` a container it did
not check: a list shared 2^40 times through the memo is 41 lists here.
"""

from __future__ import annotations

import pickletools
import struct
from struct import unpack_from
from typing import Any

MAX_INT_BYTES = 32  # torch writes int64 (LONG1 with at most 9 bytes); 256 bits is plenty
_SCALAR_KEYS = (str, int, float, bool, type(None))
_NAMES = {ord(op.code): op.name for op in pickletools.opcodes}


class NotPlainData(ValueError):
    """The pickle is not plain data within the bounds (one line)."""


def load_plain(raw: bytes, max_objects: int) -> Any:
    """The value the pickle ``raw`` holds; ``NotPlainData`` when it is anything but plain
    data, or builds more than ``max_objects`` objects."""
    try:
        return _run(raw, max_objects)
    except NotPlainData:
        raise
    except (IndexError, KeyError, ValueError, struct.error) as err:  # truncated, bad memo index, bad text
        raise NotPlainData(f"a broken pickle ({type(err).__name__})") from None


def _run(raw: bytes, max_objects: int) -> Any:  # noqa: C901 - one loop, one branch per opcode
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}
    made = 0
    pos = 0
    end = len(raw)
    while pos < end:
        op = raw[pos]
        pos += 1
        if op == 0x68:  # BINGET
            stack.append(memo[raw[pos]])
            pos += 1
            continue
        if op == 0x6A:  # LONG_BINGET
            stack.append(memo[unpack_from("<I", raw, pos)[0]])
            pos += 4
            continue
        made += 1
        if made > max_objects:
            raise NotPlainData(f"more than {max_objects:,} objects: larger than any flight recorder dump")
        if op == 0x28:  # MARK
            marks.append(len(stack))
        elif op == 0x5D:  # EMPTY_LIST
            stack.append([])
        elif op == 0x7D:  # EMPTY_DICT
            stack.append({})
        elif op == 0x65:  # APPENDS
            start = marks.pop()
            items = stack[start:]
            del stack[start:]
            _list(stack[-1]).extend(items)
        elif op == 0x61:  # APPEND
            item = stack.pop()
            _list(stack[-1]).append(item)
        elif op == 0x75:  # SETITEMS
            start = marks.pop()
            items = stack[start:]
            del stack[start:]
            target = _dict(stack[-1])
            for i in range(0, len(items) - 1, 2):
                target[_key(items[i])] = items[i + 1]
        elif op == 0x73:  # SETITEM
            value = stack.pop()
            key = _key(stack.pop())
            _dict(stack[-1])[key] = value
        elif op == 0x4B:  # BININT1
            stack.append(raw[pos])
            pos += 1
        elif op == 0x4D:  # BININT2
            stack.append(unpack_from("<H", raw, pos)[0])
            pos += 2
        elif op == 0x4A:  # BININT
            stack.append(unpack_from("<i", raw, pos)[0])
            pos += 4
        elif op in (0x8A, 0x8B):  # LONG1, LONG4
            size = raw[pos] if op == 0x8A else unpack_from("<I", raw, pos)[0]
            pos += 1 if op == 0x8A else 4
            if size > MAX_INT_BYTES:
                raise NotPlainData(f"an integer of {size:,} bytes: a dump holds 64-bit numbers")
            if pos + size > end:
                raise IndexError
            stack.append(int.from_bytes(raw[pos : pos + size], "little", signed=True))
            pos += size
        elif op in (0x8C, 0x58, 0x8D):  # SHORT_BINUNICODE, BINUNICODE, BINUNICODE8
            width = {0x8C: 1, 0x58: 4, 0x8D: 8}[op]
            size = raw[pos] if width == 1 else unpack_from("<I" if width == 4 else "<Q", raw, pos)[0]
            pos += width
            if pos + size > end:
                raise IndexError
            stack.append(raw[pos : pos + size].decode("utf-8", "surrogatepass"))
            pos += size
        elif op == 0x4E:  # NONE
            stack.append(None)
        elif op == 0x88:  # NEWTRUE
            stack.append(True)
        elif op == 0x89:  # NEWFALSE
            stack.append(False)
        elif op == 0x47:  # BINFLOAT
            stack.append(unpack_from(">d", raw, pos)[0])
            pos += 8
        elif op == 0x29:  # EMPTY_TUPLE
            stack.append(())
        elif op in (0x85, 0x86, 0x87):  # TUPLE1, TUPLE2, TUPLE3
            count = op - 0x84
            if len(stack) < count:
                raise IndexError
            items = stack[-count:]
            del stack[-count:]
            stack.append(tuple(items))
        elif op == 0x74:  # TUPLE
            start = marks.pop()
            items = stack[start:]
            del stack[start:]
            stack.append(tuple(items))
        elif op == 0x94:  # MEMOIZE
            memo[len(memo)] = stack[-1]
        elif op == 0x71:  # BINPUT
            memo[raw[pos]] = stack[-1]
            pos += 1
        elif op == 0x72:  # LONG_BINPUT
            memo[unpack_from("<I", raw, pos)[0]] = stack[-1]
            pos += 4
        elif op == 0x80:  # PROTO
            pos += 1
        elif op == 0x95:  # FRAME: a length hint only
            pos += 8
        elif op == 0x30:  # POP
            stack.pop()
        elif op == 0x2E:  # STOP
            if len(stack) != 1 or marks:
                raise NotPlainData("a broken pickle (STOP with a stack of other than one value)")
            return stack[0]
        else:
            raise NotPlainData(_refusal(op, pos - 1, stack))
    raise NotPlainData("a broken pickle (truncated: no STOP)")


def _refusal(op: int, at: int, stack: list[Any]) -> str:
    name = _NAMES.get(op)
    if name is None:
        return f"a broken pickle (byte 0x{op:02x} at {at} is no opcode)"
    if name == "STACK_GLOBAL" and len(stack) >= 2 and all(isinstance(s, str) for s in stack[-2:]):
        return f"the pickle names {stack[-2][:64]}.{stack[-1][:64]}: a dump holds plain data only"
    return f"the pickle uses {name} at byte {at}: a dump holds plain data only"


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise NotPlainData(f"a broken pickle (append to a {type(value).__name__})")
    return value


def _dict(value: object) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise NotPlainData(f"a broken pickle (set an item of a {type(value).__name__})")
    return value


def _key(value: object) -> object:
    """A dict key, only when hashing it is cheap: never a tuple (hashing one walks it)."""
    if not isinstance(value, _SCALAR_KEYS):
        raise NotPlainData(f"a dict key is a {type(value).__name__}: a dump's keys are strings")
    return value
