"""``_Invalid``: why a bundle's JSON is not a snapshot, and where; and how its values are
named in the one line that says so."""

from __future__ import annotations

from typing import Any

from ..errors import shown


class _Invalid(Exception):
    """A decoding failure; ``where`` is built up on the way out, so success pays nothing."""

    def __init__(self, message: str, where: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.where = where

    def under(self, segment: str) -> _Invalid:
        sep = "" if not self.where or self.where.startswith("[") else "."
        self.where = f"{segment}{sep}{self.where}"
        return self


def _index(idx: object, size: int, what: str) -> int:
    if type(idx) is not int:
        raise _Invalid(f"{what} reference must be an integer, got {_kind(idx)}")
    if not 0 <= idx < size:
        raise _Invalid(f"{what} index {idx} out of range (table has {size})")
    return idx


def _kind(value: object) -> str:
    """How a JSON value is named in error messages."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if type(value) in (int, float):
        return f"the number {shown(value, 40)}"
    return names.get(type(value), type(value).__name__)


def _expect_list(v: Any, where: str = "") -> list[Any]:
    if type(v) is not list:
        raise _Invalid(f"expected a list, got {_kind(v)}", where)
    return v
