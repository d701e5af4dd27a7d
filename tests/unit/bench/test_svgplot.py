"""The benchmarks' log-log chart: a well-formed SVG whose points sit where their values say."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

import pytest
from support.paths import REPO

sys.path.insert(0, str(REPO / "bench"))
from svgplot import loglog  # noqa: E402

NS = {"s": "http://www.w3.org/2000/svg"}


def test_points_on_a_log_scale_and_a_legend_per_series() -> None:
    svg = loglog(
        {"analysis": [(1e3, 0.1), (1e4, 1.0), (1e5, 10.0)], "round <&>": [(1e3, 1.0), (1e5, 1.0)]},
        title="cost",
        x_label="ranks",
        y_label="s",
        guide=(5.0, "5 s goal"),
    )
    root = ET.fromstring(svg)
    lines = root.findall("s:polyline", NS)
    assert len(lines) == 2
    first = [tuple(map(float, p.split(","))) for p in lines[0].get("points", "").split()]
    # equal steps in log10 are equal steps on the page: a straight line
    assert first[1][0] - first[0][0] == pytest.approx(first[2][0] - first[1][0], abs=0.2)
    assert first[0][1] - first[1][1] == pytest.approx(first[1][1] - first[2][1], abs=0.2)
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "round <&>" in texts and "5 s goal" in texts and "1k" in texts and "100k" in texts


def test_nothing_positive_to_plot_is_an_error() -> None:
    with pytest.raises(ValueError, match="nothing to plot"):
        loglog({"a": [(0, 1.0)]}, title="t", x_label="x", y_label="y")
