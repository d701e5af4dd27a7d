"""JSON from another process, read within a budget: however the text is shaped, reading it
builds no more values than the caller allows, and stops at the first one past that.

``json.loads`` builds a whole document before anyone can look at it: 16 MiB of
``[{},{},...]`` is 5.6 million dicts (420 MB) before a check that keeps 20,000 runs. Two
readers here, for the two shapes of what a probe sends:

- ``loads_small``: a document of few values whose strings may be long (a probe's answer: a
  few dozen values and one long string, the flight recorder dump). Parsed here, value by
  value, strings by ``json``'s own C ``scanstring``; every string, number, literal, key and
  container counts one, and so does each level of nesting past ``max_depth``.
- ``check_counts``: a document of many values (the dump itself), measured without keeping
  it: ``json``'s C scanner runs with hooks that count each object and number as it is
  made and raise once the count passes the budget, and drop what they count. Lists and
  strings have no hook, so they are counted from the text before parsing (each ``[`` and
  each pair of ``"``: an upper bound). A text that passes builds at most ``max_objects``
  containers, strings and numbers when ``json.loads`` reads it afterwards.

Both raise ``ValueError``: ``JsonTooBig`` past the budget (``JsonTooDeep`` past the nesting
the reader allows), a plain ``ValueError`` naming a position (never the content) where the
text is not JSON.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Callable
from json import decoder

_scanstring: Callable[[str, int, bool], tuple[str, int]] = decoder.scanstring  # type: ignore[attr-defined]

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_LITERALS = (
    ("null", None),
    ("true", True),
    ("false", False),
    ("NaN", math.nan),
    ("Infinity", math.inf),
    ("-Infinity", -math.inf),
)  # json.dumps writes the last three for non-finite floats
MAX_NUMBER_CHARS = 64  # a float's repr is 24 at most; an int of 2^64 is 20 digits
_ESCAPE = "hangdoc-json-escape"


class JsonTooBig(ValueError):
    """The text holds more values, or deeper nesting, than the reader allows."""


class JsonTooDeep(JsonTooBig):
    """The text nests deeper than the reader allows."""


def loads_small(text: str, max_values: int, max_depth: int = 16) -> object:
    """The JSON document in ``text``, of at most ``max_values`` values (keys included)
    nested at most ``max_depth`` deep; its strings are as long as the text lets them be."""
    reader = _Small(text, max_values, max_depth)
    value, end = reader.value(_skip(text, 0), 0)
    if _skip(text, end) != len(text):
        raise ValueError(f"not valid JSON: extra data at character {end}")
    return value


class _Small:
    def __init__(self, text: str, max_values: int, max_depth: int) -> None:
        self.text, self.left, self.max_values, self.max_depth = text, max_values, max_values, max_depth

    def count(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise JsonTooBig(f"more than {self.max_values:,} values")

    def value(self, pos: int, depth: int) -> tuple[object, int]:
        self.count()
        text = self.text
        char = text[pos : pos + 1]
        if char == '"':
            return _string(text, pos)
        if char in ("{", "["):
            if depth >= self.max_depth:
                raise JsonTooDeep(f"nested more than {self.max_depth} deep")
            return self.dict(pos + 1, depth + 1) if char == "{" else self.list(pos + 1, depth + 1)
        number = _NUMBER.match(text, pos)
        if number is not None:
            return _number(number), number.end()
        for name, literal in _LITERALS:
            if text.startswith(name, pos):
                return literal, pos + len(name)
        raise ValueError(f"not valid JSON: no value at character {pos}")

    def dict(self, pos: int, depth: int) -> tuple[dict[str, object], int]:
        text, out = self.text, dict[str, object]()
        pos = _skip(text, pos)
        if text[pos : pos + 1] == "}":
            return out, pos + 1
        while True:
            if text[pos : pos + 1] != '"':
                raise ValueError(f"not valid JSON: no key at character {pos}")
            self.count()
            key, pos = _string(text, pos)
            pos = _skip(text, pos)
            if text[pos : pos + 1] != ":":
                raise ValueError(f"not valid JSON: no ':' at character {pos}")
            out[key], pos = self.value(_skip(text, pos + 1), depth)
            pos = _skip(text, pos)
            char = text[pos : pos + 1]
            if char == "}":
                return out, pos + 1
            if char != ",":
                raise ValueError(f"not valid JSON: no ',' or '}}' at character {pos}")
            pos = _skip(text, pos + 1)

    def list(self, pos: int, depth: int) -> tuple[list[object], int]:
        text, out = self.text, list[object]()
        pos = _skip(text, pos)
        if text[pos : pos + 1] == "]":
            return out, pos + 1
        while True:
            item, pos = self.value(pos, depth)
            out.append(item)
            pos = _skip(text, pos)
            char = text[pos : pos + 1]
            if char == "]":
                return out, pos + 1
            if char != ",":
                raise ValueError(f"not valid JSON: no ',' or ']' at character {pos}")
            pos = _skip(text, pos + 1)


def _skip(text: str, pos: int) -> int:
    match = _WS.match(text, pos)
    return match.end() if match is not None else pos


def _string(text: str, pos: int) -> tuple[str, int]:
    try:
        return _scanstring(text, pos + 1, True)
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON: {err.msg} at character {err.pos}") from None


def _number(match: re.Match[str]) -> int | float:
    digits = match.group()
    if len(digits) > MAX_NUMBER_CHARS:
        raise JsonTooBig(f"a number of {len(digits):,} characters")
    return float(digits) if match.group(1) or match.group(2) else int(digits)


def check_counts(raw: bytes, max_objects: int) -> None:
    """Raise unless ``json.loads(raw)`` (ASCII text) builds at most ``max_objects`` objects,
    lists, strings and numbers; what this builds to count is dropped as it goes."""
    counted = raw.count(b"[") + raw.count(b'"') // 2
    if counted > max_objects:
        raise JsonTooBig(f"JSON of {counted:,} lists and strings or more: more than {max_objects:,}")
    left = [max_objects - counted]

    def made(_value: object) -> None:
        left[0] -= 1
        if left[0] < 0:
            raise JsonTooBig(f"JSON of more than {max_objects:,} objects, lists, strings and numbers")

    decoder = json.JSONDecoder(object_pairs_hook=made, parse_int=made, parse_float=made, parse_constant=made)
    try:
        decoder.decode(raw.decode("ascii"))
    except RecursionError:
        raise JsonTooDeep("JSON nested too deeply") from None
    except UnicodeDecodeError:
        raise ValueError("not ASCII") from None
    except json.JSONDecodeError as err:  # its message names a position, never the content
        raise ValueError(f"not valid JSON: {err.msg} at character {err.pos}") from None


def ascii_json(text: str) -> bytes:
    """JSON ``text`` as ASCII bytes, each other character written as ``\\uXXXX`` (outside
    a string such a character is not JSON either way): parsed again, the text costs one
    byte a character, where one character past U+FFFF made every character of it cost four."""
    return text.encode("ascii", _ESCAPE)


def _escape(err: UnicodeError) -> tuple[str, int]:
    if not isinstance(err, UnicodeEncodeError):
        raise err
    return json.dumps(err.object[err.start : err.end])[1:-1], err.end


codecs.register_error(_ESCAPE, _escape)
