"""Serving metrics from per-request timelines, with the field's names and definitions.

The names and formulas are those of vLLM's `bench serve` and NVIDIA genai-perf, so the figures
read the same as theirs (METRIC_DEFINITIONS is written into every report):

- TTFT, time to first token: from sending the request to receiving the first streamed token;
- TPOT, time per output token: (E2EL - TTFT) / (output tokens - 1), per request (requests with
  a single output token have none);
- ITL, inter-token latency: every gap between consecutive streamed chunks, pooled over all
  requests (with one token per chunk, the mean ITL equals the mean TPOT);
- E2EL, end-to-end latency: from sending the request to receiving its last byte;
- request throughput: completed requests / duration; output-token throughput: generated
  tokens / duration, the duration running from the first request sent to the last finished;
- goodput: requests that met every SLO / duration (vLLM's `--goodput`, DistServe's definition).

Percentiles interpolate linearly between closest ranks, as numpy.percentile does by default.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

PERCENTILES = (50, 90, 99)

METRIC_DEFINITIONS = {
    "ttft": "time to first token: request sent -> first streamed token received (ms)",
    "tpot": "time per output token: (E2EL - TTFT) / (output_tokens - 1), per request with >= 2 tokens (ms)",
    "itl": "inter-token latency: gaps between consecutive streamed chunks, pooled over all requests (ms)",
    "e2el": "end-to-end latency: request sent -> last byte of the response received (ms)",
    "request_throughput": "completed requests / duration (req/s)",
    "output_throughput": "generated tokens / duration (tok/s)",
    "total_token_throughput": "(prompt + generated tokens) / duration (tok/s)",
    "duration": "first request sent -> last response finished (s)",
    "goodput": "requests meeting every SLO / duration (req/s), as vLLM's --goodput",
    "percentiles": "linear interpolation between closest ranks (numpy.percentile's default)",
    "source": "names and formulas of vLLM `bench serve` and NVIDIA genai-perf",
}


@dataclass
class RequestRecord:
    """One request as the client saw it; times are seconds on the client's monotonic clock."""

    prompt_tokens: int
    output_tokens: int  # tokens the request asked for; checked against the server's usage
    sent: float
    chunk_times: list[float] = field(default_factory=list)  # arrival of each streamed chunk with a token
    done: float = 0.0
    ok: bool = False
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.sent if self.chunk_times else None

    @property
    def e2el(self) -> float:
        return self.done - self.sent

    @property
    def tpot(self) -> float | None:
        ttft = self.ttft
        if ttft is None or self.output_tokens < 2:
            return None
        return (self.e2el - ttft) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        return [later - earlier for earlier, later in zip(self.chunk_times, self.chunk_times[1:])]


def percentile(values: Sequence[float], q: float) -> float:
    """numpy.percentile(values, q) with its default linear interpolation."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution_ms(seconds: Sequence[float]) -> dict[str, float | None]:
    """Mean and percentiles of a latency sample, in milliseconds (None when there is no sample)."""
    if not seconds:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}}
    values = [s * 1000.0 for s in seconds]
    return {"mean": sum(values) / len(values), **{f"p{q}": percentile(values, q) for q in PERCENTILES}}


def meets_slo(record: RequestRecord, slo_ms: dict[str, float]) -> bool:
    """Whether a finished request met every SLO in `slo_ms` (keys: ttft, tpot, e2el)."""
    measured = {"ttft": record.ttft, "tpot": record.tpot, "e2el": record.e2el}
    for name, limit in slo_ms.items():
        value = measured[name]
        if value is not None and value * 1000.0 > limit:
            return False
    return record.ok


def summarize(records: Sequence[RequestRecord], slo_ms: dict[str, float]) -> dict[str, Any]:
    """The metrics of one load run (see the module docstring for every definition)."""
    done = [r for r in records if r.ok]
    if not done:
        raise ValueError(f"no request of {len(records)} completed: {[r.error for r in records][:3]}")
    duration = max(r.done for r in done) - min(r.sent for r in records)
    output = sum(r.output_tokens for r in done)
    prompt = sum(r.prompt_tokens for r in done)
    chunks = sum(len(r.chunk_times) for r in done)
    return {
        "requests": len(records),
        "completed": len(done),
        "failed": len(records) - len(done),
        "errors": sorted({r.error for r in records if r.error})[:5],
        "duration_s": duration,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "streamed_chunks": chunks,
        "request_throughput": len(done) / duration,
        "output_throughput": output / duration,
        "total_token_throughput": (prompt + output) / duration,
        "ttft_ms": distribution_ms([r.ttft for r in done if r.ttft is not None]),
        "tpot_ms": distribution_ms([t for r in done if (t := r.tpot) is not None]),
        "itl_ms": distribution_ms([gap for r in done for gap in r.itls]),
        "e2el_ms": distribution_ms([r.e2el for r in done]),
        "good_requests": sum(meets_slo(r, slo_ms) for r in done),
        "goodput": sum(meets_slo(r, slo_ms) for r in done) / duration,
    }
