"""Shared pytest setup: the folders say what a test needs.

Every test under ``live/`` starts real processes (torch.distributed jobs, agents, other
users) and is marked ``live``; under ``live/netns/`` also ``netns`` (root and ``ip netns``).
A test elsewhere may mark itself ``netns`` too. ``make test-fast`` deselects both, so it
starts no job. Where namespaces cannot be made, ``netns`` tests are skipped with the reason.

Every report and error object ``hangdoc.report.json_report`` makes in this process is
checked against the JSON Schema hangdoc ships (``hangdoc/report/report.schema.json``): one
that breaks it fails where it is made, and again at the end of the session (lists of more
than 256 items are checked on their first and last 128: ``support.report_schema.sampled``).
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

LIVE = Path(__file__).resolve().parent / "live"
NETNS = LIVE / "netns"


def _netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root for ip netns"
    if shutil.which("ip") is None:
        return "needs the ip command (iproute2)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path))
        if path.is_relative_to(LIVE):
            item.add_marker(pytest.mark.live)
        if path.is_relative_to(NETNS):
            item.add_marker(pytest.mark.netns)
    reason = _netns_unavailable()
    if reason is None:
        return
    for item in items:
        if "netns" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session", autouse=True)
def _json_reports_hold_their_schema() -> Iterator[None]:
    """Wrap the makers of ``json_report`` (the report's ``_report``, which ``to_json_dict``
    and ``render_json`` call, the undiagnosed report, the error object) for the session."""
    from support import report_schema

    from hangdoc.report import json_report

    broken: list[str] = []

    def checked(make: Callable[..., dict[str, Any]], check: Callable[[Any, str], None]) -> Callable[..., Any]:
        @functools.wraps(make)
        def made(*args: Any, **kwargs: Any) -> dict[str, Any]:
            value = make(*args, **kwargs)
            try:
                check(report_schema.sampled(value), f"a report made by json_report.{make.__name__}")
            except report_schema.SchemaBroken as err:
                broken.append(str(err))
                raise
            return value

        return made

    makers = {
        "_report": report_schema.check_report,
        "undiagnosed_to_json_dict": report_schema.check_report,
        "error_to_dict": report_schema.check_error,
    }
    originals = {name: getattr(json_report, name) for name in makers}
    for name, check in makers.items():
        setattr(json_report, name, checked(originals[name], check))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(json_report, name, original)
    assert not broken, "reports broke the shipped JSON Schema:\n" + "\n".join(dict.fromkeys(broken))
