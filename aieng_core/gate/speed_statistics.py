"""Is the candidate slower than the deployed bundle? A decision with a stated error rate.

Input: per-request end-to-end latencies of the same requests sent to both bundles, round by
round (each round serves each bundle once, in a fresh server, the order alternated: see
compare.py). The statistic is the ratio of medians, candidate over deployed, pooled over the
rounds. Its uncertainty is a paired bootstrap: request i of round r was the same work on both
sides, so (candidate, deployed) pairs are resampled together, within each round. The
candidate fails only when the whole interval lies above 1 + max_regression: "slower by more
than the allowance, beyond what noise explains". A point estimate above the limit with an
interval that reaches below it passes (and is reported as such).

Noise shared by both sides of a round (another process taking the CPU for a while) moves
both; interleaving the turns spreads what is not shared over both sides. What the interval
cannot see (a disturbance that hits one side's turns only) is why the false-failure rate is
also measured, not only assumed: scripts/gate_error_rates.py gates a bundle against itself
with a CPU hog beside it, and a slower model against a faster one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

RESAMPLES = 2000
SEED = 20261201  # the same data gives the same interval, run after run


def ratio_of_medians(candidate: Sequence[float], deployed: Sequence[float]) -> float:
    import numpy as np

    return float(np.median(np.asarray(candidate, dtype=float)) / np.median(np.asarray(deployed, dtype=float)))


def paired_bootstrap(
    rounds: Sequence[tuple[Sequence[float], Sequence[float]]],
    confidence: float,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float]:
    """(low, high) percentile interval of the pooled ratio of medians at `confidence`, each
    round's (candidate, deployed) pairs resampled together within the round."""
    import numpy as np

    rng = np.random.default_rng(seed)
    pairs = [(np.asarray(a, dtype=float), np.asarray(b, dtype=float)) for a, b in rounds]
    for a, b in pairs:
        if len(a) != len(b) or len(a) == 0:
            raise ValueError(
                f"each round needs the same positive number of requests on both sides ({len(a)}, {len(b)})"
            )
    ratios = np.empty(resamples)
    for k in range(resamples):
        draws = [rng.integers(0, len(a), len(a)) for a, _ in pairs]
        a = np.concatenate([side[index] for (side, _), index in zip(pairs, draws)])
        b = np.concatenate([side[index] for (_, side), index in zip(pairs, draws)])
        ratios[k] = np.median(a) / np.median(b)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return float(low), float(high)


def open_question(decision: dict[str, Any]) -> bool:
    """Whether `decision` leaves the answer open: the candidate's median is slower than the
    limit allows, but its interval still reaches below the limit (noise not ruled out). Only
    then is one more round worth serving (compare.py); a clear pass or failure stops."""
    return not decision["regression"] and decision["ratio"] > decision["limit"]


def decide(
    rounds: Sequence[tuple[Sequence[float], Sequence[float]]], max_regression: float, confidence: float
) -> dict[str, Any]:
    """`{ratio, interval, confidence, limit, regression, verdict}`: `ratio` is candidate /
    deployed median latency (above 1: the candidate is slower), `regression` True only when
    the interval's low end is above `limit` = 1 + max_regression."""
    candidate = [value for a, _ in rounds for value in a]
    deployed = [value for _, b in rounds for value in b]
    ratio = ratio_of_medians(candidate, deployed)
    low, high = paired_bootstrap(rounds, confidence)
    limit = 1.0 + max_regression
    regression = low > limit
    if regression:
        verdict = f"slower: median latency x{ratio:.3f}, interval [{low:.3f}, {high:.3f}] above {limit:.2f}"
    elif ratio > limit:
        verdict = (
            f"not shown slower: median latency x{ratio:.3f} is above {limit:.2f} but the interval "
            f"[{low:.3f}, {high:.3f}] reaches below it (noise cannot be ruled out)"
        )
    else:
        verdict = f"no regression: median latency x{ratio:.3f}, interval [{low:.3f}, {high:.3f}]"
    return {
        "ratio": ratio,
        "interval": [low, high],
        "confidence": confidence,
        "limit": limit,
        "regression": regression,
        "verdict": verdict,
        "requests": len(candidate),
        "statistic": "median E2EL candidate / median E2EL deployed, paired bootstrap within rounds "
        f"({RESAMPLES} resamples)",
    }
