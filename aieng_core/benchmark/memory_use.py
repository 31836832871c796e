"""Peak resident memory of this process against the memory budget rule of thumb
(aieng_core/model/memory.py: weights x 1.3 + 2 GiB)."""

from __future__ import annotations

import resource
import sys
from typing import Any

from aieng_core.model.memory import BYTES_PER_PARAMETER, budget_bytes

RULE = "fp32 weights x 1.3 + 2 GiB"


def peak_rss_bytes() -> int:
    """The process's resident-set high-water mark since it started (ru_maxrss: KiB on Linux,
    bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def memory_figures(parameters: int) -> dict[str, Any]:
    """Peak RSS now, the budget the rule gives fp32 weights of `parameters`, and pass/fail."""
    peak = peak_rss_bytes()
    budget = budget_bytes(parameters, "fp32")
    return {
        "peak_rss_bytes": peak,
        "peak_rss_measure": "ru_maxrss of the measuring process: its high-water mark since it started",
        "weights_bytes": parameters * BYTES_PER_PARAMETER["fp32"],
        "budget_bytes": budget,
        "rule": RULE,
        "within_budget": peak <= budget,
    }
