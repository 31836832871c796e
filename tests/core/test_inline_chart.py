"""The inline bar chart: a small SVG whose bars follow the values and say them."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from aieng_core.benchmark.inline_chart import bar_chart_svg, short_number, svg_data_uri

SVG = "{http://www.w3.org/2000/svg}"


def bar_heights(svg: str) -> list[float]:
    path = ET.fromstring(svg).find(f"{SVG}path")
    assert path is not None
    return [-float(v) for v in re.findall(r"v(-?[0-9.]+)", path.get("d", ""))]


def test_bars_are_proportional_and_labelled() -> None:
    svg = bar_chart_svg([("1", 500.0), ("16", 1500.0), ("64", 3000.0)])
    root = ET.fromstring(svg)  # well-formed XML
    heights = bar_heights(svg)
    assert heights[2] == max(heights) > 0
    assert [h / heights[2] for h in heights] == pytest.approx([1 / 6, 0.5, 1.0], abs=0.01)
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert texts == ["500", "1", "1,500", "16", "3,000", "64"]


def test_labels_are_escaped_and_negative_values_draw_flat() -> None:
    svg = bar_chart_svg([("a<b & 'c'", -3.0), ("d", 2.0)])
    assert [t.text for t in ET.fromstring(svg).iter(f"{SVG}text")][1] == "a<b & 'c'"
    assert bar_heights(svg)[0] == 0.0


def test_the_data_uri() -> None:
    assert svg_data_uri("<svg/>") == "data:image/svg+xml;base64,PHN2Zy8+"


def test_short_numbers() -> None:
    assert [short_number(v) for v in (12345.6, 1480.2, 88.73, 3.4749, 0.0817)] == [
        "12,346", "1,480", "88.7", "3.47", "0.082"
    ]  # fmt: skip
