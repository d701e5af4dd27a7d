"""Numbers read from outside (an environment, a job spec, a command line, a dump file):
ASCII digits only, bounded before they are parsed. ``str.isdigit()`` and ``int()`` also
take ``²``, ``٣`` and ``1_0``. Standard library only."""

from __future__ import annotations

import re

ASCII_DIGITS = re.compile(r"[0-9]+", re.ASCII)


def bounded_int(text: str, minimum: int, maximum: int) -> int | None:
    """The number ``text`` spells in ASCII digits when it lies in [minimum, maximum], else
    None. Its length is checked before parsing: 5000 digits cost nothing."""
    if not ASCII_DIGITS.fullmatch(text):
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(maximum)):
        return None
    number = int(digits)
    return number if minimum <= number <= maximum else None
