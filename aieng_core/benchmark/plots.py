"""The report's two plots as PNG: throughput by batch size (our engine beside its peers) and
latency percentiles by concurrency. matplotlib is imported here only."""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display anywhere this runs
import matplotlib.pyplot as plt  # noqa: E402

LATENCY_PANELS = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2EL"))


def _png(figure: Any) -> bytes:
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return buffer.getvalue()


def _not_measured(axes: Any, what: str) -> None:
    axes.text(0.5, 0.5, f"{what}: not measured (see truncated_reason)", ha="center", va="center")
    axes.set_axis_off()


def throughput_png(report: dict[str, Any]) -> bytes:
    """Grouped bars: tokens/s at each batch size, ours beside transformers."""
    rows = report["throughput"]
    sizes = sorted({row["batch_size"] for row in rows})
    series: list[tuple[str, dict[int, float]]] = [
        ("ours", {row["batch_size"]: row["ours"]["tokens_per_second"] for row in rows}),
    ]
    if any(row["transformers"] for row in rows):
        series.append(
            (
                "transformers generate",
                {row["batch_size"]: row["transformers"]["tokens_per_second"] for row in rows if row["transformers"]},
            )
        )
    figure, axes = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    if not sizes:
        _not_measured(axes, "throughput")
        return _png(figure)
    width = 0.8 / len(series)
    for offset, (label, values) in enumerate(series):
        xs = [n + offset * width for n, size in enumerate(sizes) if size in values]
        axes.bar(xs, [values[size] for size in sizes if size in values], width, label=label)
    axes.set_xticks([n + width * (len(series) - 1) / 2 for n in range(len(sizes))], [str(s) for s in sizes])
    settings = report["settings"]
    axes.set_xlabel(
        f"batch size ({settings['prompt_tokens']} prompt + {settings['new_tokens']} new tokens per request)"
    )
    axes.set_ylabel("generated tokens / s")
    axes.grid(axis="y", alpha=0.3)
    axes.legend(fontsize="small")
    return _png(figure)


def latency_png(report: dict[str, Any]) -> bytes:
    """P50 and P99 of TTFT, TPOT, ITL and E2EL against the requests kept in flight."""
    levels = report["latency"]
    figure, grid = plt.subplots(2, 2, figsize=(6.4, 4.8), dpi=100)
    if not levels:
        for axes in grid.flat:
            axes.set_axis_off()
        _not_measured(grid.flat[0], "latency")
        return _png(figure)
    concurrency = [level["concurrency"] for level in levels]
    for axes, (key, title) in zip(grid.flat, LATENCY_PANELS):
        for percentile, style in (("p50", "-o"), ("p99", "--s")):
            axes.plot(concurrency, [level[key][percentile] for level in levels], style, label=percentile.upper())
        axes.set_title(title, fontsize="medium")
        axes.set_xlabel("requests in flight")
        axes.set_ylabel("ms")
        axes.set_xticks(concurrency)
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    return _png(figure)
