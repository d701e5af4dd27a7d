"""A log-log line chart as a standalone SVG: one line per series, a legend, decade ticks.

For the benchmarks' cost curves (``bench_curve.py``); no plotting library needed, so the
picture is made wherever the bench runs and is reviewed as text in the diff.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

WIDTH, HEIGHT = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 190, 40, 50
# distinguishable in colour and in grey, one per stage
COLOURS = ("#1b6ac9", "#d1495b", "#2a9d5c", "#e49b0f", "#6c4ab6", "#4a4a4a", "#00a3a3")
DASHES = ("", "6 3", "2 3", "8 3 2 3", "", "6 3", "2 3")


def _decades(low: float, high: float) -> list[float]:
    return [10.0**e for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)]


def _label(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1_000:
        return f"{value / 1_000:g}k"
    return f"{value:g}"


def loglog(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    guide: tuple[float, str] | None = None,
) -> str:
    """The chart of ``series`` (name → (x, y) points, both positive); ``guide`` draws a
    dashed horizontal line at a y value with its words (a goal, such as 5 s)."""
    points = [p for line in series.values() for p in line if p[0] > 0 and p[1] > 0]
    if not points:
        raise ValueError("nothing to plot: every point is zero or negative")
    ys = [y for _, y in points] + ([guide[0]] if guide else [])
    x_ticks = _decades(min(x for x, _ in points), max(x for x, _ in points))
    y_ticks = _decades(min(ys), max(ys))
    x0, x1 = math.log10(x_ticks[0]), math.log10(x_ticks[-1]) or 1.0
    y0, y1 = math.log10(y_ticks[0]), math.log10(y_ticks[-1])
    span_x, span_y = max(x1 - x0, 1e-9), max(y1 - y0, 1e-9)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (math.log10(x) - x0) / span_x * plot_w

    def py(y: float) -> float:
        return TOP + plot_h - (math.log10(y) - y0) / span_y * plot_h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for t in x_ticks:
        out.append(f'<line x1="{px(t):.1f}" y1="{TOP}" x2="{px(t):.1f}" y2="{TOP + plot_h}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{px(t):.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{_label(t)}</text>')
    for t in y_ticks:
        out.append(f'<line x1="{LEFT}" y1="{py(t):.1f}" x2="{LEFT + plot_w}" y2="{py(t):.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{LEFT - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#888"/>')
    out.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 10}" text-anchor="middle">{escape(x_label)}</text>')
    out.append(
        f'<text transform="translate(16 {TOP + plot_h / 2:.1f}) rotate(-90)" text-anchor="middle">'
        f"{escape(y_label)}</text>"
    )
    if guide:
        y, words = guide
        out.append(
            f'<line x1="{LEFT}" y1="{py(y):.1f}" x2="{LEFT + plot_w}" y2="{py(y):.1f}" '
            'stroke="#999" stroke-dasharray="3 3"/>'
        )
        out.append(f'<text x="{LEFT + 4}" y="{py(y) - 4:.1f}" fill="#666">{escape(words)}</text>')
    for n, (name, line) in enumerate(series.items()):
        colour, dash = COLOURS[n % len(COLOURS)], DASHES[n % len(DASHES)]
        kept = sorted(p for p in line if p[0] > 0 and p[1] > 0)
        if not kept:
            continue
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in kept)
        dashing = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dashing}/>')
        for x, y in kept:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>')
        ly = TOP + 10 + n * 20
        out.append(
            f'<line x1="{LEFT + plot_w + 14}" y1="{ly}" x2="{LEFT + plot_w + 40}" y2="{ly}" '
            f'stroke="{colour}" stroke-width="2"{dashing}/>'
        )
        out.append(f'<text x="{LEFT + plot_w + 46}" y="{ly + 4}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
