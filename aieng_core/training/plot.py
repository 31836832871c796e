"""The loss curves as a PNG, for the Dagster UI and the artifact."""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display anywhere this runs
import matplotlib.pyplot as plt  # noqa: E402


def loss_curve_png(history: list[dict[str, Any]], unigram_baseline: float) -> bytes:
    train = [(h["step"], h["train_loss"]) for h in history if "train_loss" in h]
    validation = [(h["step"], h["validation_loss"]) for h in history if "validation_loss" in h]
    figure, axes = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    if train:
        axes.plot(*zip(*train), label="train loss", linewidth=1.2)
    if validation:
        axes.plot(*zip(*validation), label="validation loss", marker="o", linewidth=1.5)
    axes.axhline(unigram_baseline, color="grey", linestyle="--", label=f"unigram baseline {unigram_baseline:.2f}")
    axes.set_xlabel("step")
    axes.set_ylabel("cross-entropy (nats/token)")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return buffer.getvalue()
