"""A bar chart as a few hundred bytes of SVG, small enough to travel as a data URI.

The report's plots (plots.py) are PNGs of tens of KiB; a viewer that shows an embedded image
only below some size (the Dagster UI renders a markdown value inline under 1,000 characters,
and collapses a longer one behind a link) can still show one figure per bar at a glance
with this. No stage writes it: it is made for display from figures already measured.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

BAR_WIDTH = 36
SLOT = 56  # horizontal room per bar, its labels included
TOP = 16  # room above the tallest bar for its value
BASE = 72  # y of the bars' baseline
HEIGHT = 90
COLOR = "#4f43dd"


def short_number(value: float) -> str:
    """3 significant figures at most, no exponent: 1,480 / 88.7 / 3.47 / 0.082."""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.2g}"


def bar_chart_svg(bars: Sequence[tuple[str, float]]) -> str:
    """One bar per (label, value), its value above it and its label below; heights are
    proportional to the values, the tallest filling the chart. Negative values draw as 0."""
    top = max((value for _, value in bars), default=0.0)
    scale = (BASE - TOP) / top if top > 0 else 0.0
    path, texts = [], []
    for n, (label, value) in enumerate(bars):
        x, height = 10 + n * SLOT, max(value, 0.0) * scale
        center = x + BAR_WIDTH // 2
        path.append(f"M{x} {BASE}h{BAR_WIDTH}v{-height:.1f}h{-BAR_WIDTH}z")
        texts.append(f"<text x='{center}' y='{BASE - height - 4:.0f}'>{short_number(value)}</text>")
        texts.append(f"<text x='{center}' y='{BASE + 14}'>{_escape(label)}</text>")
    width = 20 + len(bars) * SLOT - (SLOT - BAR_WIDTH)
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{HEIGHT}' font-family='sans-serif' "
        f"font-size='11' text-anchor='middle'><path fill='{COLOR}' d='{''.join(path)}'/>{''.join(texts)}</svg>"
    )


def svg_data_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("'", "&apos;")
