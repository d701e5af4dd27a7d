"""Numbers read from outside (``hangdoc.digits``): ASCII digits only, within bounds."""

from __future__ import annotations

import pytest

from hangdoc.digits import bounded_int


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("7", 7),
        ("007", 7),
        ("65535", 65535),
        ("0" * 5000 + "9", 9),
        ("", None),
        (" 7", None),
        ("+7", None),
        ("-1", None),
        ("1_0", None),
        ("²", None),
        ("٣", None),
        ("7.0", None),
        ("65536", None),
        ("9" * 5000, None),
    ],
)
def test_bounded_int_reads_ascii_digits_within_bounds(text: str, expected: int | None) -> None:
    assert bounded_int(text, 0, 65535) == expected


def test_bounded_int_lower_bound() -> None:
    assert bounded_int("0", 1, 10) is None
    assert bounded_int("1", 1, 10) == 1
    assert bounded_int("10", 1, 10) == 10
    assert bounded_int("11", 1, 10) is None
